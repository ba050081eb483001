"""The build pipeline on real NVRTC compiles: failures, the compile cache, the lock file,
strictness, template errors, and the generated package's selection and integrity checks."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import sys

import pytest
from conftest import SCALE_TEMPLATE, build, load_project, write_lock, write_tiny_project
from cuda_standin import cubin_sm

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import CacheEntry
from hatch_autotune.compile.render import TemplateError
from hatch_autotune.errors import BuildError
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.runtime import IntegrityError, Library
from hatch_autotune.wheel.payload import write_package


def failing_default(root):
    """Make the tiny project's default one of its variants that do not compile (BAD = true)."""
    text = (root / "pyproject.toml").read_text().replace("BAD = false }", "BAD = true }")
    (root / "pyproject.toml").write_text(text)
    return root


MAY_FAIL = "default-may-fail = true"
FALLBACK = "no lock entry; the default config does not compile, so the first config that does (default-may-fail = true)"


def test_a_default_that_fails_to_compile_stops_the_build_naming_it(tmp_path):
    root = failing_default(write_tiny_project(tmp_path / "p", bad="[false, true]"))
    logs: list[str] = []
    with pytest.raises(BuildError) as info:
        build(root, tmp_path / "cache", logs)
    first, *rest = str(info.value).splitlines()
    assert first == (
        "hatch-autotune: the default config of kernel 'scale' (no type parameters or constants) does not compile for sm_80: "
        "scale[BLOCK=128, FACTOR=2, BAD=true]; NVRTC said:"
    )
    assert any("this_is_not_cuda" in line and line.startswith("  ") for line in rest)  # the compiler's log, indented
    assert "The default config does not compile either for: scale (no type parameters or constants) on sm_90." in rest
    assert "set `default-may-fail = true` in the hook table" in rest[-1]
    assert rest[-1].startswith("`hatch-autotune render scale --config BLOCK=128,FACTOR=2,BAD=true` prints its source"), rest[-1]
    # it stopped after the shipped set (the default on 2 archs): nothing else was compiled
    assert logs[-1] == "hatch-autotune: the lock's winners and the default configs: 0 variant binaries compiled, 0 from the cache, 2 failed"


def test_default_may_fail_falls_back_to_the_first_config_that_compiles(tmp_path):
    root = failing_default(write_tiny_project(tmp_path / "p", bad="[false, true]", extra=MAY_FAIL))
    logs: list[str] = []
    result = build(root, tmp_path / "cache", logs)
    kb = result.kernels[0]
    failed = [r for r in kb.binaries.values() if not r.ok]
    bad = sorted({r.job.label for r in failed if "BAD=true" in r.job.label})
    assert len(bad) == 6 and {r.job.label for r in failed} == set(bad)  # 3 BLOCK x 2 FACTOR,
    assert {(r.job.label, r.job.arch) for r in failed} == {(b, a) for b in bad for a in ("sm_80", "sm_90")}  # each failing on both archs
    assert all("this_is_not_cuda" in r.log for r in failed)
    warning = next(
        m for m in logs if m.startswith("warning: scale: 12 variant binaries failed to compile (on sm_80, sm_90) and are not in the wheel")
    )
    assert "this_is_not_cuda" in warning
    assert "hatch-autotune: the lock's winners and the default configs: 0 variant binaries compiled, 0 from the cache, 2 failed" in logs
    assert "hatch-autotune: compiling 22 variant binaries with NVRTC (0 found in the cache)" in logs
    assert "hatch-autotune: compiling: 4/22 done" in logs  # long compiles show progress
    variants = kb.variants["-"]
    chosen = {variants[c.variant_index].config_dict["BAD"] for c in kb.choices.values()}
    assert chosen == {False}
    assert {(c.status, c.reason) for c in kb.choices.values()} == {("fallback", FALLBACK)}
    # every variant on 2 archs, + 1 PTX; failures are not "compiled", and the counts add up
    assert result.counts == {"compiled": 12 + 1, "cached": 0, "failed": 12}
    assert logs[-2:] == [
        "hatch-autotune: in all, 13 variant binaries compiled, 0 from the cache, 12 failed; 3 shipped in the wheel",
        "hatch-autotune: 6 entries: 0 tuned, 0 on the default config, 6 on a fallback (an arch-specific target's plain arch's winner, or the default config does not compile or may not run at that bucket and arch); "
        "12 variant binaries failed to compile",
    ]
    outcome = result.outcome
    assert [(e.status, e.reason) for e in outcome.entries] == [("fallback", FALLBACK)] * 6
    assert {f.variant for f in outcome.failures} == set(bad) and len(outcome.failures) == 12
    assert all("this_is_not_cuda" in f.log for f in outcome.failures[:5]) and outcome.default_may_fail

    # From the cache: the same counts in other columns, and no progress lines (nothing compiles).
    logs = []
    again = build(root, tmp_path / "cache", logs)
    assert again.counts == {"compiled": 0, "cached": 13, "failed": 12} and again.outcome == outcome
    assert not any("compiling" in m for m in logs), logs


def test_an_offline_build_compiles_only_what_it_ships(tmp_path):
    root = write_tiny_project(tmp_path / "p", bad="[false, true]")
    first = build(root, tmp_path / "cache")
    assert first.counts["compiled"] == 2 + 1  # the default on 2 archs + its PTX: not the 24 variants of the space
    winner = {"BLOCK": 256, "FACTOR": 3, "BAD": False}
    write_lock(root, first, winner)
    logs: list[str] = []
    tuned = build(root, tmp_path / "fresh-cache", logs)
    assert "hatch-autotune: the lock's winners and the default configs: 4 variant binaries compiled, 0 from the cache, 0 failed" in logs
    assert tuned.counts["compiled"] == 4 + 2  # winner and default on 2 archs + the PTX of both (the default ships for a pin)
    assert all(c.tuned for c in tuned.kernels[0].choices.values())
    # A winner that no longer compiles falls back to the default, and nothing more is compiled.
    write_lock(root, first, {"BLOCK": 256, "FACTOR": 3, "BAD": True})
    logs = []
    fallback = build(root, tmp_path / "fresh-cache", logs)
    kb = fallback.kernels[0]
    assert {r.job.label for r in kb.binaries.values() if not r.ok} == {"scale[BLOCK=256, FACTOR=3, BAD=true]"}
    assert {(c.status, c.variant_index, c.reason) for c in kb.choices.values()} == {
        (
            "default",
            kb.variants["-"].index(next(v for v in kb.variants["-"] if v.config_dict == {"BLOCK": 128, "FACTOR": 2, "BAD": False})),
            "the lock's winner scale[BLOCK=256, FACTOR=3, BAD=true] failed to compile",
        )
    }
    assert not any("the rest of" in m for m in logs)
    # the default's cubins and PTX come from the cache (the build before shipped them beside the winner), the winner failed on 2 archs
    assert fallback.counts == {"compiled": 0, "cached": 3, "failed": 2}


def test_an_offline_build_gives_the_same_table_as_compiling_the_whole_space(tmp_path):
    """What ships does not depend on what else was compiled: the plan's choice equals the old
    rule (compile all, then lock winner, else default, else first that compiled)."""
    from hatch_autotune.plan.planner import make_plan
    from hatch_autotune.wheel.table import build_table

    root = write_tiny_project(tmp_path / "p", bad="[false, true]")
    first = build(root, tmp_path / "cache")
    lock = write_lock(root, first, {"BLOCK": 64, "FACTOR": 3, "BAD": False})
    stale = sorted(lock.entries)[0]
    lock.entries[stale] = LockEntry.from_json({**lock.entries[stale].to_json(), "config": {"BLOCK": 256, "FACTOR": 2, "BAD": True}})
    lock.save(root / "autotune.lock.json")
    project = load_project(root)
    result = build(root, tmp_path / "cache")
    plan = make_plan(project, project.archs, log=lambda m: None)
    usable_all = {i: not v.config_dict["BAD"] for i, v in enumerate(plan.instances[0].variants)}
    for arch in project.archs:
        for p in plan.instances[0].points[arch]:
            assert result.kernels[0].choices[("-", arch, p.key)] == plan.choose(plan.instances[0], p, usable_all)
    _table, files = build_table(project, result)
    # each arch: the winner and the default (beside a tuned winner, for a run-time pin; on sm_80 also the
    # point whose winner fails); the PTX of both
    assert len(files) == 2 + 2 + 2


def test_all_variants_failing_stops_the_build_with_the_log(tmp_path):
    root = write_tiny_project(tmp_path / "p", bad="[true]", extra=MAY_FAIL)
    text = (root / "pyproject.toml").read_text().replace("BAD = false }", "BAD = true }")
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(BuildError) as info:
        build(root, tmp_path / "cache")
    msg = str(info.value)
    assert "every variant of kernel 'scale' (no type parameters or constants) failed to compile for sm_80" in msg
    assert "this_is_not_cuda" in msg  # the compiler's log, not just a status


def test_second_build_compiles_nothing(tiny, tmp_path):
    logs: list[str] = []
    first = build(tiny, tmp_path / "cache", logs)
    assert first.counts["compiled"] == 2 + 1 and first.counts["cached"] == 0  # the default's cubins + its PTX
    second = build(tiny, tmp_path / "cache", logs)
    assert second.counts["compiled"] == 0 and second.counts["cached"] == first.counts["compiled"]
    assert any("0 variant binaries compiled" in m and "from the cache" in m for m in logs)


def test_corrupt_cache_entries_are_misses(tiny, tmp_path):
    cache_dir = tmp_path / "cache"
    build(tiny, cache_dir)
    bins = sorted(cache_dir.rglob("*.bin"))
    metas = sorted(cache_dir.rglob("*.json"))
    bins[0].write_bytes(b"garbage")  # content no longer matches its sha256
    metas[-1].write_text("{ not json")  # truncated metadata
    result = build(tiny, cache_dir)
    assert result.counts["compiled"] == (2 if metas[-1].with_suffix(".bin") != bins[0] else 1)
    assert result.counts["compiled"] + result.counts["cached"] == 3
    # and the rebuilt entries are good again
    assert build(tiny, cache_dir).counts["compiled"] == 0


def test_cache_get_rejects_foreign_and_mismatched_entries(tmp_path):
    cache = CompileCache(tmp_path)
    entry = CacheEntry(ok=True, log="", label="", resources=None, binary=b"\x7fELF-binary")
    cache.put("ab" * 32, entry)
    assert cache.get("ab" * 32) == entry
    meta_path = next(tmp_path.rglob("*.json"))
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "schema": 999}))
    assert cache.get("ab" * 32) is None
    meta_path.write_text(json.dumps({**meta, "key": "cd" * 32}))
    assert cache.get("ab" * 32) is None
    assert cache.get("ef" * 32) is None
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temp files


def test_lock_winners_are_used_and_stale_entries_ignored(tiny, tmp_path):
    cache_dir = tmp_path / "cache"
    first = build(tiny, cache_dir)
    assert not any(c.tuned for c in first.kernels[0].choices.values())
    winner = {"BLOCK": 256, "FACTOR": 3, "BAD": False}
    write_lock(tiny, first, winner)
    tuned = build(tiny, cache_dir)
    kb = tuned.kernels[0]
    assert all(c.tuned for c in kb.choices.values())
    assert {kb.variants["-"][c.variant_index].config_dict == winner for c in kb.choices.values()} == {True}
    assert all(c.median_ms == 0.01 and c.provenance["gpu"] == "recorded-for-test" for c in kb.choices.values())
    assert oct((tiny / "autotune.lock.json").stat().st_mode & 0o777) == "0o644"

    # Changing the template changes every variant's source: all entries become stale.
    (tiny / "scale.cu.j2").write_text(SCALE_TEMPLATE + "// changed\n")
    logs: list[str] = []
    stale_result = build(tiny, cache_dir, logs)
    assert not any(c.tuned for c in stale_result.kernels[0].choices.values())
    stale = [m for m in logs if "stale lock entry (checksum mismatch)" in m]
    assert stale == [  # grouped: a count and a few examples; the outcome record lists them all
        "warning: scale: 6 untuned entries use the default config (stale lock entry (checksum mismatch)): "
        "scale|-|sm_80|n=1024, scale|-|sm_80|n=65536, scale|-|sm_80|n=1048576 and 3 more"
    ]
    assert [e.eid for e in stale_result.outcome.entries if e.reason == "stale lock entry (checksum mismatch)"] == [
        f"scale|-|{arch}|n={n}" for arch in ("sm_80", "sm_90") for n in (1024, 65536, 1048576)
    ]


def test_one_stale_entry_among_valid_ones(tiny, tmp_path):
    first = build(tiny, tmp_path / "cache")
    lock = write_lock(tiny, first, {"BLOCK": 64, "FACTOR": 2, "BAD": False})
    eid = sorted(lock.entries)[0]
    lock.entries[eid] = dataclasses.replace(lock.entries[eid], checksum="0" * 64)
    lock.save(tiny / "autotune.lock.json")
    result = build(tiny, tmp_path / "cache")
    tuned = {result.kernels[0].lock_ids[k][0]: c.tuned for k, c in result.kernels[0].choices.items()}
    assert tuned.pop(eid) is False and all(tuned.values())


def test_corrupt_or_foreign_lock_is_a_warning_not_a_crash(tiny, tmp_path):
    for content in ("{ truncated", '{"schema": 0, "entries": {}}', '{"entries": {}}', "[1, 2]"):
        (tiny / "autotune.lock.json").write_text(content)
        logs: list[str] = []
        result = build(tiny, tmp_path / "cache", logs)
        assert any(m.startswith(f"warning: {tiny / 'autotune.lock.json'}") for m in logs), logs[:3]
        assert not any(c.tuned for c in result.kernels[0].choices.values())


def test_a_lock_file_of_a_newer_schema_is_refused_and_left_alone(tiny, tmp_path):
    newer = '{"schema": 2, "entries": {}}'
    (tiny / "autotune.lock.json").write_text(newer)
    with pytest.raises(
        BuildError, match=r"lock file schema 2 is newer than this hatch-autotune .* reads \(schema 1\); upgrade hatch-autotune"
    ):
        build(tiny, tmp_path / "cache")
    assert (tiny / "autotune.lock.json").read_text() == newer  # never overwritten by an older writer


def test_strict_turns_untuned_entries_into_an_error(tmp_path):
    root = write_tiny_project(tmp_path / "p", extra="strict = true")
    with pytest.raises(BuildError) as info:
        build(root, tmp_path / "cache")
    msg = str(info.value)
    assert "strict = true and 6 entr" in msg and "scale|-|sm_80|n=1024 (no lock entry)" in msg


def test_template_error_names_file_and_line(tmp_path):
    broken = SCALE_TEMPLATE.replace("{{ FACTOR }}", "{{ FACTR }}")
    root = write_tiny_project(tmp_path / "p", template=broken)
    with pytest.raises(TemplateError) as info:
        build(root, tmp_path / "cache")
    assert f"{root / 'scale.cu.j2'}:7:" in str(info.value) and "FACTR" in str(info.value)
    root2 = write_tiny_project(tmp_path / "q", template=SCALE_TEMPLATE.replace("{% endif %}", ""))
    with pytest.raises(TemplateError) as info:
        build(root2, tmp_path / "cache")
    assert "scale.cu.j2:" in str(info.value) and "endif" in str(info.value)


def test_identical_sources_compile_once(tmp_path):
    # FACTOR is not used by this template, so both FACTOR values render the same source; the
    # default does not compile, so the build compiles the whole space: 12 configs per arch.
    root = write_tiny_project(tmp_path / "p", bad="[false, true]", extra=MAY_FAIL, template=SCALE_TEMPLATE.replace("{{ FACTOR }}", "2"))
    result = build(failing_default(root), tmp_path / "cache")
    # 6 distinct sources (3 BLOCK x 2 BAD) x 2 archs, + 1 PTX: the 3 BAD=true ones fail on each arch
    assert result.counts == {"compiled": 3 * 2 + 1, "cached": 0, "failed": 3 * 2}
    # the outcome record counts failures as the build does: one per binary, shared by 2 FACTORs each
    assert [(f.arch, f.configs) for f in result.outcome.failures] == [("sm_80", 2)] * 3 + [("sm_90", 2)] * 3


def test_no_gpu_and_no_archs_is_a_clear_error(tiny, tmp_path):
    text = (tiny / "pyproject.toml").read_text().replace('archs = ["sm_80", "sm_90"]\n', "")
    (tiny / "pyproject.toml").write_text(text)
    with pytest.raises(BuildError, match="no GPU found on this machine and no `archs` declared"):
        build(tiny, tmp_path / "cache")


@pytest.fixture
def generated(tiny, tmp_path):
    """The tiny project's generated package, written and importable from tmp_path/site."""
    project = load_project(tiny)
    result = build(tiny, tmp_path / "cache")
    out = tmp_path / "site" / "tinypkg" / "kernels"
    (out.parent).mkdir(parents=True)
    (out.parent / "__init__.py").write_text("")
    write_package(out, project, result)
    sys.path.insert(0, str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("tinypkg")]:
        del sys.modules[name]
    yield out
    sys.path.remove(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("tinypkg")]:
        del sys.modules[name]


def test_generated_package_selects_and_checks_binaries(generated):
    mod = importlib.import_module("tinypkg.kernels")
    assert mod.__all__ == ["scale", "provenance"]
    sel = mod.scale.select(arch="sm_90", n=5000)
    assert sel.bucket == {"n": 1024} and sel.config == {"BAD": False, "BLOCK": 128, "FACTOR": 2} and not sel.tuned
    assert mod.scale.select(arch="sm_90", n=40000).bucket == {"n": 65536}
    assert mod.scale.select(arch="sm_80", n=10**9).bucket == {"n": 1048576}
    assert mod.scale.select(arch="sm_89", n=1).arch == "sm_80"
    ptx = mod.scale.select(arch=(10, 0), n=1)
    assert (ptx.arch, ptx.binary) == ("sm_90", "compute_90")
    assert mod.scale.binary(ptx).startswith(b"//")
    assert cubin_sm(mod.scale.binary(mod.scale.select(arch="sm_80", n=1))) == 80
    with pytest.raises(RuntimeError, match=r"compute capability 7.5"):
        mod.scale.select(arch="sm_75", n=1)
    with pytest.raises(TypeError, match="missing key dim"):
        mod.scale.select(arch="sm_90")
    with pytest.raises(TypeError, match="unknown key"):
        mod.scale.select(arch="sm_90", n=1, m=2)
    with pytest.raises(TypeError, match="must be an int"):
        mod.scale.select(arch="sm_90", n=1.5)


def test_tampered_binary_and_table_are_integrity_errors(generated):
    mod = importlib.import_module("tinypkg.kernels")
    sel = mod.scale.select(arch="sm_90", n=1)
    path = generated / mod.scale.variants[sel.variant].binaries["sm_90"].file
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    vendored = mod._runtime  # the wheel's own copy of the runtime, not hatch_autotune.runtime
    with pytest.raises(vendored.IntegrityError, match="does not match its sha256"):
        mod.scale.binary(sel)
    table = generated / "table.json"
    table.write_text(table.read_text().replace('"tuned": false', '"tuned": true', 1))
    expected = mod._TABLE_SHA256
    with pytest.raises(vendored.IntegrityError, match="does not match the sha256 recorded"):
        vendored.Library.load(str(generated), table_sha256=expected)
    with pytest.raises(IntegrityError, match="not valid JSON"):
        table.write_text("{")
        Library.load(str(generated))


def test_resource_usage_is_recorded_from_ptxas(tmp_path):
    from hatch_autotune.compile.nvrtc import CompileJob, compile_all

    src = """
    extern "C" __global__ void k(float* y) {
        __shared__ float tile[{{N}}];
        tile[threadIdx.x] = y[threadIdx.x];
        __syncthreads();
        y[threadIdx.x] = tile[({{N}} - 1) - threadIdx.x];
    }""".replace("{{N}}", "300")
    cache = CompileCache(tmp_path)
    (res,) = compile_all([CompileJob(src, "sm_90", "k")], cache)
    assert res.ok and not res.cached
    assert res.resources.shared_bytes == 1200 and res.resources.registers > 0
    assert res.resources.spill_stores == 0 and res.resources.barriers == 1
    (again,) = compile_all([CompileJob(src, "sm_90", "k")], cache)
    assert again.cached and again.resources == res.resources and again.binary == res.binary
    (ptx,) = compile_all([CompileJob(src, "compute_90", "k")], cache)
    assert ptx.ok and ptx.binary.startswith(b"//") and ptx.resources is None


def test_configs_sharing_a_source_keep_their_own_launch_config(tmp_path):
    # BLOCK only appears in the launch geometry: every BLOCK renders the same source.
    template = SCALE_TEMPLATE.replace("{{ BLOCK }}", "blockDim.x")
    root = write_tiny_project(tmp_path / "p", template=template)
    first = build(root, tmp_path / "cache")
    lock = LockFile()
    for (_tkey, _arch, point), (eid, checksum) in first.kernels[0].lock_ids.items():
        block = 64 if point == (1024,) else 256
        lock.entries[eid] = LockEntry(checksum, {"BLOCK": block, "FACTOR": 2, "BAD": False}, tuned=True)
    lock.save(root / "autotune.lock.json")
    result = build(root, tmp_path / "cache")
    out = tmp_path / "site" / "tinypkg" / "kernels"
    write_package(out, load_project(root), result)
    table = json.loads((out / "table.json").read_text())["kernels"]["scale"]
    assert len(table["variants"]) == 3  # two configs, and the default beside them (for a run-time pin) ...
    assert len({v["binaries"]["sm_90"]["file"] for v in table["variants"].values()}) == 1  # ... one binary
    lib = Library.load(str(out))
    assert lib.kernels["scale"].select(arch="sm_90", n=1000).config["BLOCK"] == 64
    assert lib.kernels["scale"].select(arch="sm_90", n=10**6).config["BLOCK"] == 256


def test_a_doc_with_quotes_and_backslashes_gives_an_importable_module(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    text = (
        (root / "pyproject.toml")
        .read_text()
        .replace('template = "scale.cu.j2"', 'template = "scale.cu.j2"\ndoc = \'y = """x""" \\\\N{oops} \\\\\'')
    )
    (root / "pyproject.toml").write_text(text)
    project = load_project(root)
    assert '"""' in project.kernels["scale"].doc
    out = tmp_path / "site" / "tinypkg" / "kernels"
    write_package(out, project, build(root, tmp_path / "cache"))
    source = (out / "__init__.py").read_text()
    compile(source, "__init__.py", "exec")  # a SyntaxError here would break every import
    assert 'y = """x""" \\\\N{oops}' in ast.literal_eval(source.splitlines()[0])


def test_any_error_while_rendering_names_the_template_line(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=SCALE_TEMPLATE.replace("{{ FACTOR }}", "{{ FACTOR // 0 }}"))
    with pytest.raises(TemplateError) as info:
        build(root, tmp_path / "cache")
    assert f"{root / 'scale.cu.j2'}:7: ZeroDivisionError" in str(info.value)
    assert isinstance(info.value, BuildError)  # reported by the hook as one clear message


def test_lock_with_malformed_measurements_is_ignored_not_a_crash(tiny, tmp_path):
    first = build(tiny, tmp_path / "cache")
    lock = write_lock(tiny, first, {"BLOCK": 64, "FACTOR": 2, "BAD": False})
    eid = sorted(lock.entries)[0]
    data = json.loads(lock.to_json())
    data["entries"][eid]["measurements"] = [1, "x"]
    (tiny / "autotune.lock.json").write_text(json.dumps(data))
    logs: list[str] = []
    result = build(tiny, tmp_path / "cache", logs)
    assert any(f"entry {eid!r} is malformed" in m for m in logs)
    assert sum(c.tuned for c in result.kernels[0].choices.values()) == 5


def test_the_first_failure_log_is_shown(tmp_path):
    root = failing_default(write_tiny_project(tmp_path / "p", bad="[false, true]", extra=MAY_FAIL))
    logs: list[str] = []
    build(root, tmp_path / "cache", logs)
    (warning,) = [m for m in logs if "variant binaries failed to compile" in m and m.startswith("warning:")]  # one per kernel
    head, *log = warning.splitlines()
    assert (
        head
        == "warning: scale: 12 variant binaries failed to compile (on sm_80, sm_90) and are not in the wheel; the first, scale[BLOCK=64, FACTOR=2, BAD=true] on sm_80:"
    )
    assert "this_is_not_cuda" in warning and "error" in log[0] and len(log) <= 4  # the first lines of its log


def test_an_unwritable_cache_is_a_warning_not_a_failed_build(tiny, tmp_path, monkeypatch):
    import hatch_autotune.compile.cache as cache_mod

    def refuse(path, data):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache_mod, "atomic_write", refuse)
    logs: list[str] = []
    result = build(tiny, tmp_path / "cache", logs)
    assert result.counts["compiled"] == 3 and result.counts["failed"] == 0
    assert sum("cannot write the compile cache" in m for m in logs) == 1


def test_jobs_from_the_environment(monkeypatch):
    import os

    from hatch_autotune.compile.nvrtc import default_workers
    from hatch_autotune.declare.settings import SettingsError

    monkeypatch.setenv("HATCH_AUTOTUNE_JOBS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("HATCH_AUTOTUNE_JOBS", " ")
    assert default_workers() == (os.cpu_count() or 1)
    for bad in ("0", "many"):
        monkeypatch.setenv("HATCH_AUTOTUNE_JOBS", bad)
        with pytest.raises(SettingsError, match=f"HATCH_AUTOTUNE_JOBS='{bad}': expected a whole number"):
            default_workers()
