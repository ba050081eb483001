"""The real tuning worker process, driven by the real `tune()`, over the driver stand-in with
emulated kernels (tests/standin_worker.py): an out-of-bounds variant ends failed with the
driver's illegal-address error, a wrong one is rejected by verification, a hanging one is killed
at its timeout, and the bucket still gets a verified winner in the lock file.

The worker's code runs unchanged: device setup, uploads and downloads, poisoned outputs, CUDA
event timing with the L2 flush, and its JSON protocol. Timings are SYNTHETIC (the emulator's)."""

from __future__ import annotations

import json

from conftest import tune_over_standin, write_tiny_project

from hatch_autotune import cli

EMULATED_TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:MODE={{ MODE }};FACTOR={{ FACTOR }};BLOCK={{ BLOCK }}";
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
{% if MODE == "oob" %}
    if (i < n) y[i + (1LL << 40)] = x[i];
{% elif MODE == "wrong" %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i] + 1.0f;
{% elif MODE == "hang" %}
    while (i < n) { }
{% elif MODE == "clobber" %}
    if (i < n) { y[i] = {{ FACTOR }}.0f * x[i]; ((float*)x)[i] = -1.0f; }
{% else %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i];
{% endif %}
}
"""


def test_tune_through_the_real_worker_fails_rejects_kills_and_still_picks_a_verified_winner(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=EMULATED_TEMPLATE, extra="tuning = { timeout-s = 4 }")
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", 'FACTOR = [2], MODE = ["ok", "oob", "wrong", "hang"] }')
    text = text.replace("BAD = false }", 'MODE = "ok" }')
    (root / "pyproject.toml").write_text(text)
    logs: list[str] = []
    summary = tune_over_standin(root, tmp_path / "cache", log=logs.append)
    assert len(summary.tuned) == 1
    eid, entry = summary.tuned[0]
    statuses = {(m.config["MODE"], m.config["BLOCK"]): m for m in entry.measurements}
    for block in (64, 128, 256):
        oob, wrong, hang, ok = (statuses[(mode, block)] for mode in ("oob", "wrong", "hang", "ok"))
        assert oob.status == "failed" and "CUDA_ERROR_ILLEGAL_ADDRESS" in oob.reason, oob
        assert wrong.status == "rejected" and "wrong result" in wrong.reason, wrong
        assert hang.status == "failed" and "timed out after 4 s" in hang.reason, hang
        assert ok.status in ("ok", "eliminated") and ok.samples >= 5, ok
    assert entry.config == {"BLOCK": 256, "FACTOR": 2, "MODE": "ok"}  # the fastest that verified
    lock = json.loads((root / "autotune.lock.json").read_text())
    assert lock["entries"][eid]["config"] == entry.config and lock["entries"][eid]["tuned"] is True
    assert lock["entries"][eid]["provenance"]["gpu"] == "Stand-in GPU 0 (sm_90)"
    tuned_line = next(line for line in logs if line.startswith("tuned "))
    assert "; worker inputs " in tuned_line and " run " in tuned_line and " verify " in tuned_line and " time " in tuned_line, tuned_line
    phases = lock["entries"][eid]["provenance"]["phases"]
    # a hang the cross-check ran into would add its 4 s timeout: below that, it was counted as measuring time (a
    # loaded 2-core machine takes up to ~2.5 s for the reference itself)
    assert phases["reference"] < 3.5, phases
    assert 0 <= phases["search"] <= phases["overhead"], phases  # the strategy's own time, a part of the fixed cost
    # what the run records beside the device: the run, the code that tuned, the settings, the search
    prov = lock["entries"][eid]["provenance"]
    assert prov["settings"]["timeout_s"] == 4 and prov["settings"]["runoff_rounds"] == 5, prov
    assert prov["code"].startswith("0.1.0 (git ") and " pid " in prov["run"] and prov["search"] == "strategy exhaustive", prov
    assert prov["driver_release"] == "unknown", prov  # the stand-in's host has no NVIDIA kernel module
    print("\n".join(logs))
    print(json.dumps([m.to_json() for m in entry.measurements], indent=None))


def test_every_variant_starts_from_the_bucket_inputs_even_after_one_overwrote_them(tmp_path):
    """The worker restores inputs from a pristine copy on the device before each variant: a
    variant that writes into its input (a bug the tuner must survive) is measured, and every
    correct variant after it still verifies against the reference."""
    root = write_tiny_project(tmp_path / "p", template=EMULATED_TEMPLATE)
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", 'FACTOR = [2], MODE = ["clobber", "ok"] }')
    text = text.replace("BAD = false }", 'MODE = "ok" }')
    (root / "pyproject.toml").write_text(text)
    summary = tune_over_standin(root, tmp_path / "cache")
    ((_eid, entry),) = summary.tuned
    order = [m.config["MODE"] for m in entry.measurements]
    assert "clobber" in order[: order.index("ok", order.index("clobber"))], order  # an ok variant runs after a clobbering one
    assert all(m.status in ("ok", "eliminated") for m in entry.measurements), entry.measurements


def timed_project(tmp_path, timing: str):
    """The emulated `scale` kernel with three kinds of variant (tests/standin_worker.py): `ok`
    (12-18 us by its block), `graphfast` (3 us launched from a CUDA graph, 30 us eagerly) and
    `cachefast` (5 us with a warm L2, 30 us cold), timed as `timing` declares."""
    root = write_tiny_project(tmp_path, template=EMULATED_TEMPLATE)
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", 'FACTOR = [2], MODE = ["ok", "graphfast", "cachefast"] }')
    text = text.replace("BAD = false }", f'MODE = "ok" }}\ntiming = {timing}')
    (root / "pyproject.toml").write_text(text)
    return root


def test_each_timing_mode_chooses_from_its_own_measurements(tmp_path, capsys):
    """The same variants tuned eager and cold (the default), eager and hot, in a graph hot and in a
    graph cold: each mode's winner is the one that is fastest run that way, its median the
    emulator's time for one launch (the graph's flushes subtracted), and the lock says how it
    was timed. The runoff timed in the same mode: every contender's runoff median agrees."""
    cases = [  # timing, the lock's words, the winner, its median, the medians of the two mode-dependent variants
        ("{ }", "eager launches, L2 cold", "ok", 0.012, (0.030, 0.030)),
        ('{ l2 = "hot" }', "eager launches, L2 hot", "cachefast", 0.005, (0.030, 0.005)),
        ('{ launches = "graph", l2 = "hot" }', "CUDA graph of 20 launches, L2 hot", "graphfast", 0.003, (0.003, 0.005)),
        ('{ launches = "graph", graph-launches = 4 }', "CUDA graph of 4 launches, L2 cold", "graphfast", 0.003, (0.003, 0.030)),
    ]
    for i, (timing, text, winner, median, (graphfast, cachefast)) in enumerate(cases):
        root = timed_project(tmp_path / f"p{i}", timing)
        summary = tune_over_standin(root, tmp_path / "cache")
        ((eid, entry),) = summary.tuned
        assert entry.config["MODE"] == winner, (timing, entry.config)
        assert abs(entry.winner_ms - median) < 1e-9, (timing, entry.winner_ms)
        lock = json.loads((root / "autotune.lock.json").read_text())
        assert lock["entries"][eid]["provenance"]["timing"] == text
        assert cli.main(["show", str(root / "autotune.lock.json")]) == 0
        assert f"timed with {text}: scale" in capsys.readouterr().out
        if winner != "ok":  # its blocks tie (`ok`'s do not): a runoff timed them again, in the same mode
            assert entry.runoff is not None and len(entry.runoff.contenders) == 3, (timing, entry.runoff)
            assert all(abs(c.median_ms - median) < 1e-9 for c in entry.runoff.contenders), (timing, entry.runoff)
        for mode, expected in (("graphfast", graphfast), ("cachefast", cachefast)):  # each timed in this mode, whatever its block
            medians = {m.median_ms for m in entry.measurements if m.config["MODE"] == mode}
            assert all(abs(m - expected) < 1e-9 for m in medians), (timing, mode, medians)


def test_graph_timing_captures_once_replays_and_destroys_in_order(tmp_path):
    """The worker's CUDA graph calls, as the stand-in driver saw them: per variant one capture
    (relaxed mode) of its launches (with a flush before each, cold), one instantiation, replays
    only after it, and every graph destroyed when the bucket ends; the flushes' own graph once."""
    root = timed_project(tmp_path / "p", '{ launches = "graph", graph-launches = 3 }')
    seen = tmp_path / "seen.json"
    tune_over_standin(root, tmp_path / "cache", env={"STANDIN_COUNT": str(seen)})
    calls = json.loads(seen.read_text())["graph_calls"]
    begins = [i for i, c in enumerate(calls) if c.startswith("cuStreamBeginCapture")]
    assert all(calls[i] == "cuStreamBeginCapture CU_STREAM_CAPTURE_MODE_RELAXED" for i in begins)
    ends = [calls[i + 1] for i in begins]
    variant_graphs = [e for e in ends if "kernel" in e]
    flush_graphs = [e for e in ends if "kernel" not in e]
    assert variant_graphs and all(e == "cuStreamEndCapture 6 nodes: memset kernel memset kernel memset kernel" for e in variant_graphs)
    assert flush_graphs == ["cuStreamEndCapture 3 nodes: memset memset memset"]  # made once, for every variant
    for i in begins:  # each capture is instantiated before any replay of it
        assert calls[i + 2].startswith("cuGraphInstantiate")
    launched = {c.split()[1] for c in calls if c.startswith("cuGraphLaunch")}
    instantiated = [calls[i + 2] for i in begins]
    assert len(launched) == len(instantiated)
    destroyed = [c for c in calls if c.startswith(("cuGraphExecDestroy", "cuGraphDestroy"))]
    assert len(destroyed) == 2 * len(variant_graphs)  # the bucket's graphs; the flushes' live as long as the worker
    assert calls.index(destroyed[0]) > max(i for i, c in enumerate(calls) if c.startswith("cuGraphLaunch"))
