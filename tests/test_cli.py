"""The `hatch-autotune` command on real inputs: lock files written here, the tiny project built
with real NVRTC, a wheel built by pip from it (hatch-autotune itself built from this checkout),
that wheel installed, and the HTML report rendered by headless Chromium.

The timings in the lock files below are TEST FIXTURES, made up by `fixture_measurements`: they
are not measurements of anything, and their provenance says so.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, build, write_tiny_project

from hatch_autotune import cli
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import CacheEntry
from hatch_autotune.inspection.fmt import fmt_bytes, fmt_ms
from hatch_autotune.lock import LOCK_SCHEMA, EntryId, LockEntry, LockFile

CHROMIUM = Path("/usr/bin/chromium")
FIXTURE_GPU = "TEST FIXTURE GPU (made-up numbers, not measurements)"


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    """Tests read plain text: no forced colours or terminal from the CI environment."""
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "HATCH_AUTOTUNE_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hatch-autotune: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


# --------------------------------------------------------------------------------------------
# Test data: a lock file for the tiny project, with made-up timings.


def fixture_measurements(configs: list[dict], arch: str, n: int) -> list[dict]:
    """TEST FIXTURE numbers: a plausible shape (bigger blocks faster, sm_90 faster than sm_80,
    time grows with n), FACTOR=3 'rejected' (it computes something else), BLOCK=64 'failed' on
    the largest bucket. Not measured on any GPU."""
    out = []
    speed = {64: 1.3, 128: 1.0, 256: 0.8}
    for i, c in enumerate(configs):
        m = {"index": i, "config": c, "samples": 0}
        if c["FACTOR"] == 3:
            m.update(status="rejected", reason="wrong result: max abs error 1.0 (test fixture)")
        elif c["BLOCK"] == 64 and n == 1048576:
            m.update(status="failed", reason="launch failed (test fixture)")
        else:
            median = round((0.002 + n / 2e8) * speed[c["BLOCK"]] * (0.7 if arch == "sm_90" else 1.0), 6)
            m.update(status="ok", median_ms=median, spread_ms=round(median * 0.01, 6), samples=25)
        out.append(m)
    return out


def fixture_lock_entries(result) -> dict[str, dict]:
    """A lock entry per (arch, bucket) of the tiny project, with the build's real checksums."""
    kb = result.kernels[0]
    configs = [v.config_dict for v in kb.variants["-"]]
    default = dict(kb.spec.default)
    entries = {}
    for (_tkey, arch, point), (eid, checksum) in sorted(kb.lock_ids.items()):
        ms = fixture_measurements(configs, arch, point[0])
        ok = [m for m in ms if m["status"] == "ok"]
        win = min(ok, key=lambda m: m["median_ms"])
        default_ms = next(m["median_ms"] for m in ok if m["config"] == default)
        entries[eid] = {
            "checksum": checksum,
            "config": win["config"],
            "index": win["index"],
            "tuned": True,
            "default_ms": default_ms,
            "measurements": ms,
            "provenance": {
                "gpu": FIXTURE_GPU,
                "cc": "9.0" if arch == "sm_90" else "8.0",
                "driver": "0.0-test-fixture",
                "nvrtc": result.compiler,
                "cuda_bindings": "test-fixture",
                "hatch_autotune": "0.1.0",
                "date": "2025-01-01T00:00:00+00:00",
            },
        }
    return entries


def write_lock(path: Path, entries: dict, schema: int = LOCK_SCHEMA) -> Path:
    path.write_text(json.dumps({"schema": schema, "entries": entries}, sort_keys=True, indent=1) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny_lock(tmp_path_factory, session_cache):
    """The tiny project (with its fixture lock file next to it) and the lock's entries."""
    root = write_tiny_project(tmp_path_factory.mktemp("tiny") / "tiny")
    result = build(root, session_cache)
    entries = fixture_lock_entries(result)
    write_lock(root / "autotune.lock.json", entries)
    return root, entries


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def tiny_wheel(tiny_lock, plugin_dist, session_cache, tmp_path_factory) -> Path:
    """The tiny project's wheel, built by `pip wheel` (build isolation, hatch-autotune from a
    wheel of this checkout), with its fixture lock file: so its entries are tuned."""
    tmp = tmp_path_factory.mktemp("wheels")
    root, _ = tiny_lock
    links = " ".join(filter(None, [str(plugin_dist), os.environ.get("PIP_FIND_LINKS", "")]))
    # The build environment gets this NVRTC, so that the lock's checksums (made here) match there.
    pins = []
    for dist in ("cuda-toolkit", "nvidia-cuda-nvrtc"):
        try:
            pins.append(f"{dist}=={importlib.metadata.version(dist)}\n")
        except importlib.metadata.PackageNotFoundError:
            pass
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(pins))
    env = {**os.environ, "HATCH_AUTOTUNE_CACHE_DIR": str(session_cache), "PIP_FIND_LINKS": links, "PIP_CONSTRAINT": str(constraints)}
    env.pop("HATCH_AUTOTUNE_MODE", None)
    out = tmp / "out"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, root], env=env)
    (wheel,) = out.glob("tinypkg-*.whl")
    return wheel


def table_rows(out: str) -> list[list[str]]:
    """The body rows of the ASCII tables in `out`, as lists of cells."""
    return [
        [c.strip() for c in line.strip()[1:-1].split(" | ")]  # entry ids hold '|' too, not ' | '
        for line in out.splitlines()
        if line.startswith("|") and not line.startswith(("| arch", "| entry", "|-"))
    ]


# --------------------------------------------------------------------------------------------
# show


def test_show_lock_is_a_table_per_kernel(tiny_lock, capsys):
    root, entries = tiny_lock
    code, out, err = run_cli(capsys, "show", root / "autotune.lock.json")
    assert code == 0, err
    assert "scale" in out.splitlines()[0]
    header = next(line for line in out.splitlines() if line.startswith("| arch"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["arch", "bucket", "config", "time (ms)", "speedup", "status"]
    rows = table_rows(out)
    assert len(rows) == len(entries) == 6
    by = {(r[0], r[1]): r for r in rows}
    # fixture: BLOCK=256 wins everywhere; default BLOCK=128 -> 1/0.8 = 1.25x
    assert by[("sm_90", "n=65536")][2] == "BAD=false BLOCK=256 FACTOR=2"
    assert by[("sm_90", "n=65536")][4] == "1.25x" and by[("sm_90", "n=65536")][5] == "tuned"
    e = entries["scale|-|sm_80|n=1024"]
    assert by[("sm_80", "n=1024")][3] == fmt_ms(min(m["median_ms"] for m in e["measurements"] if "median_ms" in m))
    assert "6 entries, 6 tuned, 0 default" in out
    assert FIXTURE_GPU in out


def test_show_project_checks_lock_entries_like_the_build(tiny_lock, tmp_path, capsys):
    root, entries = tiny_lock
    code, out, err = run_cli(capsys, "show", root)
    assert code == 0, err
    assert "6 entries, 6 tuned, 0 default" in out
    # a stale entry and a missing one fall back to the default config, saying why
    project = tmp_path / "p"
    shutil.copytree(root, project)
    changed = copy.deepcopy(entries)
    changed["scale|-|sm_80|n=1024"]["checksum"] = "0" * 64
    del changed["scale|-|sm_90|n=1024"]
    changed["scale|-|sm_75|n=1024"] = entries["scale|-|sm_80|n=1024"]  # an arch the project no longer has
    write_lock(project / "autotune.lock.json", changed)
    code, out, err = run_cli(capsys, "show", project, "--kernel", "scale")
    assert code == 0, err
    by = {(r[0], r[1]): r for r in table_rows(out)}
    assert by[("sm_80", "n=1024")][2:] == ["BAD=false BLOCK=128 FACTOR=2", "-", "-", "default", "stale lock entry (checksum mismatch)"]
    assert by[("sm_90", "n=1024")][5:] == ["default", "no lock entry"]
    assert "4 tuned, 2 default" in out
    assert "1 lock entry matches nothing the project declares" in out


def test_show_wheel_built_by_pip(tiny_wheel, capsys):
    code, out, err = run_cli(capsys, "show", tiny_wheel)
    assert code == 0, err
    rows = table_rows(out)
    assert len(rows) == 6 and all(r[5] == "tuned" for r in rows), out  # the lock's winners made it in
    assert all(r[2] == "BAD=false BLOCK=256 FACTOR=2" for r in rows)
    assert (
        f"{tiny_wheel}!tinypkg/kernels/table.json (wheel): 6 entries, 6 tuned, 0 default; 0 variant binaries failed to compile; 6 binaries shipped"
        in out
    )  # the winner's sm_80 and sm_90 cubins and PTX, and the default's beside them (for a run-time pin)
    assert "a selection table has no measurements" in out
    assert "untuned entries" not in out and "compile failures:" not in out  # nothing to say: not said


def test_show_installed_package_without_importing_it(tiny_wheel, tmp_path):
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, tiny_wheel])
    script = (
        "import sys\nfrom hatch_autotune.cli import main\ncode = main(['show', 'tinypkg'])\n"
        "assert not any(m.startswith('tinypkg') for m in sys.modules), sorted(sys.modules)\nsys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "NO_COLOR": "1"}
    proc = run([sys.executable, "-c", script], env=env, cwd=tmp_path)
    assert "(package)" in proc.stdout and str(site / "tinypkg" / "kernels" / "table.json") in proc.stdout
    assert len(table_rows(proc.stdout)) == 6
    # and as the console script's module form, for a name that is not installed
    proc = subprocess.run(
        [sys.executable, "-m", "hatch_autotune", "show", "no_such_pkg"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert_one_line_error(proc.returncode, proc.stderr, "no_such_pkg: no such file, directory or installed package")


def test_show_installed_package_by_its_distribution_name(tmp_path, monkeypatch, capsys, session_cache):
    """`show stencil-kit` (the name pip knows) finds the import package `stencil_kit` that holds
    the generated module, in any spelling PEP 503 normalises alike."""
    from hatchling.builders.wheel import WheelBuilder

    root = write_tiny_project(tmp_path / "p", extra='mode = "offline"')
    text = (root / "pyproject.toml").read_text().replace('name = "tinypkg"', 'name = "Stencil-Kit"')
    (root / "pyproject.toml").write_text(text)
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)
    (wheel,) = WheelBuilder(str(root)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:  # what an installer writes for a pure wheel, RECORD included
        zf.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    capsys.readouterr()
    for name in ("stencil-kit", "Stencil_Kit", "STENCIL.KIT", "tinypkg"):
        code, out, err = run_cli(capsys, "show", name)
        assert code == 0, (name, err)
        # the package's outcome record read too
        assert (
            f"{site / 'tinypkg' / 'kernels' / 'table.json'} (package): 6 entries, 0 tuned, 6 default; 0 variant binaries failed to compile; 3 binaries shipped"
            in out
        ), name
    code, _, err = run_cli(capsys, "show", "stencil-kits")
    assert_one_line_error(code, err, "stencil-kits: no such file, directory or installed package")
    code, _, err = run_cli(capsys, "show", "Jinja2")  # a distribution, not an import name (jinja2)
    assert_one_line_error(code, err, "Jinja2: an installed distribution (Jinja2 ", "without a generated hatch-autotune package")


# --------------------------------------------------------------------------------------------
# Errors: one line, exit code 2, no traceback.


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d / "missing.lock.json", "no such file"),
        (lambda d: (d / "x.json").write_text('{"schema": 1, "entries": {') and d / "x.json", "corrupt lock file: not valid JSON"),
        (lambda d: (d / "x.json").write_bytes(b"\x80\x81garbage") and d / "x.json", "not JSON text"),
        (
            lambda d: (d / "package.json").write_text('{"name": "left-pad", "version": "1.3.0"}') and d / "package.json",
            "not a hatch-autotune lock file",
        ),
        (lambda d: (d / "x.json").write_text("[1, 2, 3]") and d / "x.json", "not a hatch-autotune lock file"),
        (
            lambda d: write_lock(d / "x.json", {}, schema=LOCK_SCHEMA + 1),
            f"lock file schema {LOCK_SCHEMA + 1} is newer than this hatch-autotune",
        ),
        (lambda d: write_lock(d / "x.json", {}, schema=0), "lock file schema 0 is not supported"),
        (
            lambda d: write_lock(d / "x.json", {"scale|-|sm_90|n=1024": {"config": {}}}),
            "entry 'scale|-|sm_90|n=1024' is malformed (no checksum)",
        ),
        (
            lambda d: write_lock(d / "x.json", {"scale-sm_90": {"checksum": "", "config": {}, "tuned": True}}),
            "entry id 'scale-sm_90' is not",
        ),
        (lambda d: (d / "x.whl").write_bytes(b"PK\x03\x04 truncated") and d / "x.whl", "not a wheel"),
        (lambda d: _zip(d / "x.whl", {"pkg/__init__.py": b""}), "no hatch-autotune selection table in this wheel"),
        (lambda d: _zip(d / "x.whl", {"p/k/table.json": b"{oops", "p/k/_runtime.py": b""}), "corrupt selection table"),
        (
            lambda d: _zip(d / "x.whl", {"p/k/table.json": b'{"schema": 7, "kernels": {}}', "p/k/_runtime.py": b""}),
            "selection table schema 7 is newer",
        ),
        (
            lambda d: _zip(d / "x.whl", {"p/k/table.json": b'{"schema": 1, "kernels": {"k": {"select": 3}}}', "p/k/_runtime.py": b""}),
            "malformed selection table",
        ),
        (lambda d: (d / "proj").mkdir() or d / "proj", "neither a project"),
        (lambda d: (d / "pyproject.toml").write_text("[project\n") and d, "not valid TOML"),
        (lambda d: (d / "pyproject.toml").write_text('[project]\nname = "x"\n') and d, "not a hatch-autotune project"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, needle):
    target = make(tmp_path)
    code, out, err = run_cli(capsys, "show", target)
    assert_one_line_error(code, err, needle)
    assert out == ""


def test_bad_input_errors_also_for_diff_merge_report(tmp_path, capsys, tiny_lock):
    root, _ = tiny_lock
    lock = root / "autotune.lock.json"
    newer = write_lock(tmp_path / "newer.json", {}, schema=LOCK_SCHEMA + 1)
    assert_one_line_error(*run_cli(capsys, "diff", lock, tmp_path / "nope.json")[::2], "no such file")
    assert_one_line_error(*run_cli(capsys, "merge", lock, newer, "-o", tmp_path / "o.json")[::2], "is newer than")
    assert not (tmp_path / "o.json").exists()
    assert_one_line_error(*run_cli(capsys, "report", newer, "-o", tmp_path / "r.html")[::2], "is newer than")
    assert_one_line_error(*run_cli(capsys, "report", lock)[::2], "nothing to write")
    bad_config = write_tiny_project(tmp_path / "bad", extra='mode = "sometimes"')
    assert_one_line_error(*run_cli(capsys, "show", bad_config)[::2], "configuration error(s)", "mode")
    code, _out, err = run_cli(capsys, "frobnicate")
    assert_one_line_error(code, err, "invalid choice")


def test_console_script_and_module_form(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hatch_autotune", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "hatch-autotune 0.1.0"
    (tmp_path / "bad.json").write_text("{")
    proc = subprocess.run(
        [sys.executable, "-m", "hatch_autotune", "diff", tmp_path / "bad.json", tmp_path / "bad.json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert_one_line_error(proc.returncode, proc.stderr, "bad.json: corrupt lock file")


# --------------------------------------------------------------------------------------------
# diff


@pytest.fixture
def two_locks(tiny_lock, tmp_path):
    """B against A: one winner changed and 20% slower, one entry 30% faster, one removed, one added."""
    _, entries = tiny_lock
    a = write_lock(tmp_path / "a.json", entries)
    b_entries = copy.deepcopy(entries)
    slow = b_entries["scale|-|sm_90|n=65536"]
    old_ms = next(m["median_ms"] for m in slow["measurements"] if m["config"] == slow["config"])
    slow["config"] = {"BLOCK": 128, "FACTOR": 2, "BAD": False}
    for m in slow["measurements"]:
        if m["config"] == slow["config"]:
            m["median_ms"] = round(old_ms * 1.2, 6)
    fast = b_entries["scale|-|sm_80|n=1024"]
    for m in fast["measurements"]:
        if m["config"] == fast["config"]:
            m["median_ms"] = round(m["median_ms"] * 0.7, 6)
    del b_entries["scale|-|sm_80|n=65536"]
    b_entries["scale|-|sm_90|n=4194304"] = copy.deepcopy(entries["scale|-|sm_90|n=1048576"])
    return a, write_lock(tmp_path / "b.json", b_entries)


def test_diff_lock_files_marks_regressions(two_locks, capsys):
    a, b = two_locks
    code, out, err = run_cli(capsys, "diff", a, b)
    assert code == 0, err
    rows = {r[0]: r for r in table_rows(out)}
    assert rows["scale|-|sm_90|n=65536"][1] == "changed: config, slower"
    assert rows["scale|-|sm_90|n=65536"][2:4] == ["BAD=false BLOCK=256 FACTOR=2", "BAD=false BLOCK=128 FACTOR=2"]
    assert rows["scale|-|sm_90|n=65536"][6:] == ["+20.0%", "REGRESSION"]
    assert rows["scale|-|sm_80|n=1024"][1] == "changed: faster" and rows["scale|-|sm_80|n=1024"][6:] == ["-30.0%", ""]
    assert rows["scale|-|sm_80|n=65536"][1] == "removed"
    assert rows["scale|-|sm_90|n=4194304"][1] == "added"
    assert "1 added, 1 removed, 2 changed, 3 unchanged; 1 regression(s) over 5%" in out
    assert run_cli(capsys, "diff", a, b, "--fail-on-regression")[0] == 1
    for threshold in ("0.25", "25%"):  # one unit: a fraction, or a percentage that says so
        code, out, _ = run_cli(capsys, "diff", a, b, "--fail-on-regression", "--threshold", threshold)
        assert code == 0 and "0 regression(s) over 25% (--threshold 0.25)" in out
    code, _, err = run_cli(capsys, "diff", a, b, "--threshold", "25")  # 2500% slower? surely 25%
    assert_one_line_error(code, err, "argument --threshold: 25 is read as a fraction, 2500% slower; for 25% write 0.25 or 25%")
    for bad in ("-0.1", "five", "nan"):
        code, _, err = run_cli(capsys, "diff", a, b, "--threshold", bad)
        assert_one_line_error(code, err, "expected a fraction such as 0.05 (or a percentage such as 5%)")
    code, out, _ = run_cli(capsys, "diff", a, a, "--fail-on-regression")
    assert code == 0 and "0 added, 0 removed, 0 changed, 6 unchanged" in out


def test_diff_names_what_changed_beyond_the_config():
    """The diff model (inspection.diff) on rows alone: checksum, tuning and provenance changes,
    and the threshold deciding faster, slower and regression."""
    from hatch_autotune.inspection.diff import diff_sources
    from hatch_autotune.inspection.model import Row, Source
    from hatch_autotune.lock import Bucket

    def row(n: int, ms: float | None, **kw) -> Row:
        fields = dict(config={"B": 1}, tuned=True, time_ms=ms, checksum="c", provenance={"gpu": "G1", "nvrtc": "13.0"})
        return Row("k", "-", "sm_90", Bucket.of({"n": n}), **{**fields, **kw})

    old = [row(1, 1.0), row(2, 1.0), row(3, 1.0), row(4, 1.0), row(5, 1.0)]
    new = [
        row(1, 1.04),  # within the threshold: unchanged
        row(2, 1.0, checksum="d"),
        row(3, 1.0, provenance={"gpu": "G2", "nvrtc": "13.1"}),
        row(4, 0.5, tuned=False),
        row(5, 1.5),
    ]
    src = lambda rows: Source("x", "lock", {r.eid: r for r in rows}, ["k"])  # noqa: E731
    diff = diff_sources(src(old), src(new), 0.05)
    assert diff.unchanged == 1 and diff.count("changed") == 3 and diff.count("code changed") == 1
    assert diff.count("added") == diff.count("removed") == 0
    what = {c.eid: c.what for c in diff.changes}
    assert what == {
        "k|-|sm_90|n=2": ["checksum (sources or settings changed)"],
        "k|-|sm_90|n=3": ["GPU G1 -> G2", "NVRTC 13.0 -> 13.1"],
        "k|-|sm_90|n=4": ["lost its tuning", "faster"],
        "k|-|sm_90|n=5": ["slower"],
    }
    assert [c.eid for c in diff.regressions] == ["k|-|sm_90|n=5"]
    assert diff_sources(src(old), src(new), 0.6).regressions == []


def test_diff_wheels(tiny_wheel, tmp_path, capsys):
    """The pip-built wheel against a copy whose table lost the tuning of one entry."""
    other = tmp_path / tiny_wheel.name
    with zipfile.ZipFile(tiny_wheel) as src, zipfile.ZipFile(other, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("kernels/table.json"):
                table = json.loads(data)
                kernel = table["kernels"]["scale"]
                default_vid = next(v for v, var in kernel["variants"].items() if var["config"]["BLOCK"] == 256)
                kernel["variants"]["0" * 16] = {**kernel["variants"][default_vid], "config": {"BLOCK": 128, "FACTOR": 2, "BAD": False}}
                row = kernel["select"]["-"]["sm_80"][0]
                row.update(variant="0" * 16, tuned=False, provenance={"reason": "no lock entry"})
                data = json.dumps(table).encode()
            dst.writestr(item, data)
    code, out, err = run_cli(capsys, "diff", tiny_wheel, other, "--fail-on-regression")
    assert code == 0, err  # no times in wheels: a change, not a measured regression
    rows = table_rows(out)
    assert len(rows) == 1 and rows[0][0] == "scale|-|sm_80|n=1024"
    assert rows[0][1] == "changed: config, lost its tuning"
    assert "0 added, 0 removed, 1 changed, 5 unchanged" in out


# --------------------------------------------------------------------------------------------
# merge


def test_merge_disjoint_and_equal_entries(tiny_lock, tmp_path, capsys):
    _, entries = tiny_lock
    ids = sorted(entries)
    sm80 = write_lock(tmp_path / "sm80.json", {k: v for k, v in entries.items() if "|sm_80|" in k})
    sm90 = write_lock(tmp_path / "sm90.json", {k: v for k, v in entries.items() if "|sm_90|" in k or k == ids[0]})
    out = tmp_path / "merged" / "autotune.lock.json"
    code, stdout, err = run_cli(capsys, "merge", sm80, sm90, "-o", out)
    assert code == 0, err
    assert f"{out}: 6 entries merged from 2 lock file(s)" in stdout
    assert out.read_bytes() == LockFile.parse({"schema": LOCK_SCHEMA, "entries": entries}, "fixture").to_json()  # LockFile's format
    loaded = LockFile.load(out)
    assert not loaded.warnings and set(loaded.entries) == set(ids)


def test_merge_conflicts_need_a_side(tiny_lock, tmp_path, capsys):
    _, entries = tiny_lock
    a = write_lock(tmp_path / "a.json", entries)
    b_entries = copy.deepcopy(entries)
    faster = b_entries["scale|-|sm_90|n=1024"]  # another config, and faster (fixture numbers)
    faster["config"] = {"BLOCK": 128, "FACTOR": 2, "BAD": False}
    for m in faster["measurements"]:
        if m["config"] == faster["config"]:
            m["median_ms"] = 0.0001
    b_entries["scale|-|sm_80|n=1024"]["checksum"] = "f" * 64  # tuned against other sources
    b = write_lock(tmp_path / "b.json", b_entries)
    out = tmp_path / "out.json"

    code, stdout, err = run_cli(capsys, "merge", a, b, "-o", out)
    assert_one_line_error(code, err, "2 conflicting entries", "--prefer")
    assert f"scale|-|sm_80|n=1024 (different checksums: {a} vs {b})" in err
    assert f"scale|-|sm_90|n=1024 (different configs: {a} vs {b})" in err
    assert not out.exists()

    assert run_cli(capsys, "merge", a, b, "-o", out, "--prefer", "first")[0] == 0
    assert json.loads(out.read_text())["entries"] == entries
    assert run_cli(capsys, "merge", a, b, "-o", out, "--prefer", "last")[0] == 0
    assert json.loads(out.read_text())["entries"] == b_entries
    code, stdout, _ = run_cli(capsys, "merge", a, b, "-o", out, "--prefer", "faster")
    assert code == 0 and "2 conflict(s) resolved by --prefer faster" in stdout
    merged = json.loads(out.read_text())["entries"]
    assert merged["scale|-|sm_90|n=1024"]["config"]["BLOCK"] == 128  # b's, faster
    assert merged["scale|-|sm_80|n=1024"] == entries["scale|-|sm_80|n=1024"]  # same time: the first


def test_merge_refuses_a_wheel(tiny_wheel, tiny_lock, tmp_path, capsys):
    root, _ = tiny_lock
    code, _, err = run_cli(capsys, "merge", root / "autotune.lock.json", tiny_wheel, "-o", tmp_path / "o.json")
    assert_one_line_error(code, err, "is a zip archive (a wheel?), expected a lock file")


# --------------------------------------------------------------------------------------------
# cache


def test_cache_info_and_clear(tiny_lock, session_cache, tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    shutil.copytree(session_cache, root, ignore=shutil.ignore_patterns("*.tmp"))  # other xdist workers' writes under way
    (root / "keep-me.txt").write_text("not the store")
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(root))
    entries, size = CompileCache(root).info()
    assert entries > 0
    code, out, err = run_cli(capsys, "cache", "info")
    assert code == 0, err
    rows = {r[0]: r[1] for r in table_rows(out) if len(r) == 2}
    assert rows["location"] == str(root) and rows["entries"] == str(entries)
    assert rows["size"] == fmt_bytes(size)

    stray = root / "v1" / "ab" / "notes.txt"  # a file hatch-autotune did not write: refuse
    stray.parent.mkdir(exist_ok=True)
    stray.write_text("mine")
    code, _, err = run_cli(capsys, "cache", "clear", "--yes")
    assert_one_line_error(code, err, "notes.txt", "not deleting anything")
    stray.unlink()

    code, out, err = run_cli(capsys, "cache", "clear")  # stdin is not a terminal here: nobody to ask
    assert_one_line_error(code, err, "stdin is not a terminal to ask on: pass --yes", "(nothing deleted)")
    assert CompileCache(root).info() == (entries, size)
    code, out, err = run_cli(capsys, "cache", "clear", "--yes")
    assert code == 0, err
    assert f"removed {entries} entries" in out
    assert not (root / "v1").exists() and (root / "keep-me.txt").read_text() == "not the store"
    code, out, _ = run_cli(capsys, "cache", "clear", "--yes")
    assert code == 0 and "nothing to clear" in out


def test_cache_clear_asks_on_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path))
    cache = _store_with_entries(tmp_path)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    asked: list[str] = []
    answers = iter(["n", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or next(answers))
    code, out, _ = run_cli(capsys, "cache", "clear")
    assert code == cli.EXIT_DECLINED and "nothing deleted" in out and cache.info()[0] == 2
    assert asked[0].startswith("delete 2 cached binaries") and asked[0].endswith("? [y/N] ")
    code, out, _ = run_cli(capsys, "cache", "clear")
    assert code == 0 and "removed 2 entries" in out and not cache.root.exists()


def _store_with_entries(root: Path) -> CompileCache:
    """A store written by CompileCache itself (no NVRTC needed), plus the temp file a killed
    write leaves behind: everything in it is hatch-autotune's."""
    cache = CompileCache(root)
    for key in ("ab" + "0" * 62, "cd" + "1" * 62):
        cache.put(key, CacheEntry(ok=True, log="", label="", resources=None, binary=b"binary"))
    (cache.root / "ab" / f".{'ab' + '0' * 62}.json.k3j_x9.tmp").write_bytes(b"half")
    return cache


@pytest.mark.parametrize(
    "plant, needle",
    [
        (lambda store: (store / "ab" / "notes.txt").write_text("mine"), "notes.txt, which hatch-autotune did not write"),
        (lambda store: (store / "README").write_text("mine"), "README, which hatch-autotune did not write"),
        (lambda store: (store / "zz").mkdir(), "zz, which hatch-autotune did not write"),
        (lambda store: (store / "ab" / "sub").mkdir(), "sub, which hatch-autotune did not write"),
        (lambda store: (store / "cd" / ("ee" * 32 + ".bin")).symlink_to(store / "README.md"), ".bin, which hatch-autotune did not write"),
    ],
    ids=["stray-file", "top-level-file", "not-a-shard", "dir-in-shard", "symlink"],
)
def test_cache_clear_refuses_a_store_holding_foreign_files(tmp_path, monkeypatch, capsys, plant, needle):
    """The store layout rule (build.cache) decides; the command deletes nothing and says what it found."""
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path))
    cache = _store_with_entries(tmp_path)
    assert cache.foreign_path() is None
    plant(cache.root)
    before = sorted(cache.root.rglob("*"))
    assert cache.foreign_path() is not None
    code, _, err = run_cli(capsys, "cache", "clear", "--yes")
    assert_one_line_error(code, err, needle, "not deleting anything")
    assert cache.clear() is not None  # the stage's own clear refuses too
    assert sorted(cache.root.rglob("*")) == before


def test_cache_clear_leaves_a_store_that_is_a_link_or_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    elsewhere = _store_with_entries(tmp_path / "elsewhere")
    store = CompileCache(tmp_path / "cache").root
    store.parent.mkdir()
    store.symlink_to(elsewhere.root, target_is_directory=True)
    code, _, err = run_cli(capsys, "cache", "clear", "--yes")
    assert_one_line_error(code, err, "is a symbolic link, not a store hatch-autotune created; leaving it alone")
    assert CompileCache(tmp_path / "cache").clear() == store and elsewhere.info()[0] == 2
    store.unlink()
    store.write_text("mine")
    code, _, err = run_cli(capsys, "cache", "clear", "--yes")
    assert_one_line_error(code, err, "is not a directory; not a store hatch-autotune created, leaving it alone")
    assert store.read_text() == "mine"


def test_cache_clear_removes_entries_and_leftover_temp_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path))
    cache = _store_with_entries(tmp_path)
    code, out, err = run_cli(capsys, "cache", "clear", "--yes")
    assert code == 0, err
    assert "removed 2 entries" in out and not cache.root.exists()
    assert cache.foreign_path() is None and cache.clear() is None  # an absent store: nothing to refuse


# --------------------------------------------------------------------------------------------
# tune


def _has_gpu() -> bool:
    from hatch_autotune.plan.devices import detect_gpu_arch

    return detect_gpu_arch() is not None


def test_tune_without_gpu_is_one_clear_line(tmp_path, monkeypatch, capsys):
    if _has_gpu():
        pytest.skip("a GPU is present: tuning would run")
    root = write_tiny_project(tmp_path / "p")
    monkeypatch.chdir(root)
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)
    code, _out, err = run_cli(capsys, "tune")
    assert_one_line_error(code, err, "GPU")
    assert not (root / "autotune.lock.json").exists()


def test_tune_prints_what_the_engine_did(tmp_path, monkeypatch, capsys):
    """The command hands the project, kernels and mode to the tuning engine and prints its
    summary in one line (the engine itself is tested in test_tuning and test_standin_tuning)."""
    from hatch_autotune import tuning
    from hatch_autotune.tuning import TuneSummary

    root = write_tiny_project(tmp_path / "p")
    calls = []

    def fake_tune(project, *, kernels, mode, log, cache, gpus):
        calls.append((project.root, kernels, mode, type(cache).__name__))
        log("tuning: fake engine")
        return TuneSummary(tuned=[("scale|-|sm_90|n=1024", None)], skipped=2)

    monkeypatch.setattr(tuning, "tune", fake_tune)
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)
    monkeypatch.delenv("HATCH_AUTOTUNE_RAY", raising=False)
    code, out, err = run_cli(capsys, "tune", root, "-k", "scale", "--mode", "retune")
    assert code == 0, err
    assert calls == [(root, ["scale"], "retune", "CompileCache")] and "tuning: fake engine" in err
    assert out.strip() == f"{root / 'autotune.lock.json'}: 1 entry tuned, 2 still valid; `hatch-autotune show {root}` lists them"


def test_tune_on_a_ray_cluster_goes_to_the_ray_engine(tmp_path, monkeypatch, capsys):
    """--ray ADDRESS, else HATCH_AUTOTUNE_RAY, sends the run to the Ray engine (tested in
    test_cluster on real local clusters); the local engine is not called."""
    from hatch_autotune import tuning
    from hatch_autotune.tuning import TuneSummary, ray_engine

    root = write_tiny_project(tmp_path / "p")
    calls = []

    def fake_ray(project, address, *, kernels, mode, log, cache):
        calls.append((address, kernels, mode))
        return TuneSummary(tuned=[("scale|-|sm_90|n=1024", None)])

    monkeypatch.setattr(ray_engine, "tune_on_ray", fake_ray)
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: pytest.fail("the local engine ran"))
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)
    monkeypatch.setenv("HATCH_AUTOTUNE_RAY", "10.0.0.9:6379")
    code, _out, err = run_cli(capsys, "tune", root)
    assert code == 0, err
    code, _out, err = run_cli(capsys, "tune", root, "--ray", "127.0.0.1:6379", "-k", "scale")
    assert code == 0, err
    assert calls == [("10.0.0.9:6379", None, "tune"), ("127.0.0.1:6379", ["scale"], "tune")]


def test_ray_resources_prints_this_nodes_gpus_by_arch_as_json(monkeypatch, capsys):
    from hatch_autotune.plan import devices
    from hatch_autotune.plan.devices import Gpu

    monkeypatch.setattr(devices, "detect_gpus", lambda: [Gpu(0, "sm_90", "H100"), Gpu(1, "sm_90", "H100"), Gpu(2, "sm_80", "A100")])
    code, out, err = run_cli(capsys, "ray-resources")
    assert code == 0 and json.loads(out) == {"hatch-autotune:sm_80": 1, "hatch-autotune:sm_90": 2} and err == ""
    monkeypatch.setattr(devices, "detect_gpus", lambda: [])
    code, out, err = run_cli(capsys, "ray-resources")
    assert code == 0 and json.loads(out) == {} and "no CUDA GPU found" in err


def test_tune_rejects_unknown_kernels_and_non_projects(tmp_path, capsys):
    root = write_tiny_project(tmp_path / "p")
    code, _, err = run_cli(capsys, "tune", root, "--kernel", "nope")
    assert_one_line_error(code, err, "no kernel named nope", "scale")
    code, _, err = run_cli(capsys, "tune", tmp_path)
    assert_one_line_error(code, err, "no pyproject.toml")


# --------------------------------------------------------------------------------------------
# report


def expected_charts(entries: dict, with_resources: bool) -> int:
    """One times chart per kernel, type instance and arch with timed configs (its buckets are
    panels inside it), one speedup chart per kernel, one of resources."""
    timed = {eid.rsplit("|", 1)[0] for eid, e in entries.items() if any(m.get("median_ms") for m in e["measurements"])}
    kernels = {eid.split("|")[0] for eid in entries}
    return len(timed) + len(kernels) + int(with_resources)


@pytest.fixture(scope="module")
def report_files(tiny_lock, tiny_wheel, tmp_path_factory):
    root, entries = tiny_lock
    out = tmp_path_factory.mktemp("report")
    html, png = out / "report.html", out / "png"
    code = cli.main(["report", str(root / "autotune.lock.json"), str(tiny_wheel), "-o", str(html), "--png", str(png)])
    assert code == 0
    return html, png, expected_charts(entries, with_resources=True)


def test_report_html_is_self_contained_with_every_chart(report_files):
    html_path, _, n_charts = report_files
    text = html_path.read_text()
    assert text.count('<svg class="chart"') == n_charts == 4  # speedup, resources, and one per arch with its 3 buckets
    for arch in ("sm_80", "sm_90"):
        chart = text[text.index(f'<svg class="chart" id="times-scale-{arch.replace("_", "-")}"') :]
        chart = chart[: chart.index("</svg>")]
        assert [b in chart for b in ("n=1024", "n=65536", "n=1048576")] == [True] * 3, arch
    for external in ("http://", "https://", "<script", "<link", "src=", "url("):
        assert external not in text, external
    assert "Resource usage of the chosen variants" in text and "registers per thread" in text
    assert "rejected (3): BAD=false BLOCK=64 FACTOR=3 (wrong result" in text  # why configs were not timed
    assert "1.25x" in text and FIXTURE_GPU in text


def test_report_pngs(report_files):
    from PIL import Image

    _, png_dir, n_charts = report_files
    pngs = sorted(png_dir.glob("*.png"))
    assert len(pngs) == n_charts
    assert {"speedup-scale.png", "resources.png", "times-scale-sm-80.png", "times-scale-sm-90.png"} == {p.name for p in pngs}
    for p in pngs:
        with Image.open(p) as im:
            assert im.size[0] >= 800 and len(im.convert("RGB").getcolors(1 << 20)) > 20


def test_report_from_lock_alone_says_resources_are_missing(tiny_lock, tmp_path, capsys):
    root, entries = tiny_lock
    out = tmp_path / "r.html"
    code, _stdout, err = run_cli(capsys, "report", root / "autotune.lock.json", "-o", out)
    assert code == 0, err
    text = out.read_text()
    assert text.count('<svg class="chart"') == expected_charts(entries, with_resources=False)
    assert "Not shown: lock files and projects carry no resource usage" in text
    n = expected_charts(entries, with_resources=False)
    assert f"drawing charts: {n}/{n}" in err  # plain progress lines when not on a terminal


def test_terminal_gets_rich_tables_and_a_progress_bar(tiny_lock, tmp_path, monkeypatch, capsys):
    root, entries = tiny_lock
    n = expected_charts(entries, with_resources=False)
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stdout and stderr as terminals
    code, out, err = run_cli(capsys, "report", root / "autotune.lock.json", "-o", tmp_path / "r.html")
    assert code == 0, err
    assert f"{n}/{n}" in err and "\u2501" in err  # a bar, not plain "drawing charts: 1/3" lines
    assert f"drawing charts: 1/{n}" not in err
    code, out, err = run_cli(capsys, "show", root / "autotune.lock.json")
    assert code == 0, err
    assert "arch" in out and "| arch" not in out  # rich's table, not the plain ASCII one


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [
                str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", *args,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium (Debian package 'chromium') is not installed")
def test_report_renders_in_headless_chromium(report_files, tmp_path):
    from PIL import Image

    html_path, _, n_charts = report_files
    dom = _chromium("--dump-dom", html_path.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<svg class="chart"') == n_charts
    assert dom.stdout.count("<rect") > n_charts * 3  # the bars are there

    shot = tmp_path / "shot.png"
    proc = _chromium(f"--screenshot={shot}", "--window-size=1200,2000", html_path.resolve().as_uri())
    assert shot.exists(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(1 << 22)
        assert len(colours) > 50  # text, bars, grid lines: not a blank page
        total = rgb.size[0] * rgb.size[1]
        background = max(count for count, _ in colours)
        assert total - background > total * 0.02
        # the winner's green and the default's orange bars were painted
        pixels = {c for _, c in colours}
        assert any(abs(r - 0x2F) + abs(g - 0x9E) + abs(b - 0x44) < 30 for r, g, b in pixels)
        assert any(abs(r - 0xF0) + abs(g - 0x8C) + abs(b - 0x00) < 30 for r, g, b in pixels)


def test_a_lock_entry_that_names_its_default_is_read_as_such():
    from hatch_autotune.inspection.readers import row_from_lock

    # FIXTURE numbers, not measurements: two configs tie with the default's time, and the
    # entry's "default" key (written by the tuner) says which one the default is.
    raw = {
        "checksum": "c",
        "config": {"B": 2},
        "tuned": True,
        "default": {"B": 3},
        "default_ms": 1.0,
        "measurements": [
            {"config": {"B": 1}, "status": "ok", "median_ms": 1.0},
            {"config": {"B": 3}, "status": "ok", "median_ms": 1.0},
            {"config": {"B": 2}, "status": "ok", "median_ms": 0.5},
        ],
    }
    where = EntryId.parse("k|-|sm_90|n=1")
    row = row_from_lock(where, LockEntry.from_json(raw))
    assert row.default_config == {"B": 3} and row.speedup == 2.0
    del raw["default"]  # without it, a tie on the default's time leaves the default unknown
    assert row_from_lock(where, LockEntry.from_json(raw)).default_config is None
