"""benchmarks/search_cost.py end to end on tiny spaces: every strategy but exhaustive is timed on
every space, the result file has the structure the README describes, and every time is a
positive, finite number of milliseconds."""

from __future__ import annotations

import json
import math

from conftest import load_benchmark

from hatch_autotune.tuning import search

TINY = {
    "tiny": {"block_x": [16, 32, 64, 128], "block_y": [1, 2, 4, 8], "tile_x": [1, 2, 3, 4, 6]},
    "small": {"block_x": [16, 32, 64, 128, 256], "block_y": [1, 2, 4, 8], "tile_x": [1, 2, 3, 4, 6], "stages": [1, 2, 3]},
}


def test_search_cost_quick_on_tiny_spaces(tmp_path, monkeypatch):
    module = load_benchmark("search_cost")
    monkeypatch.setattr(module, "SPACES", TINY)
    monkeypatch.setattr(module, "QUICK_SUGGESTIONS", {"tiny": 20, "small": 30})
    payload = module.main(["--quick", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "search_cost_cpu.json").read_text())
    assert written["goal_met"] == payload["goal_met"] and written["quick"] is True
    names = [s for s in search.STRATEGIES if s != "exhaustive"]
    assert written["strategies"] == names and written["reps"] >= 3
    assert written["machine"]["commit"] and written["commit"]
    assert set(written["spaces"]) == set(TINY)
    for size, axes in TINY.items():
        info = written["spaces"][size]
        assert 0 < info["configs"] < info["product"] == math.prod(len(v) for v in axes.values())  # the constraint removed some
        assert info["build_ms"] > 0 and math.isfinite(info["build_ms"])
        assert set(written["results"][size]) == set(names)
        for name, row in written["results"][size].items():
            assert row["suggestions"] == info["suggestions"], (size, name)
            assert row["deterministic"], (size, name)  # the same seed suggested the same configs each repetition
            assert len(row["mean_ms_reps"]) == written["reps"]
            for key in ("mean_ms", "median_ms", "p95_ms", "max_ms", "max_call_ms", "ask_ms", "tell_ms", "mean_with_upcoming_ms"):
                assert row[key] > 0 and math.isfinite(row[key]), (size, name, key, row[key])
            assert row["median_ms"] <= row["p95_ms"] <= row["max_ms"]
            assert row["mean_ms"] <= row["mean_with_upcoming_ms"]
            assert row["goal_met"] == (row["mean_with_upcoming_ms"] <= written["goal_ms"])
            assert f"| {size} | {info['configs']:,} | {name} |" in written["table"]
        for runs in written["runs"][size].values():
            assert len(runs) == written["reps"]
