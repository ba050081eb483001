"""benchmarks/search_lock.py: example_pkg's exhaustive H200 lock replayed, each bucket alone and
in the tuner's waves; and what it refuses."""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

from hatch_autotune.lock import LockEntry, LockFile, Measurement

search_lock = load_benchmark("search_lock")  # its folder on sys.path and the checkout on PYTHONPATH undone
EXAMPLE = search_lock.EXAMPLE


def test_the_lock_replay_judges_what_each_search_ships_against_the_recorded_optimum(tmp_path):
    result = search_lock.main(["--out", str(tmp_path), "--seeds", "1", "--strategies", "random", "--jobs", "1"])
    assert json.loads((tmp_path / "search_lock_sm_90.json").read_text())["summaries"] == result["summaries"]
    assert result["buckets"] == 30 and result["seeds"] == {"dev": [0], "report": [100]}
    lock = LockFile.load(EXAMPLE / "autotune.lock.json")
    optimum = {
        eid: min(m.median_ms for m in e.measurements if m.status in search_lock.TIMED and m.median_ms)
        for eid, e in lock.entries.items()
        if "|sm_90|" in eid
    }
    assert len(result["runs"]) == 2 * 2 * 2  # halves x budgets x modes, one seed each
    for run in result["runs"]:
        assert set(run["buckets"]) == set(optimum)
        for b in run["buckets"].values():
            assert 1.0 <= b["found"] <= b["ratio"] < 10  # never better than the optimum, nor than the best it measured
    assert set(result["summaries"]["report"]) == {f"random|{b}|{m}" for b in ("5%", "10%") for m in ("alone", "waves")}
    rows = result["tables"]["report"].splitlines()
    assert len(rows) == 2 + 4 and rows[2].startswith("| random | 5% | alone | ")


def test_a_replayed_bucket_keeps_eliminated_configs_slower_and_failed_ones_failing():
    config = lambda b: {"B": b}  # noqa: E731
    entry = LockEntry(
        checksum="-",
        config=config(1),
        tuned=True,
        measurements=(
            Measurement(0, config(1), "ok", 20, 1.0, 0.01),
            Measurement(1, config(2), "eliminated", 5, 3.0, 0.1),
            Measurement(2, config(3), "failed", reason="crashed"),
        ),
    )
    data = search_lock.bucket_data("k|-|sm_90|n=1", entry, {"B": [1, 2, 3]}, [config(b) for b in (1, 2, 3)])
    assert data.fastest() == 0 and data.records[1].mean_ms == 3.0 and len(data.records[1].times) == search_lock.SAMPLES
    assert 2.5 < sum(data.records[1].times) / search_lock.SAMPLES < 3.5
    assert data.records[2].times == () and "crashed" in data.records[2].error


def test_an_entry_that_did_not_measure_its_whole_space_is_refused_by_name(tmp_path, capsys):
    lock = LockFile.load(EXAMPLE / "autotune.lock.json")
    eid = "saxpy|T=float32|sm_90|n=4096"
    e = lock.entries[eid]
    lock.entries[eid] = LockEntry(
        checksum=e.checksum, config=e.config, tuned=True, measurements=e.measurements[:3], provenance=e.provenance
    )
    lock.save(tmp_path / "partial.json")
    with pytest.raises(SystemExit) as exc:
        search_lock.main(["--lock", str(tmp_path / "partial.json"), "--out", str(tmp_path), "--seeds", "1"])
    assert f"{eid}: not every config of its space was measured" in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        search_lock.main(["--arch", "sm_75", "--out", str(tmp_path), "--seeds", "1"])
    assert "no entry of sm_75" in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        search_lock.main(["--lock", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
    assert "missing.json: no such lock file" in str(exc.value)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        search_lock.main(["--lock", str(tmp_path / "broken.json"), "--out", str(tmp_path)])
    assert "broken.json: lock file is unreadable or not JSON" in str(exc.value)
