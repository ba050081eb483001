"""The build's outcome record (wheel/outcome.py): what a plain `pip wheel .` hides (pip shows a
backend's output only with -v) is in the wheel, and `hatch-autotune show` prints it. A default
config that does not compile stops the build, the tuner too, unless `default-may-fail = true`.
Real NVRTC compiles, hatchling's own WheelBuilder, no GPU (the tuner talks to the fake worker)."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import SCALE_TEMPLATE, build, load_project, write_tiny_project
from hatchling.builders.wheel import WheelBuilder

from hatch_autotune import cli
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.errors import BuildError
from hatch_autotune.lock import EntryId
from hatch_autotune.text import LOG_LINES, log_excerpt
from hatch_autotune.tuning import TuningError, tune
from hatch_autotune.tuning.worker_client import WorkerClient
from hatch_autotune.wheel.outcome import LOGS_PER_GROUP, OUTCOME_FILE, CompileFailure, EntryOutcome, Outcome
from hatch_autotune.wheel.payload import write_package

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
# The default (BLOCK=256) does not compile; every other config does.
DEFAULT_BREAKS = SCALE_TEMPLATE.replace("{% if BAD %}", "{% if BLOCK == 256 %}")
LOCKLESS_FALLBACK = "no lock entry; the default config does not compile, so the first config that does (default-may-fail = true)"


def breaking_project(root: Path, *, may_fail: bool, mode: str = "offline") -> Path:
    """The tests' `scale` kernel on sm_90 with two buckets and three configs, whose default
    (BLOCK=256) renders `this_is_not_cuda(;`."""
    extra = f'mode = "{mode}"\n' + ("default-may-fail = true\n" if may_fail else "")
    write_tiny_project(root, extra=extra, template=DEFAULT_BREAKS)
    text = (root / "pyproject.toml").read_text()
    for old, new in [
        ('archs = ["sm_80", "sm_90"]', 'archs = ["sm_90"]'),
        ("buckets = [1024, 65536, 1048576]", "buckets = [1024, 65536]"),
        ("FACTOR = [2, 3]", "FACTOR = [2]"),
        ("default = { BLOCK = 128,", "default = { BLOCK = 256,"),
    ]:
        assert old in text
        text = text.replace(old, new)
    (root / "pyproject.toml").write_text(text)
    return root


@pytest.fixture(autouse=True)
def build_env(monkeypatch, session_cache):
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(session_cache))
    for var in ("HATCH_AUTOTUNE_MODE", "HATCH_AUTOTUNE_ARCHS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def wheel_of(root: Path, out: Path) -> Path:
    (artifact,) = WheelBuilder(str(root)).build(directory=str(out), versions=["standard"])
    return Path(artifact)


def show(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["show", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ---- the format -------------------------------------------------------------------------------


def sample() -> Outcome:
    entries = (
        EntryOutcome(EntryId.of("sgemm", "-", "sm_90", {"m": 256, "n": 256, "k": 256}), "tuned", {"BM": 64}),
        EntryOutcome(EntryId.of("sgemm", "-", "sm_90", {"m": 4096, "n": 256, "k": 256}), "default", {"BM": 128}, "no lock entry"),
    )
    failures = Outcome.failures_of([("sgemm", "-", "sm_90", "sgemm[BM=32]", {"BM": 32}, "src1", "sgemm.cu(3): error: x\n")])
    return Outcome(entries, failures, shipped=3)


def test_the_record_is_sorted_json_that_reads_back_equal():
    outcome = sample()
    data = outcome.to_bytes()
    assert data == sample().to_bytes() and data.endswith(b"\n")
    raw = json.loads(data)
    assert list(raw) == sorted(raw) and raw["schema"] == 1 and raw["shipped"] == 3
    assert [e["id"] for e in raw["entries"]] == ["sgemm|-|sm_90|m=256,n=256,k=256", "sgemm|-|sm_90|m=4096,n=256,k=256"]  # key order kept
    assert Outcome.read(data, "x") == outcome
    assert outcome.summary() == "2 entries: 1 tuned, 1 on the default config; 1 variant binary failed to compile"
    assert outcome.untuned() == {("sgemm", "default", "no lock entry"): ["sgemm|-|sm_90|m=4096,n=256,k=256"]}


def test_the_reader_is_lenient_and_says_what_it_skipped():
    assert Outcome.read(None, "w") is None  # a wheel of an older hatch-autotune: no record
    damaged = Outcome.read(b'{"schema": 1, "entr', "w!outcome.json")
    assert damaged.entries == () and damaged.notes[0].startswith("w!outcome.json: damaged outcome record, not read")
    newer = Outcome.read(b'{"schema": 99}', "w")
    assert newer.entries == () and "schema 99 is newer than this hatch-autotune reads (1); upgrade hatch-autotune" in newer.notes[0]
    assert "not a hatch-autotune outcome record" in Outcome.read(b'{"name": "left-pad"}', "w").notes[0]
    raw = json.loads(sample().to_bytes())
    raw["entries"] += [{"id": "not an id", "status": "tuned", "config": {}}, {"id": "k|-|sm_90|n=1", "status": "lucky", "config": {}}, 7]
    raw["failures"].append({"kernel": "sgemm"})
    partial = Outcome.read(json.dumps(raw), "w")
    assert partial.entries == sample().entries and partial.failures == sample().failures
    assert partial.notes == ("w: 4 malformed item(s) of the outcome record skipped",)


def test_failure_logs_are_bounded():
    log = "\n".join(f"k.cu({n}): error: {'x' * 50}" for n in range(100))
    assert log_excerpt(log).splitlines()[-1] == "[...]" and len(log_excerpt(log).splitlines()) == LOG_LINES + 1
    assert len(log_excerpt("y" * 100_000)) < 2000
    failures = Outcome.failures_of([("k", "T=float32", "sm_90", f"k[B={b}]", {"B": b}, f"src{b}", log) for b in range(8)])
    assert [bool(f.log) for f in failures] == [True] * LOGS_PER_GROUP + [False] * (8 - LOGS_PER_GROUP)
    assert failures[0].log.startswith("k.cu(0): error:") and isinstance(failures[0], CompileFailure)


def test_configs_of_one_source_are_one_failure_as_in_the_counts():
    failures = Outcome.failures_of(
        [
            ("k", "-", arch, f"k[B={b}, G={g}]", {"B": b, "G": g}, f"src{b}", "k.cu(1): error")
            for arch in ("sm_80", "sm_90")
            for b in (1, 2)
            for g in (1, 2, 3)
        ]
    )
    assert [(f.arch, f.variant, f.configs) for f in failures] == [
        ("sm_80", "k[B=1, G=1]", 3),
        ("sm_80", "k[B=2, G=1]", 3),
        ("sm_90", "k[B=1, G=1]", 3),
        ("sm_90", "k[B=2, G=1]", 3),
    ]
    assert Outcome.read(Outcome((), failures).to_bytes(), "x").failures == failures


# ---- builds -----------------------------------------------------------------------------------


def test_a_build_records_every_entry_and_the_record_is_the_same_from_a_warm_cache(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    cold = build(root, tmp_path / "cache")
    warm = build(root, tmp_path / "cache")
    assert cold.counts["compiled"] == 3 and warm.counts["cached"] == 3  # different builds ...
    assert cold.outcome.to_bytes() == warm.outcome.to_bytes()  # ... the same record: the wheel stays reproducible
    assert [(e.eid, e.status, e.reason) for e in cold.outcome.entries] == [
        (f"scale|-|{arch}|n={n}", "default", "no lock entry") for arch in ("sm_80", "sm_90") for n in (1024, 65536, 1048576)
    ]
    assert cold.outcome.failures == () and cold.outcome.shipped == 2 + 1  # the default's cubins and its PTX
    out = tmp_path / "site" / "tinypkg" / "kernels"
    write_package(out, load_project(root), cold)
    assert (out / OUTCOME_FILE).read_bytes() == cold.outcome.to_bytes()
    assert str(tmp_path) not in (out / OUTCOME_FILE).read_text()  # no absolute paths


def test_a_default_that_does_not_compile_stops_the_wheel_build(tmp_path):
    root = breaking_project(tmp_path / "p", may_fail=False)
    with pytest.raises(SystemExit) as info:
        wheel_of(root, tmp_path / "dist")
    message = str(info.value)
    assert message.startswith(
        "hatch-autotune: the default config of kernel 'scale' (no type parameters or constants) does not compile for sm_90: "
        "scale[BLOCK=256, FACTOR=2, BAD=false]; NVRTC said:\n  scale.cu(5): error:"
    ), message
    assert "this_is_not_cuda" in message and "`default-may-fail = true`" in message
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))


def test_default_may_fail_ships_a_fallback_that_the_wheel_records_and_show_prints(tmp_path, capsys):
    root = breaking_project(tmp_path / "p", may_fail=True)
    wheel = wheel_of(root, tmp_path / "dist")
    build_log = capsys.readouterr().err
    assert "warning: scale: 2 untuned entries use a fallback config" in build_log
    assert (
        build_log.rstrip()
        .splitlines()[-1]
        .startswith(f"hatch-autotune: the wheel records this build's outcome: `hatch-autotune show {wheel.name}`")
    )
    with zipfile.ZipFile(wheel) as zf:
        record = json.loads(zf.read(f"tinypkg/kernels/{OUTCOME_FILE}"))
    assert record["default_may_fail"] is True and record["shipped"] == 2  # BLOCK=64's cubin and its PTX
    assert [(e["id"], e["status"], e["config"], e["reason"]) for e in record["entries"]] == [
        (f"scale|-|sm_90|n={n}", "fallback", {"BAD": False, "BLOCK": 64, "FACTOR": 2}, LOCKLESS_FALLBACK) for n in (1024, 65536)
    ]
    ((failure),) = record["failures"]
    assert (failure["kernel"], failure["types"], failure["arch"], failure["variant"]) == (
        "scale",
        "-",
        "sm_90",
        "scale[BLOCK=256, FACTOR=2, BAD=false]",
    )
    assert "this_is_not_cuda" in failure["log"]

    code, out, err = show(capsys, wheel)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| sm_90")]
    assert len(rows) == 2 and all("| fallback |" in r and "BLOCK=64" in r for r in rows), out
    lines = out.splitlines()
    at = lines.index("untuned entries, by kernel and reason:")
    assert lines[at + 1] == f"  scale: 2 entries run a fallback config: {LOCKLESS_FALLBACK}"
    at = lines.index("compile failures: 1 variant binary did not compile (none of them ships):")
    assert lines[at + 1 : at + 3] == [
        "  scale (no type parameters or constants) on sm_90: 1 variant(s)",
        "    scale[BLOCK=256, FACTOR=2, BAD=false]",
    ]
    assert lines[at + 3].startswith("      scale.cu(5): error:") and any("this_is_not_cuda" in line for line in lines[at + 3 :])
    assert (
        f"{wheel}!tinypkg/kernels/table.json (wheel): 2 entries, 0 tuned, 0 default, 2 fallback (the default config does not compile); "
        "1 variant binary failed to compile; 2 binaries shipped"
    ) in lines


def test_show_of_a_wheel_without_a_record_says_so(tmp_path, capsys):
    wheel = wheel_of(write_tiny_project(tmp_path / "p", extra='mode = "offline"'), tmp_path / "dist")
    old = tmp_path / "old.whl"  # as an older hatch-autotune wrote it
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(OUTCOME_FILE):
                dst.writestr(item, src.read(item))
    capsys.readouterr()
    code, out, err = show(capsys, old)
    assert code == 0, err
    assert "6 entries, 0 tuned, 6 default\n" in out and "compile failures:" not in out
    assert "no outcome record (outcome.json) next to the table: built by an older hatch-autotune" in out
    code, out, err = show(capsys, wheel)
    assert code == 0 and "6 entries, 0 tuned, 6 default; 0 variant binaries failed to compile; 3 binaries shipped" in out
    assert "  scale: 6 entries run the default config: no lock entry" in out


def test_show_of_a_project_lists_its_compile_failures(tmp_path, capsys):
    root = breaking_project(tmp_path / "p", may_fail=True)
    code, out, err = show(capsys, root)
    assert code == 0, err
    assert "compile failures: 1 variant binary did not compile (none of them ships):" in out
    assert (
        f"{root} (project): 2 entries, 0 tuned, 0 default, 2 fallback (the default config does not compile); 1 variant binary failed to compile"
        in out
    )


# ---- the tuner --------------------------------------------------------------------------------


def test_the_tuner_stops_before_measuring_when_the_default_does_not_compile(tmp_path, monkeypatch):
    root = breaking_project(tmp_path / "p", may_fail=False, mode="tune")
    ops = tmp_path / "ops.txt"
    monkeypatch.setenv("FAKE_WORKER", json.dumps({"log": str(ops)}))
    with pytest.raises(TuningError) as info:
        tune(
            load_project(root),
            gpu_arch="sm_90",
            client_factory=lambda d: WorkerClient(FAKE),
            cache=CompileCache(tmp_path / "c"),
            log=lambda m: None,
        )
    assert "the default config of kernel 'scale' (no type parameters or constants) does not compile for sm_90" in str(info.value)
    assert "measure" not in ops.read_text() and not (root / "autotune.lock.json").exists()  # no GPU time spent, no lock written


def test_the_tuner_measures_the_others_with_default_may_fail(tmp_path):
    root = breaking_project(tmp_path / "p", may_fail=True, mode="tune")
    logs: list[str] = []
    summary = tune(
        load_project(root),
        gpu_arch="sm_90",
        client_factory=lambda d: WorkerClient(FAKE),
        cache=CompileCache(tmp_path / "c"),
        log=logs.append,
    )
    assert (
        "warning: the default config of scale (no type parameters or constants) does not compile for sm_90; measuring the others (default-may-fail = true)"
        in logs
    )
    assert len(summary.tuned) == 2
    for _, entry in summary.tuned:
        statuses = {m.config["BLOCK"]: m.status for m in entry.measurements}
        assert statuses[256] == "pruned" and entry.default_ms is None and entry.config["BLOCK"] != 256
    # and the build then ships the tuned winners: no entry needs the default
    result = build(root, tmp_path / "c")
    assert {c.status for c in result.kernels[0].choices.values()} == {"tuned"}
    assert [f.variant for f in result.outcome.failures] == ["scale[BLOCK=256, FACTOR=2, BAD=false]"]


def test_a_build_error_for_the_default_is_a_build_error(tmp_path):
    with pytest.raises(BuildError, match="does not compile for sm_90"):
        build(breaking_project(tmp_path / "p", may_fail=False), tmp_path / "c")
