"""Each on-disk format has one definition: the lock entry and its id (lock/) and the
selection table (runtime/table.py). Round trips, and the readers' refusals, newer schemas included."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hatch_autotune.lock import LOCK_SCHEMA, Bucket, EntryId, LockEntry, LockFile, LockFormatError, Measurement
from hatch_autotune.runtime import TABLE_SCHEMA, IntegrityError, Library, TableError, parse_table, table_bytes

ENTRY = {
    "checksum": "ab" * 32,
    "config": {"BLOCK": 128, "VEC": 4},
    "tuned": True,
    "index": 3,
    "default": {"BLOCK": 256, "VEC": 1},
    "default_ms": 0.02,
    "measurements": [
        {"index": 0, "config": {"BLOCK": 256, "VEC": 1}, "status": "ok", "samples": 5, "median_ms": 0.02, "spread_ms": 0.001},
        {"index": 3, "config": {"BLOCK": 128, "VEC": 4}, "status": "ok", "samples": 5, "median_ms": 0.01, "spread_ms": 0.001},
        {"index": 5, "config": {"BLOCK": 64, "VEC": 4}, "status": "eliminated", "samples": 1, "median_ms": 0.009},
        {"index": 7, "config": {"BLOCK": 32, "VEC": 1}, "status": "failed", "samples": 0, "reason": "CUDA_ERROR_ILLEGAL_ADDRESS"},
    ],
    "provenance": {"gpu": "NVIDIA H100", "cc": "9.0", "nvrtc": "13.0"},
}


def test_entry_id_round_trips_and_sorts_by_kernel():
    eid = EntryId.of("gemm", "T=float32", "sm_90", {"m": 1024, "n": 64, "k": 4096})
    assert str(eid) == "gemm|T=float32|sm_90|m=1024,n=64,k=4096"
    assert EntryId.parse(str(eid)) == eid and eid.bucket.as_dict() == {"m": 1024, "n": 64, "k": 4096}
    assert eid.instance == "gemm|T=float32|sm_90"
    assert EntryId.parse("saxpy|-|sm_80|n=-1").bucket.dims == (("n", -1),)


def test_a_bucket_has_one_type_and_converts_to_each_form():
    b = Bucket.from_values(["m", "n", "k"], [1024, 64, 4096])
    assert b == Bucket.of({"m": 1024, "n": 64, "k": 4096}) == Bucket.parse("m=1024,n=64,k=4096") == Bucket.of(b)
    assert str(b) == "m=1024,n=64,k=4096" and b.values == (1024, 64, 4096) and b.names == ("m", "n", "k")
    assert list(b.as_dict().items()) == [("m", 1024), ("n", 64), ("k", 4096)]  # in key order
    assert Bucket.of({"n": 1, "m": 2}) != Bucket.of({"m": 2, "n": 1})  # the order is the kernel's key order: part of the bucket
    with pytest.raises(ValueError):
        Bucket.from_values(["m", "n"], [1])
    with pytest.raises(LockFormatError, match=r"is not 'dim=value,...'"):
        Bucket.parse("m=1,n")


@pytest.mark.parametrize("bad", ["saxpy|-|sm_80", "saxpy|-|sm_80|n=x", "|-|sm_80|n=1", "saxpy|-|sm_80|n=1,", "a|b|c|d|e", 42, None])
def test_a_malformed_entry_id_is_refused_by_name(bad):
    with pytest.raises(LockFormatError, match=r"is not 'kernel|types|arch|dim=value,...'"):
        EntryId.parse(bad)


def test_lock_entry_round_trips_through_json():
    entry = LockEntry.from_json(json.loads(json.dumps(ENTRY)))
    assert entry.to_json() == ENTRY
    assert entry.winner_ms == 0.01  # the chosen config's fully timed median
    assert entry.time_of({"BLOCK": 64, "VEC": 4}) == 0.009  # only an eliminated run: its median
    assert entry.time_of({"BLOCK": 32, "VEC": 1}) is None  # failed: no time
    assert dataclasses.replace(entry, read_from=None).to_json() == ENTRY  # the typed records write what they read
    assert [m.status for m in entry.measurements] == ["ok", "ok", "eliminated", "failed"] and entry.measurements[2].spread_ms is None
    bare = LockEntry("c" * 64, {"B": 1}, tuned=False)
    assert LockEntry.from_json(bare.to_json()) == bare and bare.to_json() == {"checksum": "c" * 64, "config": {"B": 1}, "tuned": False}


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"checksum": None}, "no checksum"),
        ({"config": [1]}, "no config"),
        ({"tuned": "yes"}, "no tuned flag"),
        ({"index": "3"}, "index is not an integer"),
        ({"default": 5}, "default is not an object"),
        ({"provenance": []}, "provenance is not an object"),
        ({"measurements": [1, "x"]}, "measurements are not a list of objects with a config"),
        ({"default_ms": "fast"}, "default_ms is not a number"),
    ],
)
def test_a_malformed_lock_entry_names_what_is_wrong(change, problem):
    with pytest.raises(LockFormatError, match=problem):
        LockEntry.from_json({**ENTRY, **change})


def lock_json(entries: dict, schema=LOCK_SCHEMA) -> dict:
    return {"schema": schema, "entries": entries}


def test_lock_file_round_trips_byte_for_byte(tmp_path):
    path = tmp_path / "autotune.lock.json"
    path.write_bytes(LockFile.parse(lock_json({"k|-|sm_90|n=1": ENTRY}), "x").to_json())
    again = LockFile.load(path)
    assert again.to_json() == path.read_bytes() and not again.warnings
    assert json.loads(path.read_bytes()) == lock_json({"k|-|sm_90|n=1": ENTRY})


def test_the_strict_reader_refuses_what_the_build_reader_skips(tmp_path):
    data = lock_json({"k|-|sm_90|n=1": ENTRY, "not an id": ENTRY, "k|-|sm_90|n=2": {**ENTRY, "tuned": 1}})
    lenient = LockFile.parse(data, "lock.json", strict=False)
    assert list(lenient.entries) == ["k|-|sm_90|n=1"]
    assert lenient.warnings == [
        "lock.json: entry 'not an id' is malformed (entry id 'not an id' is not 'kernel|types|arch|dim=value,...'); ignoring it",
        "lock.json: entry 'k|-|sm_90|n=2' is malformed (no tuned flag); ignoring it",
    ]
    with pytest.raises(LockFormatError, match=r"lock.json: entry 'not an id' is malformed"):
        LockFile.parse(data, "lock.json")
    for foreign, why in (
        ([1], "not a hatch-autotune lock file"),
        ({"schema": 0, "entries": {}}, "schema 0 is not supported"),
        ({"schema": True, "entries": {}}, "no valid schema version"),
    ):
        assert (
            LockFile.parse(foreign, "f", strict=False).warnings[0].startswith("f: ")
            and why in LockFile.parse(foreign, "f", strict=False).warnings[0]
        )
        with pytest.raises(LockFormatError, match=why):
            LockFile.parse(foreign, "f")
    path = tmp_path / "bad.json"  # the command's file errors: tests/test_cli.py (read_json)
    for content in (b"\x80\x81", b"{"):
        path.write_bytes(content)
        assert "lock file is unreadable or not JSON" in LockFile.load(path).warnings[0]
    assert LockFile.load(tmp_path / "missing.json") == LockFile()


@pytest.mark.parametrize("strict", [True, False])
def test_both_lock_readers_refuse_a_newer_schema(strict):
    with pytest.raises(
        LockFormatError,
        match=rf"x.json: lock file schema {LOCK_SCHEMA + 1} is newer than this hatch-autotune .* reads \(schema {LOCK_SCHEMA}\); upgrade",
    ):
        LockFile.parse(lock_json({}, LOCK_SCHEMA + 1), "x.json", strict=strict)


TABLE = {"schema": TABLE_SCHEMA, "module": "pkg.kernels", "archs": ["sm_90"], "ptx": {}, "provenance": {}, "kernels": {}}


def test_the_table_round_trips_with_a_stable_layout():
    raw = table_bytes(TABLE)
    assert parse_table(raw, "t") == TABLE and table_bytes(parse_table(raw, "t")) == raw
    assert raw == table_bytes(dict(reversed(list(TABLE.items()))))  # key order does not change the bytes
    assert parse_table(TABLE, "t") is TABLE  # already-decoded JSON is checked, not copied


@pytest.mark.parametrize(
    "data, message",
    [
        (b"{", "t: corrupt selection table: not valid JSON"),
        (b"[]", "t: not a hatch-autotune selection table"),
        (json.dumps({**TABLE, "schema": "1"}), "t: selection table has no valid schema version"),
        (json.dumps({**TABLE, "schema": 0}), "t: selection table schema 0 is not supported"),
        (
            json.dumps({**TABLE, "schema": TABLE_SCHEMA + 1}),
            rf"t: selection table schema {TABLE_SCHEMA + 1} is newer than this reader understands \(schema {TABLE_SCHEMA}\); upgrade",
        ),
    ],
)
def test_the_table_reader_refuses_with_a_clear_message(data, message):
    with pytest.raises(TableError, match=message):
        parse_table(data, "t")


def test_the_runtime_refuses_a_table_of_a_newer_schema(tmp_path):
    (tmp_path / "table.json").write_bytes(table_bytes({**TABLE, "schema": TABLE_SCHEMA + 1}))
    with pytest.raises(IntegrityError, match=f"schema {TABLE_SCHEMA + 1} is newer than this reader understands"):
        Library.load(str(tmp_path))


def test_a_re_saved_lock_keeps_what_this_version_did_not_write(tmp_path):
    """The tuner re-saves the whole lock after every bucket: entries it did not tune keep their
    bytes (keys a newer writer added, ints, empty lists), and merge keeps a 0 ms winner."""
    odd = {
        "checksum": "c" * 64,
        "config": {"B": 1},
        "tuned": True,
        "default_ms": 2,
        "measurements": [],
        "provenance": {},
        "future_key": [1],
    }
    path = tmp_path / "autotune.lock.json"
    text = json.dumps(lock_json({"k|-|sm_90|n=1": odd}), sort_keys=True, indent=1) + "\n"
    path.write_text(text)
    lock = LockFile.load(path)
    lock.entries["k|-|sm_90|n=2"] = LockEntry("d" * 64, {"B": 2}, tuned=True)  # what a tuner adds
    lock.save(path)
    assert json.loads(path.read_text())["entries"]["k|-|sm_90|n=1"] == odd
    assert LockFile.load(path).entries["k|-|sm_90|n=1"].default_ms == 2 and isinstance(
        LockFile.load(path).entries["k|-|sm_90|n=1"].default_ms, int
    )
    changed = dataclasses.replace(lock.entries["k|-|sm_90|n=1"], config={"B": 3})  # a changed entry is written anew
    assert changed.to_json()["config"] == {"B": 3} and "future_key" not in changed.to_json()


def test_merge_prefers_the_faster_winner_even_at_zero_ms():
    from hatch_autotune.lock import merge

    def lock(config, ms):
        entry = LockEntry("c" * 64, config, tuned=True, measurements=(Measurement(0, config, "ok", 5, ms),))
        return LockFile(entries={"k|-|sm_90|n=1": entry})

    merged, resolved = merge([("a", lock({"B": 1}, 0.0)), ("b", lock({"B": 2}, 0.5))], prefer="faster")
    assert resolved == 1 and merged.entries["k|-|sm_90|n=1"].config == {"B": 1}
    merged, _ = merge([("a", lock({"B": 1}, 0.7)), ("b", lock({"B": 2}, 0.0))], prefer="faster")
    assert merged.entries["k|-|sm_90|n=1"].config == {"B": 2}


def test_a_measurement_reads_what_a_lenient_reader_accepted_as_not_recorded():
    """A lock entry's measurement needs only a config; what is absent or of the wrong type reads
    as not recorded (no time, no index), never as a crash."""
    m = Measurement.from_json({"config": {"B": 1}, "status": "ok", "median_ms": "fast", "index": True, "samples": "5"})
    assert (m.index, m.samples, m.median_ms, m.timed) == (None, None, None, False)
    assert Measurement.from_json({"config": {"B": 1}}).status == ""
    exact = Measurement(3, {"B": 1}, "ok", 5, 0.0123456789, 0.00012345678)
    assert exact.as_recorded().to_json() == {
        "index": 3,
        "config": {"B": 1},
        "status": "ok",
        "samples": 5,
        "median_ms": 0.012346,
        "spread_ms": 0.000123,
    }
