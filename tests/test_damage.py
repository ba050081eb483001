"""Damage to what a build reads back from disk (compile-cache entries, the lock file) is a miss or
a warning: never a crash, never trusted. The build compiles again or ignores the file, and its
wheel is the clean build's, byte for byte. Real NVRTC compiles throughout; no GPU is needed."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import build, copy_example, write_lock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import CacheEntry, Resources
from hatch_autotune.compile.nvrtc import CompileJob, compile_all

RESOURCE_FIELDS = [f.name for f in fields(Resources)]
DEEP_LIST = b"[" * 100_000 + b"]" * 100_000
DEEP_DICT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
KEEP, REMOVE = "keep", "remove"  # what a damage does to a file besides replacing its bytes

TINY_KERNEL = """extern "C" __global__ void k(float* y) {
    __shared__ float t[64];
    t[threadIdx.x] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = t[63 - threadIdx.x];
}"""


# ---- helpers -----------------------------------------------------------------------------------


def dumps(value) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def seal(record: dict) -> dict:
    """`record` with a metadata_sha256 that matches it (the sha256 of the other fields as
    sorted-key JSON), so that a test reaches the rule it means and not only the checksum."""
    rest = {k: v for k, v in record.items() if k != "metadata_sha256"}
    return {**rest, "metadata_sha256": hashlib.sha256(dumps(rest)).hexdigest()}


def flip(data: bytes, i: int, mask: int) -> bytes:
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]


def replace_file(path: Path, content: bytes | str) -> None:
    """Make `path` hold `content` (KEEP: leave it, REMOVE: delete it), whatever is there now."""
    if content == KEEP:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if content != REMOVE:
        path.write_bytes(content)


def get_within(cache: CompileCache, key: str, seconds: float = 10):
    """cache.get, failing the test instead of hanging (a FIFO read would block) or raising."""
    box: dict = {}

    def run():
        try:
            box["value"] = cache.get(key)
        except BaseException as exc:  # reported below, with the damage that caused it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "get() hung"
    if "error" in box:
        raise AssertionError(f"get() raised {box['error']!r}")
    return box["value"]


def wrong_values(field: str, record: dict) -> list:
    """Values `field` must not hold in `record`, a valid entry's metadata."""
    generic = [None, True, False, 0, 1, -1, 1.5, "", "x", [], {}, [record[field]]]
    digest = record["binary_sha256"]
    resources = record["resources"]
    extra = {
        "schema": [2, 1.0, "1", True],  # True == 1 and 1.0 == 1 in Python: types are checked
        "key": [record["key"].upper(), record["key"][:-1], "0" * 64],
        "ok": [not record["ok"], "true"],
        "binary_sha256": (
            [digest.upper(), digest[:-1], hashlib.sha256(b"other").hexdigest(), hashlib.sha256(b"").hexdigest()]
            if digest
            else [hashlib.sha256(b"x").hexdigest()]
        ),
        "binary_size": [0, record["binary_size"] + 1, record["binary_size"] - 1, float(record["binary_size"])] if digest else [1],
        "metadata_sha256": [record["metadata_sha256"].upper(), hashlib.sha256(b"other").hexdigest()],
        "resources": (
            [{**resources, "extra": 0}, {k: v for k, v in resources.items() if k != "registers"}]
            + [{**resources, "registers": v} for v in (-1, True, 1.5, "1", None, [])]
            if resources
            else [dict.fromkeys(RESOURCE_FIELDS, 0)]  # a failed compile has no resource counts
        ),
    }.get(field, [])
    valid = {
        "log": lambda v: type(v) is str,
        "label": lambda v: type(v) is str,
        "resources": lambda v: v is None and record["ok"],  # a PTX entry has none
    }.get(field, lambda v: False)
    same = lambda v: type(v) is type(record[field]) and v == record[field]  # noqa: E731
    return [v for v in generic + extra if not valid(v) and not same(v)]


def content_damages(meta: bytes, binary: bytes | None) -> list[tuple[str, bytes | str, bytes | str]]:
    """(name, new metadata, new binary) for one entry: truncated, flipped, empty, JSON of another
    type, deeply nested, each field removed or of a wrong type (as found, and re-sealed so
    that the field's own rule decides), an unknown field, a damaged or missing binary."""
    record = json.loads(meta)
    out: list[tuple[str, bytes | str, bytes | str]] = [("metadata empty", b"", KEEP)]
    for n in sorted({1, 2, len(meta) // 4, len(meta) // 2, len(meta) - 2, len(meta) - 1}):
        out.append((f"metadata truncated to {n} bytes", meta[:n], KEEP))
    for i in range(0, len(meta), max(1, len(meta) // 80)):  # some 80 places, each field's included
        for mask in (0x01, 0x20, 0x80):
            out.append((f"metadata byte {i} ^ {mask:#04x}", flip(meta, i, mask), KEEP))
    for doc in ([], "x", 1, 1.5, None, True, {}, [record]):
        out.append((f"metadata is {doc!r:.30}", dumps(doc), KEEP))
    out += [("metadata nested 100000 deep", DEEP_LIST, KEEP), ("metadata objects nested 100000 deep", DEEP_DICT, KEEP)]
    out.append(("a field nested 100000 deep", b'{"ok": ' + DEEP_LIST + b"}", KEEP))
    for field in record:
        without = {k: v for k, v in record.items() if k != field}
        out.append((f"{field} removed", dumps(without), KEEP))
        for value in wrong_values(field, record):
            out.append((f"{field} = {value!r:.40}", dumps({**record, field: value}), KEEP))
            if field != "metadata_sha256":
                out.append((f"{field} = {value!r:.40} (re-sealed)", dumps(seal({**record, field: value})), KEEP))
        if field != "metadata_sha256":
            out.append((f"{field} removed (re-sealed)", dumps(seal(without)), KEEP))
    out.append(("an unknown field", dumps({**record, "extra": 1}), KEEP))
    out.append(("an unknown field (re-sealed)", dumps(seal({**record, "extra": 1})), KEEP))
    out.append(
        ("not sealed (metadata_sha256 removed, the old format)", dumps({k: v for k, v in record.items() if k != "metadata_sha256"}), KEEP)
    )
    if binary is not None:
        out += [("binary empty", KEEP, b""), ("binary removed", KEEP, REMOVE), ("binary with a byte appended", KEEP, binary + b"\0")]
        out += [(f"binary truncated to {n} bytes", KEEP, binary[:n]) for n in (1, len(binary) // 2, len(binary) - 1)]
        out += [(f"binary byte {i} ^ 0x01", KEEP, flip(binary, i, 0x01)) for i in (0, len(binary) // 2, len(binary) - 1)]
        empty = seal({**record, "binary_size": 0, "binary_sha256": hashlib.sha256(b"").hexdigest()})
        out.append(("an empty binary, named by its size and sha256 (re-sealed)", dumps(empty), b""))
    return out


# ---- entries from real compiles ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_entries(tmp_path_factory) -> dict[str, tuple[str, CacheEntry]]:
    """{'compiled': (key, entry), 'failed': (key, entry)}: a cubin with its resource counts and
    a compile error with its log, as compile_all stored them."""
    cache = CompileCache(tmp_path_factory.mktemp("real-entries"))
    ok, bad = compile_all([CompileJob(TINY_KERNEL, "sm_90", "k", label="tiny"), CompileJob("this_is_not_cuda(;", "sm_90", "k")], cache)
    assert ok.ok and ok.resources.shared_bytes == 256 and not bad.ok
    entries = {}
    for meta in cache.root.rglob("*.json"):
        entry = cache.get(meta.stem)
        entries["compiled" if entry.ok else "failed"] = (meta.stem, entry)
    assert entries["compiled"][1].binary == ok.binary and entries["failed"][1].log == bad.log
    return entries


@pytest.mark.parametrize("which", ["compiled", "failed"])
def test_every_damaged_entry_is_a_miss_and_put_repairs_it(real_entries, tmp_path, which):
    """A hit hands its binary and resource counts to the build unchecked: any damage must miss."""
    key, entry = real_entries[which]
    cache = CompileCache(tmp_path)
    cache.put(key, entry)
    meta_path, bin_path = cache._paths(key)
    meta = meta_path.read_bytes()
    assert set(json.loads(meta)) == {"schema", "key", "ok", "log", "label", "resources", "binary_size", "binary_sha256", "metadata_sha256"}
    assert bin_path.exists() == entry.ok
    damages = content_damages(meta, entry.binary)
    assert len(damages) > 100
    accepted = []
    for name, new_meta, new_bin in damages:
        replace_file(meta_path, new_meta)
        replace_file(bin_path, new_bin)
        if cache.get(key) is not None:
            accepted.append(name)
        cache.put(key, entry)
        assert cache.get(key) == entry, f"put did not repair the entry after: {name}"
    assert accepted == [], f"{len(accepted)} of {len(damages)} damaged entries were hits"
    assert cache.write_error is None


def _loop(path: Path) -> None:
    path.symlink_to(path.name)  # a link to itself: ELOOP


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # nobody writes: a plain read would block forever


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(1 << 36)  # 64 GiB, sparse: read whole, it would exhaust the memory


FILE_DAMAGES = {
    "a directory": Path.mkdir,
    "a symlink loop": _loop,
    "a FIFO": _fifo,
    "a link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "a 64 GiB sparse file": _huge,
}


@pytest.mark.parametrize("suffix", [".json", ".bin"])
@pytest.mark.parametrize("damage", list(FILE_DAMAGES))
def test_something_else_in_place_of_an_entry_file_is_a_miss(real_entries, tmp_path, damage, suffix):
    """What the store holds instead of a file is never read into memory, waited on or followed
    round a loop; put replaces it, except a directory, which it leaves (and says so)."""
    key, entry = real_entries["compiled"]
    cache = CompileCache(tmp_path)
    cache.put(key, entry)
    path = cache._paths(key)[0 if suffix == ".json" else 1]
    path.unlink()
    FILE_DAMAGES[damage](path)
    assert get_within(cache, key) is None
    cache.put(key, entry)
    if damage == "a directory":  # not hatch-autotune's to delete: a warning, and no more writes
        assert cache.write_error and "cannot write the compile cache" in cache.write_error
        assert get_within(cache, key) is None
        path.rmdir()
        cache = CompileCache(tmp_path)
        cache.put(key, entry)
    assert cache.get(key) == entry and cache.write_error is None


# ---- properties --------------------------------------------------------------------------------


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def metadata(draw, record: dict) -> tuple[bytes, dict | None]:
    """(bytes for the .json, the record they encode when it is a field-wise change of `record`):
    arbitrary bytes, arbitrary JSON, or `record` with fields dropped, replaced by arbitrary JSON
    or added, re-sealed or not."""
    kind = draw(st.sampled_from(["bytes", "json", "record"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)), None
    if kind == "json":
        return dumps(draw(JSON)), None
    changed = dict(record)
    for field in draw(st.lists(st.sampled_from([*sorted(record), "extra"]), max_size=3)):
        if draw(st.booleans()):
            changed.pop(field, None)
        else:
            changed[field] = draw(JSON)
    if draw(st.booleans()):
        changed = seal(changed)
    return dumps(changed), changed


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scratch")  # hypothesis reruns a test body: no per-call tmp_path


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_metadata_or_binary_makes_get_raise_or_return_a_binary_it_does_not_name(real_entries, scratch, data):
    """Whatever the files hold, get returns None or an entry exactly as its sealed record says."""
    key, entry = real_entries[data.draw(st.sampled_from(["compiled", "failed"]))]
    cache = CompileCache(scratch)
    cache.put(key, entry)
    meta_path, bin_path = cache._paths(key)
    original = json.loads(meta_path.read_bytes())
    meta, record = data.draw(metadata(original))
    meta_path.write_bytes(meta)
    if entry.ok and data.draw(st.booleans()):
        bin_path.write_bytes(data.draw(st.binary(max_size=64)))
    got = cache.get(key)
    if got is None:
        return
    assert record is not None and record == seal(record)  # only a sealed record can be a hit
    assert (got.ok, got.log, got.label, got.resources) == (record["ok"], record["log"], record["label"], record["resources"])
    if got.ok:
        assert got.binary == bin_path.read_bytes() and hashlib.sha256(got.binary).hexdigest() == record["binary_sha256"]
    else:
        assert got.binary is None and record["binary_sha256"] is None


@st.composite
def entries(draw) -> CacheEntry:
    ok = draw(st.booleans())
    counts = st.fixed_dictionaries({f: st.integers(min_value=0, max_value=1 << 40) for f in RESOURCE_FIELDS})
    return CacheEntry(
        ok=ok,
        log=draw(st.text(max_size=200)),
        label=draw(st.text(max_size=40)),
        resources=draw(st.none() | counts) if ok else None,
        binary=draw(st.binary(min_size=1, max_size=200)) if ok else None,
    )


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text("0123456789abcdef", min_size=64, max_size=64), entry=entries())
def test_get_returns_exactly_what_was_put(scratch, key, entry):
    """The reader's strictness refuses nothing the writer writes (any text, counts up to 2**40)."""
    cache = CompileCache(scratch)
    cache.put(key, entry)
    assert cache.get(key) == entry


def test_an_invalid_entry_cannot_be_made():
    """put never writes what get would refuse."""
    for bad in [
        dict(ok=True, binary=None),  # the audit's case: a success without its binary
        dict(ok=True, binary=b""),
        dict(ok=1, binary=b"x"),
        dict(ok=False, binary=b"x"),
        dict(ok=False, binary=None, resources=dict.fromkeys(RESOURCE_FIELDS, 0)),
        dict(ok=True, binary=b"x", resources={}),
        dict(ok=True, binary=b"x", resources={**dict.fromkeys(RESOURCE_FIELDS, 0), "registers": -1}),
        dict(ok=True, binary=b"x", log=None),
    ]:
        with pytest.raises(ValueError, match="not a valid compile cache entry"):
            CacheEntry(**{"log": "", "label": "", "resources": None, **bad})


# ---- whole builds of example_pkg ---------------------------------------------------------------


def build_wheel(src: Path, out: Path, cache_dir: Path) -> tuple[bytes, str]:
    """example_pkg's wheel, built offline by hatchling's WheelBuilder in this process: (its bytes,
    what the build printed)."""
    from hatchling.builders.wheel import WheelBuilder

    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(printed):
        mp.setenv("HATCH_AUTOTUNE_MODE", "offline")
        mp.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(cache_dir))
        mp.delenv("HATCH_AUTOTUNE_ARCHS", raising=False)
        (artifact,) = WheelBuilder(str(src)).build(directory=str(out), versions=["standard"])
    return Path(artifact).read_bytes(), printed.getvalue()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> SimpleNamespace:
    """example_pkg without a lock file, its wheel from a cold cache, and that cache."""
    tmp = tmp_path_factory.mktemp("clean")
    src = copy_example(tmp / "src", fp32_only=True)
    (src / "autotune.lock.json").unlink()  # the committed one (tuned on an H200); these builds start lockless
    wheel, printed = build_wheel(src, tmp / "out", tmp / "cache")
    assert "12 variant binaries compiled, 0 from the cache" in printed
    return SimpleNamespace(src=src, cache=tmp / "cache", wheel=wheel)


def test_a_build_over_a_damaged_cache_recompiles_and_gives_the_same_wheel(clean, tmp_path):
    """Every entry damaged, one way each in turn: all 12 compile again, the wheel is unchanged."""
    cache_dir = tmp_path / "cache"
    shutil.copytree(clean.cache, cache_dir)
    cache = CompileCache(cache_dir)
    metas = sorted(cache.root.rglob("*.json"))
    assert len(metas) == 12
    kinds = ["truncate", "flip", "empty", "wrong type", "missing binary", "null sha"]
    for n, meta_path in enumerate(metas):
        kind, bin_path, meta = kinds[n % len(kinds)], meta_path.with_suffix(".bin"), meta_path.read_bytes()
        if kind == "truncate":
            meta_path.write_bytes(meta[: len(meta) // 2])
        elif kind == "flip":
            meta_path.write_bytes(flip(meta, len(meta) // 3, 0x01))
        elif kind == "empty":
            meta_path.write_bytes(b"")
        elif kind == "wrong type":
            meta_path.write_bytes(b"[]")
        elif kind == "missing binary":
            bin_path.unlink()
        else:  # the audit's case: metadata that still parses, ok and no binary
            meta_path.write_bytes(dumps(seal({**json.loads(meta), "binary_sha256": None})))
    wheel, printed = build_wheel(clean.src, tmp_path / "out", cache_dir)
    assert "12 variant binaries compiled, 0 from the cache" in printed  # every damaged entry a miss
    assert wheel == clean.wheel
    assert build(clean.src, cache_dir).counts["compiled"] == 0  # and rewritten whole


def test_a_damaged_lock_file_is_a_warning_and_the_wheel_is_the_lockless_one(clean, tmp_path):
    """A damaged lock is ignored, never half-trusted: the wheel is the one built without a lock."""
    src = copy_example(tmp_path / "src", fp32_only=True)
    lock_path = src / "autotune.lock.json"
    write_lock(src, build(src, clean.cache), {"BLOCK": 512, "VEC": 2, "ITEMS": 2})
    intact = lock_path.read_bytes()
    tuned, _ = build_wheel(src, tmp_path / "out-intact", clean.cache)
    assert tuned != clean.wheel  # the intact lock is read: its winners ship
    for name, content in [
        ("truncated", intact[: len(intact) // 2]),
        ("a byte flipped", flip(intact, len(intact) // 2, 0x80)),
        ("empty", b""),
        ("a list", b"[]"),
        ("nested 100000 deep", DEEP_LIST),
    ]:
        lock_path.write_bytes(content)
        wheel, printed = build_wheel(src, tmp_path / f"out-{name}", clean.cache)
        assert f"hatch-autotune warning: {lock_path}: " in printed, name
        assert wheel == clean.wheel, name


BUILD_SCRIPT = """
import sys
from hatchling.builders.wheel import WheelBuilder
print(*WheelBuilder(sys.argv[1]).build(directory=sys.argv[2], versions=["standard"]))
"""


def test_four_builds_at_once_share_a_cold_cache(clean, tmp_path):
    """Writers racing on the same keys (pip builds in parallel, CI matrices on one cache) leave
    only whole entries: every wheel is the clean one and a fifth build compiles nothing."""
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "HATCH_AUTOTUNE_MODE": "offline", "HATCH_AUTOTUNE_CACHE_DIR": str(cache_dir), "HATCH_AUTOTUNE_JOBS": "1"}
    env.pop("HATCH_AUTOTUNE_ARCHS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_SCRIPT, str(clean.src), str(tmp_path / f"out{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-4000:]
        assert Path(out.strip()).read_bytes() == clean.wheel
    cache = CompileCache(cache_dir)
    metas = list(cache.root.rglob("*.json"))
    assert len(metas) == 12 and all(cache.get(m.stem) is not None for m in metas)
    assert not list(cache.root.rglob("*.tmp"))
    assert build(clean.src, cache_dir).counts == {"compiled": 0, "cached": 12, "failed": 0}
