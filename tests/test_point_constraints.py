"""Constraints that see the bucket and the arch (issue #52): a config that a point (arch, bucket)
cannot run is excluded there before anything is compiled, with the reason recorded; the build
falls back to the first config that may run where the default may not; a point no config may
serve is a project error. Also the per-arch limits: dynamic shared memory above the arch's
opt-in limit, and a cluster launch before sm_90."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import EXAMPLE, build, errors_for, hook_table, load_project, tune_over_fake_worker, write_tiny_project

from hatch_autotune.cli import main
from hatch_autotune.errors import BuildError
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.plan.exclusions import summary
from hatch_autotune.plan.limits import shared_optin_limit
from hatch_autotune.plan.planner import make_plan
from hatch_autotune.tuning import binaries as binaries_mod
from hatch_autotune.tuning.bucket import prune_reason
from hatch_autotune.tuning.protocol import Limits

POINT = 'constraints = ["n % BLOCK == 0", "arch >= 90 or FACTOR == 2"]'
ODD = "constraints[0] 'n % BLOCK == 0' at n=4032"
OLD_ARCH = "constraints[1] 'arch >= 90 or FACTOR == 2' on sm_80"


def quiet(_: str) -> None:
    pass


def project_with(tmp_path: Path, *, buckets: str = "[1024, 4032, 65536]", extra: str = POINT, space: str = "", name: str = "p") -> Path:
    """The tiny project (6 configs: BLOCK 64/128/256 x FACTOR 2/3) with other buckets and more keys
    on its kernel (`extra`), or another space."""
    root = write_tiny_project(tmp_path / name)
    text = (root / "pyproject.toml").read_text().replace("buckets = [1024, 65536, 1048576]", f"buckets = {buckets}")
    if space:
        text = text.replace("space = { BLOCK = [64, 128, 256], FACTOR = [2, 3], BAD = [false] }", space)
    (root / "pyproject.toml").write_text(text + extra + "\n")
    return root


def plan_of(root: Path, lock: LockFile | None = None):
    project = load_project(root)
    plan = make_plan(project, project.archs, log=quiet, compiler="13.0", lock=lock or LockFile())
    (inst,) = plan.instances
    return plan, inst, {(p.id.arch, p.key[0]): p for points in inst.points.values() for p in points}


def index_of(inst, **config) -> int:
    return inst.index_of({"BAD": False, **config})


def test_a_point_constraint_excludes_configs_per_bucket_and_arch(tmp_path):
    plan, inst, points = plan_of(project_with(tmp_path))
    assert len(inst.configs) == 6  # point constraints do not shrink the instance's space
    assert summary(inst.excluded(points["sm_90", 4032])) == {ODD: 4}
    assert summary(inst.excluded(points["sm_80", 4032])) == {ODD: 4, OLD_ARCH: 1}
    assert summary(inst.excluded(points["sm_80", 1024])) == {OLD_ARCH: 3}
    assert summary(inst.excluded(points["sm_90", 65536])) == {}
    assert inst.candidates(points["sm_90", 4032]) == [index_of(inst, BLOCK=64, FACTOR=2), index_of(inst, BLOCK=64, FACTOR=3)]
    why = inst.exclusion(points["sm_80", 4032], inst.default_index)
    assert why is not None and why.reason == f"fails {ODD}"
    # the untuned point runs the first config that may run there; elsewhere the default
    assert inst.point_default(points["sm_90", 4032]) == index_of(inst, BLOCK=64, FACTOR=2)
    assert inst.point_default(points["sm_80", 1024]) == inst.default_index
    # a config that may serve no point of an arch is never compiled for it
    factor3 = {i for i, c in enumerate(inst.configs) if c["FACTOR"] == 3}
    assert not plan.compilable(inst, "sm_80") & factor3 and not plan.shipped(inst, "sm_80") & factor3
    assert plan.shipped(inst, "sm_80") == {inst.default_index, index_of(inst, BLOCK=64, FACTOR=2)}
    everything = dict.fromkeys(range(6), True)
    choice = plan.choose(inst, points["sm_90", 4032], everything)
    assert choice.fallback and choice.variant_index == index_of(inst, BLOCK=64, FACTOR=2), choice
    assert f"the default config may not run here (it fails {ODD}), so the first config that may" in choice.reason
    assert plan.choose(inst, points["sm_90", 1024], everything).status == "default"


def test_a_lock_winner_that_may_not_run_at_its_point_is_not_shipped_there(tmp_path):
    root = project_with(tmp_path)
    _, _, points = plan_of(root)
    p = points["sm_80", 1024]
    lock = LockFile()
    lock.entries[p.eid] = LockEntry(p.checksum, {"BLOCK": 64, "FACTOR": 3, "BAD": False}, tuned=True)
    plan, inst, points = plan_of(root, lock)
    choice = plan.choose(inst, points["sm_80", 1024], dict.fromkeys(range(6), True))
    assert not choice.tuned and choice.variant_index == inst.default_index
    assert choice.reason == f"the lock's winner scale[BLOCK=64, FACTOR=3, BAD=false] may not run here: it fails {OLD_ARCH}", choice.reason
    assert index_of(inst, BLOCK=64, FACTOR=3) not in plan.shipped(inst, "sm_80")


def test_a_point_no_config_may_serve_is_a_project_error_naming_it(tmp_path):
    with pytest.raises(BuildError) as info:
        plan_of(project_with(tmp_path, buckets="[1000, 1024]"))
    message = str(info.value)
    assert message.startswith(
        "hatch-autotune: no config of kernel 'scale' may run at n=1000 on sm_80: constraints[0] 'n % BLOCK == 0' at n=1000: 6 configs. "
    ), message


def test_the_lock_checksums_of_kernels_without_point_constraints_stay_as_they_were():
    """example_pkg's committed lock: every entry of a kernel without point constraints still
    matches its point's checksum, and no config of those kernels is excluded anywhere (their
    shared memory fits every target arch). gemm's point constraints keep its wgmma family on
    sm_90a, at m >= 128, and its split-K configs on sm_90 and newer, at m <= 128; sgemm's keep its
    split-K configs on sm_90 and newer at k = 4096, and made its lock entries stale (its space grew)."""
    project = load_project(EXAMPLE)
    lock = LockFile.load(project.lock_file)
    plan = make_plan(project, project.archs, log=quiet, compiler="13.0", lock=lock)
    matched = 0
    for inst in plan.instances:
        if inst.spec.name == "gemm":
            assert inst.spec.point_constraints and not any(e.startswith("gemm|") for e in lock.entries)
            continue
        if inst.spec.name == "sgemm":
            assert inst.spec.point_constraints
            stale = [p for points in inst.points.values() for p in points if p.eid in lock.entries]
            assert len(stale) == 18 and all(lock.entries[p.eid].checksum != p.checksum for p in stale)
            continue
        assert not inst.spec.point_constraints
        for points in inst.points.values():
            for p in points:
                assert not inst.excluded(p), (p.eid, summary(inst.excluded(p)))
                if p.eid in lock.entries:
                    assert lock.entries[p.eid].checksum == p.checksum, p.eid
                    matched += 1
    assert matched == len(lock.entries) - 18 == 12


def test_checksums_change_with_a_point_constraint(tmp_path):
    _, _, plain = plan_of(project_with(tmp_path, extra="", name="plain"))
    _, _, constrained = plan_of(project_with(tmp_path, name="constrained"))
    assert all(plain[k].checksum != constrained[k].checksum for k in plain)


# ---- per-arch limits ---------------------------------------------------------------------------


def test_the_opt_in_shared_memory_limit_per_arch():
    assert [shared_optin_limit(a) for a in ("sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a")] == [
        65536,
        166912,
        101376,
        166912,
        101376,
        232448,
        232448,
    ]
    assert [shared_optin_limit(a) for a in ("sm_100a", "sm_100f", "sm_103", "sm_120", "sm_121")] == [232448] * 3 + [101376] * 2
    assert shared_optin_limit("sm_88") == 166912  # unknown: the newest known of its major not above it
    assert shared_optin_limit("sm_101") == 232448 and shared_optin_limit(122) == 101376


def test_shared_memory_above_the_arch_limit_is_excluded_with_the_bytes_and_the_limit(tmp_path):
    _, inst, points = plan_of(project_with(tmp_path, extra='shared = "BLOCK * 1024"'))
    big = index_of(inst, BLOCK=256, FACTOR=2)
    why = inst.exclusion(points["sm_80", 1024], big)
    assert why is not None and why.reason == "needs 262144 bytes of dynamic shared memory; sm_80 allows at most 166912 per block"
    assert summary(inst.excluded(points["sm_80", 1024])) == {
        "needs 262144 bytes of dynamic shared memory; sm_80 allows at most 166912 per block": 2
    }
    assert summary(inst.excluded(points["sm_90", 4032])) == {
        "needs 262144 bytes of dynamic shared memory; sm_90 allows at most 232448 per block": 2
    }
    # 128 KiB fits both: the tuner's old 48 KiB prune is gone from the build's view
    assert inst.exclusion(points["sm_80", 1024], inst.default_index) is None


def test_the_tuner_prunes_at_the_devices_opt_in_limit_not_at_48_kib():
    usage = SimpleNamespace(registers=32, shared_bytes=1024, spill_stores=0, spill_loads=0)
    limits = Limits(1024, 65536, 49152, 232448)

    def reason(dynamic: int) -> str | None:
        return prune_reason({}, usage, lambda c: 128, lambda c: dynamic, limits, prune_spills=False)

    assert reason(100 * 1024) is None  # above 48 KiB: the launch opts in
    assert reason(232448 - 1024) is None
    assert reason(232448) == "233472 bytes of shared memory (1024 static + 232448 dynamic) > 232448 per block"
    older = Limits(1024, 65536, 49152)  # a worker that does not report the opt-in limit
    assert prune_reason({}, usage, lambda c: 128, lambda c: 100 * 1024, older, False).endswith("> 49152 per block")


def test_a_range_of_shared_memory_is_said_once(tmp_path):
    space = "space = { BLOCK = [64, 128, 256, 512], FACTOR = [2, 3], BAD = [false] }"
    _, inst, points = plan_of(project_with(tmp_path, extra='shared = "BLOCK * 1024"', space=space))
    assert summary(inst.excluded(points["sm_80", 1024])) == {
        "needs 262144 to 524288 bytes of dynamic shared memory; sm_80 allows at most 166912 per block": 4
    }


def test_a_cluster_launch_is_excluded_before_sm_90(tmp_path):
    space = "space = { BLOCK = [64, 128], FACTOR = [2], BAD = [false], CX = [1, 2] }"
    root = project_with(tmp_path, buckets="[1024, 65536]", extra='cluster = ["CX"]', space=space)
    text = (
        (root / "pyproject.toml")
        .read_text()
        .replace("default = { BLOCK = 128, FACTOR = 2, BAD = false }", "default = { BLOCK = 128, FACTOR = 2, BAD = false, CX = 1 }")
    )
    (root / "pyproject.toml").write_text(text)
    _, inst, points = plan_of(root)
    assert summary(inst.excluded(points["sm_80", 1024])) == {"a thread-block cluster needs sm_90 or newer (sm_80 has none)": 2}
    assert summary(inst.excluded(points["sm_90", 1024])) == {}


# ---- the build and the tuner ---------------------------------------------------------------------


def test_an_offline_build_ships_the_fallback_where_the_default_may_not_run(tmp_path):
    root = project_with(tmp_path)
    logs: list[str] = []
    result = build(root, tmp_path / "cache", logs=logs)
    (kb,) = result.kernels
    choice = kb.choices[("-", "sm_90", (4032,))]
    assert choice.fallback and kb.variants["-"][choice.variant_index].config_dict == {"BLOCK": 64, "FACTOR": 2, "BAD": False}
    assert kb.choices[("-", "sm_90", (1024,))].status == "default"
    hashes = {v.source_hash: v.config_dict for v in kb.variants["-"]}
    compiled = {(hashes[h]["FACTOR"], arch) for h, arch in kb.binaries}
    assert (3, "sm_80") not in compiled and (3, "sm_90") not in compiled  # never a candidate for what ships untuned
    by_id = {e.eid: e for e in result.outcome.entries}
    assert by_id["scale|-|sm_80|n=4032"].status == "fallback" and ODD in by_id["scale|-|sm_80|n=4032"].reason


def test_a_default_that_may_run_nowhere_on_an_arch_is_never_compiled_for_it(tmp_path):
    root = project_with(tmp_path, extra='constraints = ["arch >= 90 or BLOCK == 64"]')
    result = build(root, tmp_path / "cache")
    (kb,) = result.kernels
    assert all(
        c.fallback and kb.variants["-"][c.variant_index].config_dict["BLOCK"] == 64 for (t, a, _), c in kb.choices.items() if a == "sm_80"
    )
    hashes = {v.source_hash: v.config_dict for v in kb.variants["-"]}
    assert all(hashes[h]["BLOCK"] == 64 for h, arch in kb.binaries if arch == "sm_80")


def test_tuning_measures_and_compiles_only_the_candidates_and_records_the_rest(tmp_path, monkeypatch):
    root = project_with(tmp_path, buckets="[4032]")
    asked: set[tuple[str, int]] = set()
    for name in ("request", "prefetch"):
        original = getattr(binaries_mod.VariantBinaries, name)

        def spy(self, indices, _original=original):
            asked.update((self.arch, i) for i in indices)
            return _original(self, indices)

        monkeypatch.setattr(binaries_mod.VariantBinaries, name, spy)
    summary_ = tune_over_fake_worker(root, tmp_path / "cache")
    ((eid, entry),) = summary_.tuned
    assert eid == "scale|-|sm_90|n=4032"
    assert sorted(m.config["BLOCK"] for m in entry.measurements) == [64, 64]
    assert entry.excluded == {ODD: 4}
    assert entry.default == {"BLOCK": 64, "FACTOR": 2, "BAD": False}  # what the point runs untuned
    plan = summary_.plan
    (inst,) = plan.instances
    assert {inst.configs[i]["BLOCK"] for _, i in asked} == {64}, asked  # the excluded configs were never compiled
    saved = json.loads((root / "autotune.lock.json").read_text())["entries"][eid]
    assert saved["excluded"] == {ODD: 4} and len(saved["measurements"]) == 2
    # the lock the run wrote is valid for the build that follows
    assert plan.lock.valid(eid, saved["checksum"], plan.policy) is not None


def test_show_says_per_entry_what_was_excluded_and_why(tmp_path, capsys):
    root = project_with(tmp_path, buckets="[1024, 4032]")
    assert main(["show", str(root)]) == 0
    out = capsys.readouterr().out
    assert "excluded" in out.splitlines()[1] or any(" excluded " in line for line in out.splitlines()), out
    assert f"scale on sm_80 at n=4032: {OLD_ARCH}: 1 config; {ODD}: 4 configs" in out, out  # in the order of their first config
    assert f"scale on sm_90 at n=4032: {ODD}: 4 configs" in out, out
    assert f"scale on sm_80 at n=1024: {OLD_ARCH}: 3 configs" in out, out
    assert "2 fallback (the default config may not run there)" in out, out


def test_show_of_a_lock_reads_the_recorded_exclusions(tmp_path, capsys):
    root = project_with(tmp_path, buckets="[4032]")
    tune_over_fake_worker(root, tmp_path / "cache")
    assert main(["show", str(root / "autotune.lock.json")]) == 0
    out = capsys.readouterr().out
    assert f"scale on sm_90 at n=4032: {ODD}: 4 configs" in out, out


def test_a_call_whose_own_sizes_break_its_buckets_config_runs_one_that_holds_or_is_refused(tmp_path):
    """A key constraint holds at the bucket's value; a call mapped to that bucket may have other
    sizes. The runtime checks it at the call's own: another shipped variant where one holds, else
    an error naming the constraint, never the bucket's config silently."""
    import importlib
    import sys

    from hatch_autotune.wheel.payload import write_package

    root = project_with(tmp_path)
    result = build(root, tmp_path / "cache")
    site = tmp_path / "site"
    (site / "tinypkg").mkdir(parents=True)
    (site / "tinypkg" / "__init__.py").write_text("")
    write_package(site / "tinypkg" / "kernels", load_project(root), result)
    sys.path.insert(0, str(site))
    try:
        scale = importlib.import_module("tinypkg.kernels").scale
        at_bucket = scale.select("sm_90", n=1024)
        assert at_bucket.config["BLOCK"] == 128 and at_bucket.bucket == {"n": 1024}
        moved = scale.select("sm_90", n=1088)  # bucket 1024; 1088 % 128 != 0, 1088 % 64 == 0
        assert moved.bucket == {"n": 1024} and moved.config["BLOCK"] == 64 and moved.tuned is False, moved
        with pytest.raises(ValueError, match=r"no variant the wheel ships for sm_90 satisfies the constraint 'n % BLOCK == 0' at n=1000"):
            scale.select("sm_90", n=1000)
        assert scale.declaration.key_constraints == (
            ["cmp", ["%", ["n", "n"], ["n", "BLOCK"]], ["==", 0]],
        )  # arch-only ones: decided at build
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.startswith("tinypkg")]:
            del sys.modules[name]


def test_a_constraint_tells_arch_specific_and_family_targets_from_plain_ones(tmp_path):
    """`arch` is 90 on sm_90 and sm_90a alike; `arch_specific` (an `a` target) and `arch_family`
    (`a` or `f`) tell them apart, as NVRTC's __CUDA_ARCH_SPECIFIC__ and
    __CUDA_ARCH_FAMILY_SPECIFIC__ do: a wgmma config belongs on sm_90a only."""
    from hatch_autotune.runtime.selection import arch_env

    assert arch_env("sm_90") == {"arch": 90, "arch_specific": 0, "arch_family": 0}
    assert arch_env("sm_90a") == {"arch": 90, "arch_specific": 1, "arch_family": 1}
    assert arch_env("sm_100f") == {"arch": 100, "arch_specific": 0, "arch_family": 1}
    extra = 'constraints = ["arch_specific or FACTOR == 2", "arch_family or BLOCK != 256"]'
    project = load_project(project_with(tmp_path, extra=extra), env={"HATCH_AUTOTUNE_ARCHS": "sm_90,sm_90a,sm_100f"})
    plan = make_plan(project, project.archs, log=quiet, compiler="13.0", lock=LockFile())
    (inst,) = plan.instances
    points = {(p.id.arch, p.key[0]): p for ps in inst.points.values() for p in ps}
    specific, family = "constraints[0] 'arch_specific or FACTOR == 2'", "constraints[1] 'arch_family or BLOCK != 256'"
    assert summary(inst.excluded(points["sm_90", 1024])) == {f"{specific} on sm_90": 3, f"{family} on sm_90": 1}
    assert summary(inst.excluded(points["sm_90a", 1024])) == {}
    assert summary(inst.excluded(points["sm_100f", 1024])) == {f"{specific} on sm_100f": 3}
    assert project.kernels["scale"].point_constraints == tuple(enumerate(project.kernels["scale"].constraints))


def test_the_arch_names_are_reserved_where_a_constraint_may_read_them(tmp_path):
    root = project_with(
        tmp_path,
        extra='constraints = ["arch >= 80"]',
        space="space = { BLOCK = [64, 128, 256], FACTOR = [2, 3], BAD = [false], arch_family = [0] }",
    )
    text = (
        (root / "pyproject.toml")
        .read_text()
        .replace(
            "default = { BLOCK = 128, FACTOR = 2, BAD = false }", "default = { BLOCK = 128, FACTOR = 2, BAD = false, arch_family = 0 }"
        )
    )
    (root / "pyproject.toml").write_text(text)
    errors = errors_for(root, hook_table(root))
    assert any("the target's 'arch_family' has the same name as axis arch_family; rename one" in e for e in errors), errors
