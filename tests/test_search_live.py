"""benchmarks/search_live.py's bookkeeping end to end without a GPU: the real `tune()` of
example_pkg's saxpy for every run, its worker tests/fake_worker.py (SYNTHETIC timings, a formula
of the config) and the re-timing replaced by the same formula. What a GPU run adds is the
measuring; what is checked here is what the runs are, which buckets each summary counts (the
warm runs' halves), and how winners and wall times are compared with exhaustive's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

pytestmark = pytest.mark.slow

PLAN = {"ms": {"BLOCK=64": 0.4, "BLOCK=1024": 0.3, "VEC=1": 0.2, "ITEMS=1": 0.1, "ITEMS=8": 0.15}, "sleep_ms": 2}


def synthetic_ms(config: dict) -> float:
    """tests/fake_worker.py's formula for PLAN."""
    return 1.0 + sum(PLAN["ms"].get(f"{k}={v}", 0.0) for k, v in config.items())


def test_search_live_runs_every_search_and_compares_each_winner_with_exhaustives(tmp_path, monkeypatch):
    from hatch_autotune.tuning.worker_client import WorkerClient

    module = load_benchmark("search_live")
    fake = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]
    monkeypatch.setattr(module, "require_gpu", lambda script: "sm_90")
    monkeypatch.setattr(module, "CLIENT_FACTORY", lambda device: WorkerClient(fake, env={**os.environ, "FAKE_WORKER": json.dumps(PLAN)}))
    retimed_configs: dict[str, set[str]] = {}

    def retime(arch, base, cache, kernels, winners):
        out = {}
        for eid, configs in winners.items():
            retimed_configs[eid] = set(configs)
            out[eid] = {c: {"ms": synthetic_ms(json.loads(c)), "spread_ms": 0.0} for c in configs}
        return out

    monkeypatch.setattr(module, "retime", retime)
    payload = module.main(["--kernel", "saxpy", "--seeds", "1", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "search_live.json").read_text())
    assert written["goals"] == payload["goals"] and written["machine"]["commit"]
    summaries = {s["name"]: s for s in written["summaries"]}
    searches = [f"{s} {b}" for s, b in module.SEARCHES]
    assert list(summaries) == ["exhaustive-cold (compiling)", *searches, "warm auto 5%", "warm auto 10%"]
    eids = set(written["runs"][1]["entries"])
    assert len(eids) == 6 and all(e.startswith("saxpy|") for e in eids)  # 2 types x 3 buckets
    assert summaries["exhaustive-cold (compiling)"]["worst"] == 1.0  # the same winners, timed the same
    for name in [*searches, "warm auto 5%", "warm auto 10%"]:
        s = summaries[name]
        rows = written["rows"][name]
        assert set(rows) == eids, name  # the warm runs' two halves cover every bucket once
        assert s["worst"] >= 1.0 and s["within_1.02"] <= 6
        assert s["configs_tried"] < s["configs_in_spaces"] == 6 * 57, name  # a share of each space
        assert s["search_ms_per_suggestion"] > 0
        for eid, row in rows.items():
            exhaustive_config = written["runs"][1]["entries"][eid]["config"]
            assert row["exhaustive_ms"] == synthetic_ms(exhaustive_config)
            assert row["ratio"] == pytest.approx(synthetic_ms(row["config"]) / synthetic_ms(exhaustive_config))
    assert summaries["random 5%"]["configs_tried"] < summaries["random 10%"]["configs_tried"]
    # every winner of every run is among those re-timed
    for run in written["runs"]:
        for eid, e in run["entries"].items():
            assert json.dumps(e["config"], sort_keys=True) in retimed_configs[eid]
    goal = summaries[module.GOAL_RUN]
    assert written["goals"] == {
        "auto 10%: worst winner <= 1.02x exhaustive's": goal["worst"] <= 1.02,
        "auto 10%: wall time <= 0.2x exhaustive's": goal["wall_ratio"] <= 0.2,
    }


def test_the_warm_halves_alternate_buckets_within_each_type_instance():
    module = load_benchmark("search_live")
    eids = [f"k|T=float32|sm_90|n={n}" for n in (4096, 64, 1024, 16384)] + ["k|T=float16|sm_90|n=64", "q|-|sm_90|m=1,n=2"]
    first, second = module.halves(eids)
    assert first | second == set(eids) and not first & second
    assert {e for e in first if "float32" in e} == {"k|T=float32|sm_90|n=64", "k|T=float32|sm_90|n=4096"}  # 64, 1024, 4096, 16384: 1st, 3rd
    assert "k|T=float16|sm_90|n=64" in first and "q|-|sm_90|m=1,n=2" in first  # a lone bucket: kept in the run that holds the other half
