"""What the command reads, read safely (issue #33): only regular files, each with a size bound (a
named pipe as the lock file hung `show .`; a lock linked to /dev/zero read until killed); a
wheel's members bounded by their declared and their actual size (a 1 MB wheel whose table.json
inflated to 1 GiB took 2.1 GB); a huge number anywhere in a lock file or a table is one line, not
"internal error"; random bytes and random JSON as lock files, tables and wheels are exit 0 or one
line with exit 2; and `diff` says when the code of an entry changed though its winner did not.

The projects are the tiny one of conftest.py, built with real NVRTC; the lock files' times are
made up (test fixtures, not measurements).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, SCALE_TEMPLATE, build, write_tiny_project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hatch_autotune import cli
from hatch_autotune.inspection import readers
from hatch_autotune.lock import LOCK_SCHEMA

EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
SUBPROCESS_TIMEOUT_S = 120  # generous: a start-up takes a second or two; a hang is forever


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "HATCH_AUTOTUNE_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def run_cli(*argv) -> tuple[int, str, str]:
    """The real entry point, in this process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def run_command(*argv, memory: int | None = None) -> subprocess.CompletedProcess:
    """`python -m hatch_autotune ARGV` in a subprocess with a timeout (a hang fails the test
    rather than the run) and optionally an address-space limit (a runaway read fails with
    MemoryError rather than filling the machine)."""

    def limit() -> None:
        if memory is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("HATCH_AUTOTUNE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "hatch_autotune", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=SUBPROCESS_TIMEOUT_S,
        preexec_fn=limit,
    )


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hatch-autotune: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def write_lock(path: Path, entries: dict) -> Path:
    path.write_text(json.dumps({"schema": LOCK_SCHEMA, "entries": entries}, sort_keys=True, indent=1) + "\n")
    return path


def entry(config: dict | None = None, ms: float | int = 0.01, checksum: str = "c" * 64) -> dict:
    """A tuned lock entry with one made-up time (a test fixture, not a measurement)."""
    config = config or {"BLOCK": 128, "FACTOR": 2, "BAD": False}
    return {
        "checksum": checksum,
        "config": config,
        "tuned": True,
        "measurements": [{"config": config, "status": "ok", "median_ms": ms, "samples": 5}],
        "provenance": {"gpu": "TEST FIXTURE GPU"},
    }


def small_table(bucket: list | None = None) -> dict:
    """The smallest selection table the command reads: one kernel, one variant, one row."""
    return {
        "schema": 1,
        "kernels": {
            "k": {
                "key": [{"name": "n"}],
                "variants": {"v0": {"config": {"B": 1}, "binaries": {"sm_90": {"file": "bin/k.cubin", "sha256": "a" * 64}}}},
                "select": {"-": {"sm_90": [{"bucket": bucket or [1024], "variant": "v0", "tuned": False, "provenance": {"reason": "x"}}]}},
            }
        },
    }


def write_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


TABLE = "p/k/table.json"
RUNTIME = "p/k/_runtime/__init__.py"


# --------------------------------------------------------------------------------------------
# #2: only regular files, with a size bound.


def test_show_a_project_whose_lock_file_is_a_named_pipe_answers_at_once(tmp_path):
    """`mkfifo autotune.lock.json; hatch-autotune show .` hung forever (no writer ever came)."""
    root = write_tiny_project(tmp_path / "p", extra='mode = "offline"')
    os.mkfifo(root / "autotune.lock.json")
    try:
        proc = run_command("show", root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`show` of a project whose lock file is a named pipe did not return within {SUBPROCESS_TIMEOUT_S} s")
    assert_one_line_error(proc.returncode, proc.stderr, f"{root / 'autotune.lock.json'}: is a named pipe, expected a lock file")


def test_tune_of_a_project_whose_pyproject_is_a_named_pipe_answers_at_once(tmp_path):
    """`tune` reads pyproject.toml itself (hook_table): a named pipe in its place hung it."""
    root = tmp_path / "p"
    root.mkdir()
    os.mkfifo(root / "pyproject.toml")
    try:
        proc = run_command("tune", root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tune` of a project whose pyproject.toml is a named pipe did not return within {SUBPROCESS_TIMEOUT_S} s")
    assert_one_line_error(
        proc.returncode, proc.stderr, f"{root / 'pyproject.toml'}: cannot read it (is a named pipe, expected a regular file)"
    )


def test_a_lock_file_linked_to_dev_zero_is_refused_not_read_until_killed(tmp_path):
    """A lock that is a link to /dev/zero (outside the project: with the opt-in) was read until
    the memory ran out; it is a device."""
    root = write_tiny_project(tmp_path / "p", extra='mode = "offline"\nlock-file-outside-project = true')
    (root / "autotune.lock.json").symlink_to("/dev/zero")
    proc = run_command("show", root, memory=3 << 30)
    assert_one_line_error(proc.returncode, proc.stderr, "autotune.lock.json: is a character device, expected a lock file")
    proc = run_command("merge", root / "autotune.lock.json", "-o", tmp_path / "out.json", memory=3 << 30)
    assert_one_line_error(proc.returncode, proc.stderr, "autotune.lock.json: is a character device, expected a lock file")
    assert not (tmp_path / "out.json").exists()


def test_show_dev_null_or_a_pipe_says_what_it_is_not_no_such_file(tmp_path):
    """`show /dev/null` and `show PIPE` said "no such file"; they say what the path is."""
    pipe = tmp_path / "lock.json"
    os.mkfifo(pipe)
    expected = "expected a project, lock file, wheel, selection table or package"
    assert_one_line_error(*run_cli("show", "/dev/null")[::2], f"/dev/null: is a character device, {expected}")
    assert_one_line_error(*run_cli("show", pipe)[::2], f"{pipe}: is a named pipe, {expected}")
    assert_one_line_error(*run_cli("diff", pipe, "/dev/null")[::2], f"{pipe}: is a named pipe")
    assert_one_line_error(*run_cli("show", tmp_path / "absent.json")[::2], "absent.json: no such file")  # absent is still absent


def test_merge_of_a_pipe_answers_at_once(tmp_path):
    """`merge PIPE` opened the pipe (to look for a zip archive) and waited for a writer forever."""
    pipe = tmp_path / "lock.json"
    os.mkfifo(pipe)
    try:
        proc = run_command("merge", pipe, "-o", tmp_path / "out.json")
    except subprocess.TimeoutExpired:
        pytest.fail(f"`merge` of a named pipe did not return within {SUBPROCESS_TIMEOUT_S} s")
    assert_one_line_error(proc.returncode, proc.stderr, f"{pipe}: is a named pipe, expected a lock file")


def test_a_json_input_larger_than_the_bound_is_refused_unread(tmp_path, monkeypatch):
    """Every JSON file the command reads has a size bound (readers.MAX_JSON_BYTES, lowered here
    so that the test stays small): a lock file, a table.json, a package's outcome record."""
    lock = write_lock(tmp_path / "big.lock.json", {f"k|-|sm_90|n={2**i}": entry() for i in range(40)})
    table = tmp_path / "table.json"
    table.write_text(json.dumps(small_table()) + " " * 10_000)
    monkeypatch.setattr(readers, "MAX_JSON_BYTES", 4096, raising=False)
    for args in (("show", lock), ("diff", lock, lock), ("merge", lock, "-o", tmp_path / "o.json"), ("show", table)):
        code, _out, err = run_cli(*args)
        assert_one_line_error(code, err, f"{args[1]}: is {args[1].stat().st_size} bytes, more than the 4096 bytes")


def test_the_json_bound_is_the_lock_files_bound():
    """One bound for a lock file, whoever reads it (build, `tune`, the command)."""
    from hatch_autotune.lock import LOCK_FILE_LIMIT

    assert readers.MAX_JSON_BYTES == LOCK_FILE_LIMIT


# --------------------------------------------------------------------------------------------
# #7: zip bombs.


def _zeros_member(size: int) -> bytes:
    """`size` zero bytes: deflate packs them about 1000:1, so a 64 MiB member is 64 KiB."""
    return bytes(size)


def _lie_about_size(path: Path, member: str, declared: int) -> None:
    """Rewrite the uncompressed size of `member` in its local header and central directory entry."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    local = data.index(b"PK\x03\x04")
    while data[local + 30 : local + 30 + len(name)] != name:
        local = data.index(b"PK\x03\x04", local + 4)
    struct.pack_into("<I", data, local + 22, declared)
    central = data.index(b"PK\x01\x02")
    while data[central + 46 : central + 46 + len(name)] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", data, central + 24, declared)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("member", [TABLE, "p/k/outcome.json"])
def test_a_zip_bomb_member_is_refused_by_its_declared_size(tmp_path, monkeypatch, member):
    """A wheel whose table.json (or outcome.json) inflates to 64 MiB, with the bound lowered to
    1 MiB: refused before inflating, for show and diff alike, naming the wheel and the member,
    and the command's memory stays far below the member's size."""
    members = {TABLE: json.dumps(small_table()).encode(), RUNTIME: b"", member: _zeros_member(64 << 20)}
    wheel = write_wheel(tmp_path / "bomb-0.1-py3-none-any.whl", members)
    assert wheel.stat().st_size < 1 << 20
    monkeypatch.setattr(readers, "MAX_JSON_BYTES", 1 << 20, raising=False)
    for args in (("show", wheel), ("diff", wheel, wheel)):
        tracemalloc.start()
        try:
            code, _out, err = run_cli(*args)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert_one_line_error(code, err, f"{wheel}!{member}: inflates to {64 << 20} bytes, more than the {1 << 20} bytes")
        assert peak < 16 << 20, peak


def test_a_member_declaring_more_than_the_real_bound_is_refused(tmp_path):
    """The real bound, unpatched: a member whose header declares 2 GiB is refused at once."""
    wheel = write_wheel(tmp_path / "w-0.1-py3-none-any.whl", {TABLE: json.dumps(small_table()).encode(), RUNTIME: b""})
    _lie_about_size(wheel, TABLE, 2 << 30)
    code, _, err = run_cli("show", wheel)
    assert_one_line_error(code, err, f"{wheel}!{TABLE}: inflates to {2 << 30} bytes, more than the {readers.MAX_JSON_BYTES} bytes")


def test_a_member_whose_header_lies_about_its_size_is_one_line_naming_it(tmp_path, monkeypatch):
    """A member of 4 MiB whose headers say 100 bytes: never more than the bound is inflated, and
    the error names the wheel and the member (it said "not a wheel (not a zip archive)")."""
    wheel = write_wheel(tmp_path / "liar-0.1-py3-none-any.whl", {TABLE: _zeros_member(4 << 20), RUNTIME: b""})
    _lie_about_size(wheel, TABLE, 100)
    monkeypatch.setattr(readers, "MAX_JSON_BYTES", 1 << 20, raising=False)
    for args in (("show", wheel), ("diff", wheel, wheel)):
        code, _, err = run_cli(*args)
        assert_one_line_error(code, err, f"{wheel}!{TABLE}: damaged archive member")


def test_read_member_stops_past_the_bound_whatever_the_header_says(tmp_path):
    """The chunked read itself, under a zip reader that believes a lying header and inflates
    all there is (CPython's stops at the declared size; read_member does not rely on it): a
    member that says 100 bytes and gives 64 MiB is read up to the bound plus one chunk, no more."""

    class Believer:
        """A zip reader's two calls read_member makes, the member's true bytes behind a header
        that says 100."""

        def __init__(self) -> None:
            self.stream = io.BytesIO(bytes(64 << 20))
            self.stream.close = lambda: None  # type: ignore[method-assign]  # kept open to ask how far it was read

        def getinfo(self, name: str) -> zipfile.ZipInfo:
            info = zipfile.ZipInfo(name)
            info.file_size = 100
            return info

        def open(self, info: zipfile.ZipInfo) -> io.BytesIO:
            return self.stream

    zf = Believer()
    with pytest.raises(readers.CliError) as caught:
        readers.read_member(zf, TABLE, tmp_path / "w.whl", 1 << 20)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"{tmp_path / 'w.whl'}!{TABLE}: inflates to more than the {1 << 20} bytes read from an archive member (its header says 100)"
    )
    assert zf.stream.tell() == (1 << 20) + 1


# --------------------------------------------------------------------------------------------
# #8: huge numbers in lock files and tables.


def test_a_5000_digit_bucket_in_a_lock_entry_id_is_one_line_for_show_diff_merge(tmp_path):
    """'internal error: ... Exceeds the limit (4300 digits)' before; needs lock.py's Bucket.parse
    to refuse it as a LockFormatError (the lock owner's change)."""
    eid = "k|-|sm_90|n=" + "9" * 5000
    lock = write_lock(tmp_path / "a.json", {eid: entry()})
    good = write_lock(tmp_path / "b.json", {"k|-|sm_90|n=1024": entry()})
    for args in (("show", lock), ("diff", good, lock), ("diff", lock, good), ("merge", good, lock, "-o", tmp_path / "o.json")):
        code, _out, err = run_cli(*args)
        assert_one_line_error(code, err, f"{lock}: entry ")
        assert len(err) < 1000, err  # the id is cut, not printed whole
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("bucket", ["Infinity", "-Infinity", "1e400", '"' + "9" * 5000 + '"'])
def test_a_table_bucket_no_integer_holds_is_one_line(tmp_path, bucket):
    """A table row's bucket of Infinity (JSON as Python reads it) or 1e400 crashed show with
    OverflowError ('internal error')."""
    text = json.dumps(small_table()).replace("[1024]", f"[{bucket}]")
    (tmp_path / "table.json").write_text(text)
    wheel = write_wheel(tmp_path / "w.whl", {TABLE: text.encode(), RUNTIME: b""})
    for target in (tmp_path / "table.json", wheel):
        code, _, err = run_cli("show", target)
        assert_one_line_error(code, err, "malformed selection table")


@pytest.mark.parametrize("ms", ["1" + "0" * 400, "-1" + "0" * 400])
def test_a_time_no_float_holds_is_no_time_not_a_crash(tmp_path, ms):
    """A lock time of 10**400 (valid JSON, a Python int) crashed show ('int too large to convert
    to float') and diff; it is not a time, so it is shown as none."""
    text = json.dumps({"schema": LOCK_SCHEMA, "entries": {"k|-|sm_90|n=1024": entry(ms=12345)}}).replace("12345", ms)
    lock = tmp_path / "a.json"
    lock.write_text(text)
    good = write_lock(tmp_path / "b.json", {"k|-|sm_90|n=1024": entry()})
    for args in (("show", lock), ("diff", lock, good), ("diff", good, lock)):
        code, _out, err = run_cli(*args)
        assert code == 0 and err == "", err


# --------------------------------------------------------------------------------------------
# diff: "code changed" when the winners did not change.

HEADER_TEMPLATE = '#include "scale_op.cuh"\n' + SCALE_TEMPLATE.replace("{{ FACTOR }}.0f * x[i]", "scale_op({{ FACTOR }}.0f, x[i])")
HEADER = "__device__ inline float scale_op(float f, float x) {{ return {}; }}\n"


@pytest.fixture(scope="module")
def edited(tmp_path_factory, session_cache):
    """The tiny project with a header, before and after an edit of that header (the template,
    the config and the space unchanged), each with a lock file naming the default config the
    winner everywhere (as a re-tune that found the same winners would), and each one's wheel
    built by hatchling from its project without that lock (so its entries are defaults)."""
    from hatchling.builders.wheel import WheelBuilder

    from hatch_autotune.lock import LockEntry, LockFile, Measurement

    tmp = tmp_path_factory.mktemp("edited")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(session_cache))
        mp.delenv("HATCH_AUTOTUNE_MODE", raising=False)
        for name, body in (("old", "f * x"), ("new", "f * x + 0.5f")):
            root = write_tiny_project(tmp / name, extra='mode = "offline"', template=HEADER_TEMPLATE)
            (root / "scale_op.cuh").write_text(HEADER.format(body))
            result = build(root, session_cache)
            default = dict(result.kernels[0].spec.default)
            lock = LockFile()
            for eid, checksum in result.kernels[0].lock_ids.values():
                m = Measurement.from_json({"config": default, "status": "ok", "median_ms": 0.01, "samples": 5})  # fixture
                lock.entries[eid] = LockEntry(checksum, default, tuned=True, measurements=(m,), provenance={"gpu": "TEST FIXTURE GPU"})
            lock_path = tmp / f"{name}.lock.json"
            lock.save(lock_path)
            (wheel,) = WheelBuilder(str(root)).build(directory=str(tmp / f"dist-{name}"), versions=["standard"])
            out[name] = (root, lock_path, Path(wheel))
    return out


def diff_rows(out: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells
        for cells in ([c.strip() for c in line.strip()[1:-1].split(" | ")] for line in out.splitlines() if line.startswith("| "))
        if cells[0] != "entry"
    }


PAIRS = [
    ("lock", "lock", "checksum"),  # said "changed: checksum", as if the winners had changed
    ("wheel", "wheel", "binary"),  # said "0 changed"
    ("project", "project", "checksum"),  # said "0 changed"
    ("wheel", "project", "binary"),  # said "0 changed"
]
PICK = {"project": 0, "lock": 1, "wheel": 2}


@pytest.fixture
def project_env(monkeypatch, session_cache):
    """A project is read (and its shipped variants compiled) as `show` would here: offline."""
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)


@pytest.mark.parametrize("a, b, expect", PAIRS)
def test_diff_says_code_changed_when_a_header_edit_kept_the_winners(edited, project_env, a, b, expect):
    """Each row: 'code changed', what code (checksum, binary), the config the same; the counts."""
    from hatch_autotune.inspection.diff import diff_sources
    from hatch_autotune.inspection.readers import load_source

    old, new = edited["old"][PICK[a]], edited["new"][PICK[b]]
    code, out, err = run_cli("diff", old, new)
    assert code == 0, err
    rows = diff_rows(out)
    assert len(rows) == 6 and all(r[1].startswith("code changed") for r in rows.values()), out
    assert all(r[2] == r[3] == "BAD=false BLOCK=128 FACTOR=2" for r in rows.values())  # the same config
    diff = diff_sources(load_source(str(old)), load_source(str(new)), 0.05)
    assert all(c.kind == "code changed" and any(w.startswith(expect) for w in c.what) for c in diff.changes)
    assert all(c.text.startswith(f"code changed: {expect}") for c in diff.changes)
    assert diff.summary() == "0 added, 0 removed, 0 changed, 6 code changed, 0 unchanged"


@pytest.mark.parametrize("a, b, expect", PAIRS)
def test_the_diff_command_counts_code_changes_in_its_summary(edited, project_env, a, b, expect):
    """What the command prints: each row's code change in words, and the count in the summary
    (needs the command's diff to print Change.text and Diff.summary())."""
    code, out, err = run_cli("diff", edited["old"][PICK[a]], edited["new"][PICK[b]])
    assert code == 0, err
    assert "0 added, 0 removed, 0 changed, 6 code changed, 0 unchanged;" in out, out
    assert all(r[1].startswith(f"code changed: {expect}") for r in diff_rows(out).values()), out


def test_diff_of_unedited_inputs_finds_no_code_change(edited, project_env):
    """The same sources: a wheel and its project compile the same binaries; nothing changed."""
    root, lock, wheel = edited["old"]
    for a, b in ((wheel, root), (lock, lock), (root, root)):
        code, out, err = run_cli("diff", a, b)
        assert code == 0 and "0 added, 0 removed, 0 changed, 6 unchanged;" in out, (a, b, out, err)
        assert "code changed" not in out and "code not compared" not in out


def test_diff_of_a_lock_file_and_a_wheel_does_not_claim_to_know_the_code(edited):
    """A lock file has checksums, a wheel binaries: they cannot be compared, so no code change
    is claimed either way (the winners lost their tuning: the wheel was built without the lock)."""
    from hatch_autotune.inspection.diff import diff_sources
    from hatch_autotune.inspection.readers import load_source

    old_lock, new_wheel = edited["old"][1], edited["new"][2]
    code, out, err = run_cli("diff", old_lock, new_wheel)
    assert code == 0, err
    rows = diff_rows(out)
    assert len(rows) == 6 and all(r[1] == "changed: lost its tuning" for r in rows.values()), out
    diff = diff_sources(load_source(str(old_lock)), load_source(str(new_wheel)), 0.05)
    assert diff.code_compared == 0 and diff.summary() == f"0 added, 0 removed, 6 changed, 0 unchanged ({NOT_COMPARED})"


def test_the_diff_command_says_when_it_could_not_compare_code(edited):
    """What the command prints for a lock file against a wheel (needs the command's diff to print
    Diff.summary())."""
    code, out, _err = run_cli("diff", edited["old"][1], edited["new"][2])
    assert code == 0 and f"0 added, 0 removed, 6 changed, 0 unchanged ({NOT_COMPARED}); 0 regression(s)" in out, out


NOT_COMPARED = "code not compared: no checksum or binary known to both inputs"


# --------------------------------------------------------------------------------------------
# Hypothesis: garbage in, exit 0 or one line with exit 2.

JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
JSON = st.recursive(
    JSON_LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20
)
FIELD_VALUES = JSON | st.sampled_from(["c" * 64, {"BLOCK": 128}, True, 0.5, 10**400, float("inf"), float("nan"), "ok"])


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy = FIELD_VALUES) -> st.SearchStrategy:
    """`good` four times in five, else `bad`: so that most examples get past the first check."""
    return st.integers(0, 4).flatmap(lambda i: bad if i == 0 else good)


IDS = mostly(
    st.sampled_from(["k|-|sm_90|n=1024", "k|-|sm_90|n=1", "k|T=float32|sm_80|n=1,m=2", "k|-|sm_90|n=" + "9" * 30, "k|-|sm_x|n=-5"]),
    st.sampled_from(["|||", "k", "k|-|sm_90|n=" + "9" * 5000]) | st.text(max_size=12),
)
MEASUREMENT = st.fixed_dictionaries(
    {"config": mostly(st.just({"BLOCK": 128}), st.dictionaries(st.text(max_size=3), FIELD_VALUES, max_size=2))},
    optional={k: mostly(st.just(v)) for k, v in {"status": "ok", "median_ms": 0.5, "samples": 5, "index": 0, "reason": ""}.items()},
)
ENTRY_KEYS = st.sampled_from(["checksum", "config", "tuned", "index", "default", "default_ms", "measurements", "provenance", "x"])
LOCK_ENTRY = st.builds(  # a valid entry with a field replaced or added at times, and random measurements
    lambda base, changes, ms: {**base, **changes, **({"measurements": ms} if ms is not None else {})},
    st.just(entry({"BLOCK": 128})),
    mostly(st.just({}), st.dictionaries(ENTRY_KEYS, FIELD_VALUES, min_size=1, max_size=2)),
    st.none() | st.lists(MEASUREMENT, max_size=3),
)
LOCKS = st.fixed_dictionaries({"schema": mostly(st.just(LOCK_SCHEMA)), "entries": mostly(st.dictionaries(IDS, LOCK_ENTRY, max_size=3))})

TABLE_ROW = st.fixed_dictionaries(
    {"bucket": mostly(st.just([1024]), st.lists(FIELD_VALUES, max_size=2) | FIELD_VALUES), "variant": mostly(st.just("v0"))},
    optional={"tuned": mostly(st.booleans()), "provenance": mostly(st.just({"reason": "x"}) | st.just({"gpu": "G", "median_ms": 1.5}))},
)
TABLE_VARIANT = st.fixed_dictionaries(
    {"config": mostly(st.just({"B": 1}))},
    optional={"binaries": mostly(st.just({"sm_90": {"sha256": "a" * 64}})), "resources": mostly(st.just({"sm_90": {"registers": 32}}))},
)
TABLE_KERNEL = st.fixed_dictionaries(
    {
        "key": mostly(st.just([{"name": "n"}]), st.lists(st.dictionaries(st.just("name"), FIELD_VALUES), max_size=2) | FIELD_VALUES),
        "variants": mostly(st.dictionaries(mostly(st.just("v0"), st.text(max_size=3)), TABLE_VARIANT, min_size=1, max_size=2)),
        "select": mostly(
            st.dictionaries(
                mostly(st.just("-"), st.text(max_size=3)),
                st.dictionaries(st.sampled_from(["sm_90", "sm_8", "compute_90", ""]), mostly(st.lists(TABLE_ROW, max_size=2)), max_size=2),
                max_size=2,
            )
        ),
    }
)
TABLES = st.fixed_dictionaries(
    {"schema": mostly(st.just(1)), "kernels": st.dictionaries(mostly(st.just("k"), st.text(max_size=3)), TABLE_KERNEL, max_size=2)}
)


def assert_exit_0_or_one_line(code: int, err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 0:
        return
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hatch-autotune: error: "), err


@contextlib.contextmanager
def scratch():
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ha-readers-") as d:
        yield Path(d)


GOOD_LOCK = json.dumps({"schema": LOCK_SCHEMA, "entries": {"k|-|sm_90|n=1024": entry({"BLOCK": 128})}}).encode()


@PROPERTY
@given(data=st.binary(max_size=300) | st.sampled_from([b"", b"PK\x03\x04", b"\xef\xbb\xbf{}", b"[" * 5000, b"NaN"]))
def test_any_bytes_as_a_lock_file_or_table_are_read_or_refused_in_one_line(data):
    with scratch() as d:
        (d / "x.json").write_bytes(data)
        (d / "good.json").write_bytes(GOOD_LOCK)
        assert_exit_0_or_one_line(*run_cli("show", d / "x.json")[::2])
        assert_exit_0_or_one_line(*run_cli("diff", d / "good.json", d / "x.json")[::2])


@PROPERTY
@given(lock=LOCKS)
def test_any_lock_shaped_json_is_shown_diffed_and_merged_or_refused_in_one_line(lock):
    with scratch() as d:
        (d / "x.json").write_text(json.dumps(lock))
        (d / "good.json").write_bytes(GOOD_LOCK)
        assert_exit_0_or_one_line(*run_cli("show", d / "x.json")[::2])
        assert_exit_0_or_one_line(*run_cli("diff", d / "x.json", d / "good.json")[::2])
        assert_exit_0_or_one_line(*run_cli("merge", d / "x.json", d / "good.json", "-o", d / "o.json", "--prefer", "first")[::2])


@PROPERTY
@given(table=TABLES, raw=st.none() | st.binary(max_size=200))
def test_any_table_shaped_json_or_bytes_in_a_wheel_are_shown_or_refused_in_one_line(table, raw):
    text = raw if raw is not None else json.dumps(table).encode()
    with scratch() as d:
        (d / "table.json").write_bytes(text)
        wheel = write_wheel(d / "w-0.1-py3-none-any.whl", {TABLE: text, RUNTIME: b"", "p/k/outcome.json": text})
        assert_exit_0_or_one_line(*run_cli("show", d / "table.json")[::2])
        assert_exit_0_or_one_line(*run_cli("show", wheel)[::2])
        assert_exit_0_or_one_line(*run_cli("diff", wheel, d / "table.json")[::2])


@PROPERTY
@given(
    data=st.binary(min_size=0, max_size=400), cut=st.integers(min_value=0, max_value=400), flip=st.integers(min_value=0, max_value=10**6)
)
def test_any_damaged_wheel_is_shown_or_refused_in_one_line(data, cut, flip):
    """A real small wheel, cut short or with a byte changed, or random bytes named .whl."""
    good = io.BytesIO()
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(TABLE, json.dumps(small_table()))
        zf.writestr(RUNTIME, b"")
    blob = bytearray(good.getvalue())
    variants = [bytes(blob[: len(blob) - cut]), data]
    blob[flip % len(blob)] ^= 0xFF
    variants.append(bytes(blob))
    with scratch() as d:
        for i, v in enumerate(variants):
            (d / f"w{i}.whl").write_bytes(v)
            assert_exit_0_or_one_line(*run_cli("show", d / f"w{i}.whl")[::2])


def test_a_wheel_that_needs_a_newer_zip_version_is_one_line(tmp_path):
    """A central directory entry asking for zip version 23.5 (Hypothesis found it: one flipped
    byte): zipfile raises NotImplementedError while opening the archive, an internal error before."""
    wheel = write_wheel(tmp_path / "w.whl", {TABLE: json.dumps(small_table()).encode(), RUNTIME: b""})
    data = bytearray(wheel.read_bytes())
    struct.pack_into("<H", data, data.index(b"PK\x01\x02") + 6, 235)  # version needed to extract
    wheel.write_bytes(bytes(data))
    assert_one_line_error(*run_cli("show", wheel)[::2], f"{wheel}: not a wheel (a damaged zip archive: zip file version 23.5)")


def test_a_zip_lookalike_with_a_bad_compression_method_is_one_line(tmp_path):
    """A member whose compression method this Python does not have: NotImplementedError was an
    internal error."""
    wheel = write_wheel(tmp_path / "w.whl", {TABLE: json.dumps(small_table()).encode(), RUNTIME: b""})
    data = bytearray(wheel.read_bytes())
    for sig, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # the method field of each header
        at = data.index(sig)
        struct.pack_into("<H", data, at + offset, 99)
    wheel.write_bytes(bytes(data))
    assert_one_line_error(*run_cli("show", wheel)[::2], str(wheel))
