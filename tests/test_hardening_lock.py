"""Hardening of the lock file (issue #33): a pipe, a device or a huge file in its place is a
warning, not a hang or a full memory; two tuning runs writing one lock at once keep each other's
entries; a symlinked lock stays a symlink; a bucket of thousands of digits is a malformed entry,
not a traceback. Property tests of entry ids and entries close the file.

The tuning runs here use the stand-in worker (tests/fake_worker.py): its timings are SYNTHETIC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SCALE_TEMPLATE, load_project, tune_over_fake_worker, write_tiny_project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hatch_autotune import cli
from hatch_autotune.lock import EntryId, LockEntry, LockFile, LockFormatError
from hatch_autotune.runtime import MAX_SIZE
from hatch_autotune.tuning import TuningError
from hatch_autotune.tuning.lock_writer import LockSaver

HERE = Path(__file__).parent
FAKE = [sys.executable, str(HERE / "fake_worker.py")]
EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
FAST = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
ENTRY = {"checksum": "c" * 64, "config": {"BLOCK": 128}, "tuned": True}
HUGE_BUCKET = "scale|-|sm_90|n=" + "9" * 5000


def outputs_of(procs: list[subprocess.Popen], timeout: float) -> list[tuple[subprocess.Popen, str, str]]:
    """(process, stdout, stderr) of each; if one runs past `timeout`, every one still running is
    killed with its children (each started in a session of its own) and the test fails."""
    try:
        return [(p, *p.communicate(timeout=timeout)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


def within(fn, seconds: float = 10.0, fifo: Path | None = None):
    """fn(), failing the test instead of hanging; a reader stuck on `fifo` is let go after."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() and fifo is not None:
        with open(fifo, "wb"):  # a writer that closes at once: the stuck reader sees the end
            pass
        thread.join(seconds)
        raise AssertionError(f"hung on the named pipe {fifo}")
    assert not thread.is_alive(), "hung"
    if "error" in box:
        raise box["error"]
    return box["value"]


def lock_bytes(entries: dict) -> bytes:
    return json.dumps({"schema": 1, "entries": entries}).encode()


# ---- #2: only regular files, of bounded size --------------------------------------------------


def test_a_named_pipe_as_the_lock_file_is_a_warning_not_a_hang(tmp_path):
    fifo = tmp_path / "autotune.lock.json"
    os.mkfifo(fifo)  # nobody writes: a plain read blocks forever
    lock = within(lambda: LockFile.load(fifo), fifo=fifo)
    assert lock.entries == {}
    assert lock.warnings == [f"{fifo}: lock file is a named pipe, expected a regular file; ignoring it"]


def test_a_build_plan_over_a_named_pipe_lock_warns_and_goes_on(tmp_path):
    from hatch_autotune.plan.planner import make_plan

    root = write_tiny_project(tmp_path / "p")
    fifo = root / "autotune.lock.json"
    os.mkfifo(fifo)
    logs: list[str] = []
    plan = within(lambda: make_plan(load_project(root), ["sm_90"], log=logs.append, compiler="13.0"), fifo=fifo)
    assert plan.lock.entries == {}
    assert any("named pipe" in line and line.startswith("warning: ") for line in logs), logs


CHILD_LOAD = """\
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # the machine's memory is not the limit
from pathlib import Path
from hatch_autotune.lock import LockFile
print(json.dumps(LockFile.load(Path(sys.argv[1])).warnings))
"""


def test_a_lock_linked_to_dev_zero_is_a_warning_not_a_read_until_killed(tmp_path):
    link = tmp_path / "autotune.lock.json"
    link.symlink_to("/dev/zero")
    proc = subprocess.run([sys.executable, "-c", CHILD_LOAD, str(link)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (warning,) = json.loads(proc.stdout)
    assert warning == f"{link}: lock file is a character device, expected a regular file; ignoring it"


def test_a_lock_file_over_the_bound_is_a_warning_and_is_not_read(tmp_path):
    from hatch_autotune.lock import LOCK_FILE_LIMIT

    path = tmp_path / "autotune.lock.json"
    with open(path, "wb") as f:
        f.truncate(LOCK_FILE_LIMIT + 1)  # sparse: no disk, and refused by its size before any read
    (warning,) = LockFile.load(path).warnings
    assert f"is {LOCK_FILE_LIMIT + 1} bytes, more than the {LOCK_FILE_LIMIT} bytes" in warning and "ignoring it" in warning


@pytest.mark.parametrize("kind", ["a named pipe", "a character device"])
def test_tune_refuses_to_replace_a_pipe_or_device_before_any_gpu_time(tmp_path, kind):
    path = tmp_path / "autotune.lock.json"
    if kind == "a named pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")

    def save():
        saver = LockSaver(LockFile(), path)
        saver.put("scale|-|sm_90|n=1", LockEntry.from_json(ENTRY))
        saver.close()

    with pytest.raises(TuningError, match=f"cannot save {path}: it is {kind}, expected a regular file"):
        within(save, fifo=path if kind == "a named pipe" else None)
    assert path.is_fifo() if kind == "a named pipe" else (path.is_symlink() and os.readlink(path) == "/dev/null")


# ---- #3: writers serialised, each run's entries merged over the file ----------------------------


CHILD_SAVER = """\
import json, sys, time
from pathlib import Path
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.tuning.lock_writer import LockSaver
path, name, start = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
saver = LockSaver(LockFile.load(path), path)  # as a run does: the lock as it was when it started
start.with_name(name).touch()
deadline = time.monotonic() + 60
while len(list(start.parent.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.005)
entry = {"checksum": "c" * 64, "config": {"BLOCK": 128}, "tuned": True}
for i in range(40):
    saver.put(f"{name}|-|sm_90|n={i}", LockEntry.from_json(entry))
    time.sleep(0.002)
saver.close()
"""


def test_two_processes_saving_one_lock_at_once_lose_no_entry(tmp_path):
    path = tmp_path / "lock" / "autotune.lock.json"
    path.parent.mkdir()
    path.write_bytes(lock_bytes({"old|-|sm_90|n=1": ENTRY}))
    start = tmp_path / "start"
    start.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD_SAVER, str(path), name, str(start / "x")],
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for name in ("ka", "kb")
    ]
    for p, _, err in outputs_of(procs, timeout=120):
        assert p.returncode == 0, err[-2000:]
    entries = json.loads(path.read_text())["entries"]
    expected = {"old|-|sm_90|n=1"} | {f"{k}|-|sm_90|n={i}" for k in ("ka", "kb") for i in range(40)}
    assert set(entries) == expected, sorted(expected - set(entries))[:5]
    assert sorted(p.name for p in path.parent.iterdir()) == ["autotune.lock.json"]  # no sidecar or temp file left


TWO_KERNELS = """\
[tool.hatch.build.targets.wheel.hooks.autotune.kernels.{name}]
template = "scale.cu.j2"
args = [
  {{ name = "x", dtype = "float32", shape = ["n"], intent = "in" }},
  {{ name = "y", dtype = "float32", shape = ["n"], intent = "out" }},
  {{ name = "n", dtype = "int32", value = "n" }},
]
key = {{ n = {{ buckets = [1024, 4096, 16384, 65536] }} }}
space = {{ BLOCK = [64, 128, 256], FACTOR = [2, 3] }}
default = {{ BLOCK = 128, FACTOR = 2 }}
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
"""


def two_kernel_project(path: Path) -> Path:
    root = write_tiny_project(path, template=SCALE_TEMPLATE.replace("{% if BAD %}", "{% if false %}"))
    text = (root / "pyproject.toml").read_text()
    text = text[: text.index("[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scale]")]
    (root / "pyproject.toml").write_text(text + TWO_KERNELS.format(name="ka") + "\n" + TWO_KERNELS.format(name="kb"))
    return root


CHILD_TUNE = """\
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from conftest import load_project
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.tuning import tune
from hatch_autotune.tuning.worker_client import WorkerClient
root, kernel, cache, start = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
project = load_project(root)
(start / kernel).touch()  # both runs start together, so each reads the lock before the other writes
deadline = time.monotonic() + 60
while len(list(start.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.005)
env = {{**os.environ, "FAKE_WORKER": json.dumps({{"sleep_ms": 5}})}}
summary = tune(project, kernels=[kernel], gpu_arch="sm_90", log=lambda line: None, cache=CompileCache(cache),
               client_factory=lambda device: WorkerClient({fake!r}, env=env))
print(len(summary.tuned))
"""


def test_two_tunes_of_different_kernels_at_once_keep_both_kernels_entries(tmp_path):
    """`tune --kernel ka` and `tune --kernel kb` at the same time, two processes: both exit 0 and
    the lock holds both kernels' entries (each write used to replace the whole file)."""
    root = two_kernel_project(tmp_path / "p")
    start = tmp_path / "start"
    start.mkdir()
    script = CHILD_TUNE.format(tests=str(HERE), fake=FAKE)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(root), k, str(tmp_path / f"cache-{k}"), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for k in ("ka", "kb")
    ]
    for p, out, err in outputs_of(procs, timeout=300):
        assert p.returncode == 0 and out.strip() == "4", err[-3000:]
    entries = json.loads((root / "autotune.lock.json").read_text())["entries"]
    assert sorted(entries) == sorted(f"{k}|-|sm_90|n={n}" for k in ("ka", "kb") for n in (1024, 4096, 16384, 65536))
    assert all(e["tuned"] for e in entries.values())
    assert not list(root.glob(".autotune.lock.json*")), list(root.iterdir())  # no sidecar left in the project


def test_tune_keeps_a_symlinked_lock_a_symlink(tmp_path):

    root = two_kernel_project(tmp_path / "p")
    (root / "locks").mkdir()
    target = root / "locks" / "shared.lock.json"
    target.write_bytes(lock_bytes({"other|-|sm_90|n=1": ENTRY}))
    (root / "autotune.lock.json").symlink_to(Path("locks") / "shared.lock.json")
    tune_over_fake_worker(root, tmp_path / "cache", kernels=["ka"])
    link = root / "autotune.lock.json"
    assert link.is_symlink() and os.readlink(link) == str(Path("locks") / "shared.lock.json")
    entries = json.loads(target.read_text())["entries"]
    assert "other|-|sm_90|n=1" in entries and "ka|-|sm_90|n=1024" in entries
    assert sorted(p.name for p in (root / "locks").iterdir()) == ["shared.lock.json"]


def test_a_run_never_overwrites_a_lock_a_newer_hatch_autotune_wrote_meanwhile(tmp_path):
    path = tmp_path / "autotune.lock.json"
    saver = LockSaver(LockFile(), path)  # the run started with no lock file
    newer = json.dumps({"schema": 99, "entries": {}}).encode()
    path.write_bytes(newer)  # meanwhile, a newer hatch-autotune wrote one
    saver.put("scale|-|sm_90|n=1", LockEntry.from_json(ENTRY))
    with pytest.raises(TuningError, match="lock file schema 99 is newer than"):
        saver.close()
    assert path.read_bytes() == newer


@pytest.mark.parametrize(
    "damage",
    [b'<<<<<<< HEAD\n{"schema": 1,\n=======\n', b'{"schema": 1, "entr', b'{"schema": "one", "entries": {}}', b'["not", "a", "lock"]'],
    ids=["merge-conflict", "half-copied", "bad-schema", "not-a-lock"],
)
def test_a_run_never_replaces_a_lock_damaged_meanwhile_with_its_own_entries_alone(tmp_path, damage):
    """A lock that became unreadable during a run (a `git pull` with a conflict, a half copy)
    still holds the other entries a user would resolve; the save stops rather than replace it."""
    path = tmp_path / "autotune.lock.json"
    path.write_bytes(lock_bytes({"scale|-|sm_90|n=1024": ENTRY}))
    saver = LockSaver(LockFile.load(path), path)
    path.write_bytes(damage)
    saver.put("scale|-|sm_90|n=1", LockEntry.from_json(ENTRY))
    with pytest.raises(TuningError, match=r"not overwriting it|lock file has no valid schema"):
        saver.close()
    assert path.read_bytes() == damage


def test_the_writers_lock_is_taken_again_when_its_holder_removed_the_sidecar(tmp_path):
    """A waiter on a sidecar its holder removed does not think it holds the lock: two writers
    holding it at once would be the lost update again."""
    from hatch_autotune.files import one_writer

    path = tmp_path / "autotune.lock.json"
    inside, order = threading.Lock(), []

    def writer(n):
        for _ in range(30):
            with one_writer(path):
                assert inside.acquire(blocking=False), "two writers at once"
                order.append(n)
                inside.release()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(order) == 120 and not list(tmp_path.iterdir())


def test_without_flock_writers_still_write_and_leave_no_sidecar(tmp_path, monkeypatch):
    import errno

    import hatch_autotune.files as files

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    path = tmp_path / "autotune.lock.json"
    LockFile.save_entries(path, {"scale|-|sm_90|n=1": LockEntry.from_json(ENTRY)})
    assert list(LockFile.load(path).entries) == ["scale|-|sm_90|n=1"]
    assert [p.name for p in tmp_path.iterdir()] == ["autotune.lock.json"]


# ---- #8: bucket values bounded -----------------------------------------------------------------


def test_a_5000_digit_bucket_is_a_malformed_entry_warning_in_the_build(tmp_path):
    path = tmp_path / "autotune.lock.json"
    path.write_bytes(lock_bytes({HUGE_BUCKET: ENTRY, "scale|-|sm_90|n=1024": ENTRY}))
    lock = LockFile.load(path)
    assert list(lock.entries) == ["scale|-|sm_90|n=1024"]  # the other entries are kept
    (warning,) = lock.warnings
    assert "is malformed" in warning and "ignoring it" in warning and len(warning) < 600, warning


def test_a_5000_digit_bucket_is_a_lock_format_error_for_the_command():
    with pytest.raises(LockFormatError, match="is malformed") as caught:
        LockFile.parse({"schema": 1, "entries": {HUGE_BUCKET: ENTRY}}, "a.json")
    assert len(str(caught.value)) < 600
    with pytest.raises(LockFormatError, match=r"is not 'kernel|types|arch|dim=value,...'"):
        EntryId.parse(HUGE_BUCKET)


@pytest.mark.parametrize("command", ["show", "diff", "merge"])
def test_show_diff_merge_report_a_5000_digit_bucket_in_one_line(tmp_path, capsys, monkeypatch, command):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "HATCH_AUTOTUNE_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_bytes(lock_bytes({HUGE_BUCKET: ENTRY}))
    good.write_bytes(lock_bytes({"scale|-|sm_90|n=1024": ENTRY}))
    argv = {
        "show": ["show", str(bad)],
        "diff": ["diff", str(good), str(bad)],
        "merge": ["merge", str(good), str(bad), "-o", str(tmp_path / "o.json")],
    }
    code = cli.main(argv[command])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hatch-autotune: error: "), err[:2000]
    assert "internal error" not in err and "is malformed" in err and len(lines[0]) < 800, err[:2000]


@pytest.mark.parametrize(
    ("bucket", "ok"),
    [(f"n={MAX_SIZE}", True), (f"n=-{MAX_SIZE}", True), (f"n={MAX_SIZE + 1}", False), ("n=" + "1" * 20, False), ("n=" + "0" * 4400, False)],
)
def test_bucket_values_are_bounded_by_the_key_range(bucket, ok):
    text = f"scale|-|sm_90|{bucket}"
    if ok:
        assert str(EntryId.parse(text)) == text
    else:
        with pytest.raises(LockFormatError):
            EntryId.parse(text)


# ---- properties: entry ids and entries ---------------------------------------------------------

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
PART = st.text(st.characters(blacklist_characters="|", blacklist_categories=("Cs",)), min_size=1, max_size=12)
NUMBER = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(4000, 5000).map(lambda n: "7" * n),  # past int()'s 4300-digit limit
    st.text("0123456789", min_size=1, max_size=40),
    st.text("²³١٢٣४५𝟙", min_size=1, max_size=5),  # unicode digits: int() takes some, the format not
    st.sampled_from(["", "-", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "1_000", "١"]),  # noqa: RUF001 (a digit int() takes)
)
BUCKET_TEXT = st.lists(st.tuples(st.one_of(IDENT, PART), st.sampled_from(["=", "==", ":", ""]), NUMBER), max_size=4).map(
    lambda items: ",".join(f"{k}{sep}{v}" for k, sep, v in items)
)
ENTRY_ID = st.one_of(
    st.tuples(st.one_of(IDENT, PART), PART, PART, BUCKET_TEXT, st.sampled_from(["|", ",", "||", ";"])).map(lambda t: t[4].join(t[:4])),
    st.text(max_size=30),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
ENTRY_VALUE = st.one_of(JSON, st.fixed_dictionaries({k: st.one_of(st.just(v), JSON) for k, v in ENTRY.items()}))


@FAST
@given(entries=st.dictionaries(ENTRY_ID, ENTRY_VALUE, max_size=4), schema=st.sampled_from([1, 1, 1, 0, 2, "1", True, None]))
def test_any_entry_ids_and_entries_are_kept_warned_about_or_refused_as_lock_format_errors(entries, schema):
    data = {"schema": schema, "entries": entries}
    try:
        lenient = LockFile.parse(data, "a.json", strict=False)
    except LockFormatError as exc:  # only for a newer schema
        assert schema == 2 and "is newer than" in str(exc)
        return
    readable = type(schema) is int and schema == 1
    assert len(lenient.entries) + len(lenient.warnings) == (len(entries) if readable else 1)
    for w in lenient.warnings:
        assert w.startswith("a.json: ") and len(w) < 1000
    for eid in lenient.entries:
        EntryId.parse(eid)  # what is kept has a valid id
    try:
        strict = LockFile.parse(data, "a.json", strict=True)
    except LockFormatError as exc:
        assert str(exc).startswith("a.json: ") and len(str(exc)) < 1000
    else:
        assert strict.entries.keys() == lenient.entries.keys() and not lenient.warnings


@FAST
@given(
    kernel=IDENT,
    types=PART,
    arch=PART,
    dims=st.lists(st.tuples(IDENT, st.integers(-MAX_SIZE, MAX_SIZE)), min_size=1, max_size=4, unique_by=lambda d: d[0]),
)
def test_entry_ids_round_trip(kernel, types, arch, dims):
    eid = EntryId.of(kernel, types, arch, dict(dims))
    assert EntryId.parse(str(eid)) == eid


def test_merge_writes_through_a_symlinked_output_and_never_over_a_pipe(tmp_path, capsys):
    """`merge -o` replaces what a link points to and keeps the link, as `tune` does; a named
    pipe given as the output is refused in one line rather than replaced by a regular file."""
    good = tmp_path / "good.json"
    good.write_bytes(lock_bytes({"scale|-|sm_90|n=1024": ENTRY}))
    target, link = tmp_path / "kept" / "autotune.lock.json", tmp_path / "autotune.lock.json"
    target.parent.mkdir()
    target.write_text("{}")
    link.symlink_to(target)
    assert cli.main(["merge", str(good), "-o", str(link)]) == 0
    assert link.is_symlink() and "scale|-|sm_90|n=1024" in json.loads(target.read_text())["entries"]
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    capsys.readouterr()
    assert cli.main(["merge", str(good), "-o", str(fifo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a named pipe, expected a regular file" in err[0] and fifo.is_fifo(), err
