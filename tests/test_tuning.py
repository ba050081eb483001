"""Tuning on the CPU: the decisions (pruning, search order, elimination, near-ties, stale
entries), the worker isolation with stand-in processes that really crash or hang, and a whole
`tune()` run with real NVRTC compiles writing the lock file.

No GPU here: the stand-in worker (fake_worker.py) returns SYNTHETIC timings derived from the
config; they exercise the logic, they are not measurements of anything."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import build, load_project, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import Resources
from hatch_autotune.declare.config import TuningSpec
from hatch_autotune.lock import LockEntry, LockFormatError, Runoff
from hatch_autotune.runtime import KernelDecl, LaunchDecl
from hatch_autotune.tuning import TuningError, tune
from hatch_autotune.tuning.bench import median, next_step, spread
from hatch_autotune.tuning.bucket import prune_reason
from hatch_autotune.tuning.choice import choose_winner, contenders, interval, measured, run_runoff
from hatch_autotune.tuning.protocol import Limits
from hatch_autotune.tuning.verify import compare, poison_byte, tolerance
from hatch_autotune.tuning.worker_client import WorkerClient, WorkerDied

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
LIMITS = Limits(max_threads_per_block=1024, max_registers_per_block=65536, max_shared_memory_per_block=49152)


def m(index, status="ok", ms=None, noise=0.0):
    samples = () if ms is None else tuple(ms + noise * (i - 2) for i in range(5))
    return measured(index, {"i": index}, status, samples)


# ---- decisions --------------------------------------------------------------------------------


def test_winner_is_the_fastest_median():
    assert choose_winner([m(0, ms=2.0), m(1, ms=1.0), m(2, ms=1.5)], default_index=0).index == 1


def test_near_ties_resolve_to_the_default_then_the_lowest_index():
    # 1.003 vs 1.000: within 0.5% -> a tie; the default (2) is among them
    assert choose_winner([m(0, ms=1.5), m(1, ms=1.0), m(2, ms=1.003)], default_index=2).index == 2
    # tie without the default: the lowest index wins, even if marginally slower
    assert choose_winner([m(0, ms=9.0), m(1, ms=1.004), m(3, ms=1.0)], default_index=0).index == 1
    # noisy measurements widen the tie band: 1.05 is within the spread of 1.0 +- 0.06
    assert choose_winner([m(0, ms=1.05, noise=0.06), m(1, ms=1.0, noise=0.06)], default_index=0).index == 0
    # a clear win is not a tie
    assert choose_winner([m(0, ms=1.1), m(1, ms=1.0)], default_index=0).index == 1


def test_rejected_failed_and_eliminated_never_win():
    ms = [m(0, "rejected", 0.1), m(1, "failed"), m(2, "eliminated", 0.5), m(3, ms=2.0)]
    assert choose_winner(ms, default_index=0).index == 3
    assert choose_winner([m(0, "failed"), m(1, "rejected", 1.0)], default_index=0) is None


def test_a_noisy_candidates_own_spread_does_not_make_it_a_tie():
    # the search's near-tie band is the leader's noise: a config whose five timings range from
    # 0.9 to 1.5 is not "as fast" as a steady 1.0 because its own spread is wide
    noisy, steady = measured(0, {"i": 0}, "ok", (0.9, 1.0, 1.2, 1.4, 1.5)), m(5, ms=1.0)
    assert choose_winner([noisy, steady], default_index=-1).index == 5
    assert choose_winner([steady, m(1, ms=1.004)], default_index=-1).index == 1  # within 0.5%: canonical
    assert choose_winner([steady, m(1, ms=1.004)], default_index=-1, by_spread=False).index == 1
    assert choose_winner([m(3, ms=1.0, noise=0.06), m(1, ms=1.05)], default_index=-1, by_spread=False).index == 3


def test_contenders_are_the_leader_and_the_configs_whose_intervals_overlap_its_own():
    leader = m(4, ms=1.0)
    close = m(2, ms=1.003)  # within the 0.5% floor of intervals
    noisy = measured(7, {"i": 7}, "ok", (0.6, 0.9, 1.3, 1.8, 2.0))  # median 1.3, but it could be faster
    far = m(1, ms=1.10)  # steady and 10% slower: no chance
    slow_noisy = measured(9, {"i": 9}, "ok", (5.0, 5.1, 5.2, 5.3, 5.4))
    eliminated = m(3, "eliminated", 0.99)  # stopped early: not a contender
    field = contenders([far, noisy, close, leader, slow_noisy, eliminated])
    assert [c.index for c in field] == [4, 7, 2]  # the leader, then by the lower end of the interval
    low, high = interval(noisy)
    assert low < 1.0 < high
    assert [c.index for c in contenders([far, noisy, close, leader], limit=2)] == [4, 7]
    assert contenders([m(0, "failed"), m(1, "rejected", 1.0)]) == []
    assert [c.index for c in contenders([leader, far])] == [4]


def test_the_runoff_times_contenders_interleaved_and_ships_the_truly_fastest():
    # config 1 was lucky in the search (0.95 in five timings); it really runs at 1.05, config 2 at 1.00
    truth = {1: 1.05, 2: 1.00, 3: 1.001}
    field = [m(1, ms=0.95), m(2, ms=0.99), m(3, ms=1.0)]
    calls = []

    def retime(i):
        calls.append(i)
        return tuple(truth[i] * (1 + 0.001 * k) for k in range(5))

    result = run_runoff(field, retime, rounds=4, default_index=-1)
    assert calls == [1, 2, 3, 2, 3, 1, 3, 1, 2, 1, 2, 3]  # each round every contender, the order rotated
    assert result.winner.index == 2 and result.winner.samples == 20
    # the record: the contenders fastest first, the margin to the runner-up, the rounds it won
    assert [c.index for c in result.record.contenders] == [2, 3, 1]
    assert result.record.contenders[2].search_ms == 0.95 and abs(result.record.contenders[2].median_ms - 1.05 * 1.002) < 1e-12
    assert abs(result.record.margin - 0.001) < 1e-6 and result.record.rounds_won == 4 and result.record.rounds == 4
    # with config 3 the default, the near-tie (0.1%) ships the default: the margin says so
    result = run_runoff(field, retime, rounds=4, default_index=3)
    assert result.winner.index == 3 and result.record.margin < 0


def test_a_contender_that_fails_in_the_runoff_is_recorded_failed_and_cannot_win():
    field = [m(1, ms=0.9), m(2, ms=0.91)]
    result = run_runoff(field, lambda i: "worker died (exit code -11)" if i == 1 else (1.0,) * 5, rounds=3, default_index=1)
    by_index = {x.index: x for x in result.measurements}
    assert result.winner.index == 2 and by_index[1].status == "failed" and "worker died" in by_index[1].reason
    assert result.record.margin is None and [c.index for c in result.record.contenders] == [2, 1]
    everyone_fails = run_runoff(field, lambda i: "hung", rounds=2, default_index=1)
    assert everyone_fails.winner is None and everyone_fails.record.rounds_won is None


def test_the_lock_keeps_the_runoff_record_and_refuses_a_malformed_one():
    field = [m(1, ms=1.0), m(2, ms=1.001)]
    record = run_runoff(field, lambda i: (1.0 + 0.01 * i,) * 5, rounds=2, default_index=-1).record
    entry = LockEntry(checksum="c", config={"i": 1}, tuned=True, index=1, runoff=record)
    again = LockEntry.from_json(json.loads(json.dumps(entry.to_json())))
    assert again.runoff == record and again.to_json()["runoff"]["margin"] == round(1.02 / 1.01 - 1, 6)
    raw = entry.to_json()
    raw["runoff"] = [1, 2]
    with pytest.raises(LockFormatError, match="runoff"):
        LockEntry.from_json(raw)
    raw["runoff"] = {"contenders": [{"index": "x", "median_ms": "fast"}], "rounds": True}  # lenient inside
    assert LockEntry.from_json(raw).runoff == Runoff(0, (Runoff.from_json({"contenders": [{}]}).contenders[0],), None)


def test_stopping_rules():
    s = TuningSpec(budget_ms=10.0, min_reps=5, max_reps=50, eliminate=0.25)
    assert next_step([1.0] * 4, s, leader_ms=0.1) == (False, False)  # too few samples to judge
    assert next_step([2.0] * 5, s, leader_ms=1.0) == (True, True)  # clearly slower: eliminated
    assert next_step([1.2, 1.3, 1.2, 1.25, 1.2], s, leader_ms=1.0) == (False, False)  # within 25%: go on
    assert next_step([3.0] * 5, s, leader_ms=None) == (True, False)  # budget (15 ms >= 10 ms) spent
    assert next_step([0.01] * 20, s, leader_ms=None) == (True, False)  # stable: no spread
    assert next_step([0.01 * (1 + (i % 2)) for i in range(49)], s, None) == (False, False)
    assert next_step([0.01] * 50, TuningSpec(max_reps=50), None) == (True, False)
    assert median([3, 1, 2]) == 2 and median([1, 2, 3, 4]) == 2.5 and spread([1, 2, 3, 4, 5, 6, 7, 8]) == 2.0
    # a CUDA graph's sample is one launch's share: the budget counts every launch of the graph
    wobbly = [0.3, 0.4, 0.3, 0.4, 0.3]
    assert next_step(wobbly, s, None) == (False, False) and next_step(wobbly, s, None, launches_per_sample=20) == (True, False)


def test_pruning_uses_compile_time_resources():
    configs = [{"B": 128}, {"B": 1024}, {"B": 256}, {"B": 64}, {"B": 32}, {"B": 2048}]
    res = [
        Resources(registers=32),
        Resources(registers=128),  # 128 x 1024 > 65536
        Resources(registers=40, shared_bytes=240_000),
        Resources(registers=40, spill_stores=8),
        None,  # did not compile
        Resources(registers=16),  # 2048 threads > 1024
    ]

    def prune(configs, res, block, shared, limits, prune_spills):
        reasons = {i: prune_reason(c, r, block, shared, limits, prune_spills) for i, (c, r) in enumerate(zip(configs, res))}
        return {i: r for i, r in reasons.items() if r}

    out = prune(configs, res, lambda c: c["B"], lambda c: 0, LIMITS, prune_spills=True)
    assert set(out) == {1, 2, 3, 4, 5}
    assert "> 49152" in out[2]  # the launcher does not opt in to more than 48 KiB
    assert "registers x 1024 threads" in out[1] and "shared memory" in out[2] and "spills" in out[3]
    assert out[4] == "did not compile" and "2048 threads per block" in out[5]
    assert 3 not in prune(configs, res, lambda c: c["B"], lambda c: 0, LIMITS, prune_spills=False)


def poisoned(like):
    """What the worker's cuMemsetD8Async leaves in an output buffer before a variant runs."""
    import numpy as np

    out = np.empty_like(like)
    out.view(np.uint8)[...] = poison_byte(like.dtype)
    return out


def test_verification():
    import numpy as np

    for dtype in (np.float16, np.float32, np.float64):
        assert np.isnan(poisoned(np.zeros(3, dtype))).all(), dtype  # one byte makes a NaN at every width

    ref = np.arange(10, dtype=np.float32)
    assert compare("y", ref + 1e-6, ref, *tolerance("float32")) is None
    reason = compare("y", np.where(np.arange(10) == 7, 0, ref).astype(np.float32), ref, *tolerance("float32"))
    assert reason.startswith("y: 1 element(s) differ (first at (7,)")
    unwritten = poisoned(ref)
    unwritten[:5] = ref[:5]
    assert "5 element(s) are NaN or unwritten, first at (5,)" in compare("y", unwritten, ref, *tolerance("float32"))
    ints = poisoned(np.zeros(4, np.int32))
    assert (ints.view(np.uint8) == 0x5A).all() and compare("k", ints, np.zeros(4, np.int32), *tolerance("int32"))
    half = ref.astype(np.float16)
    assert compare("h", half, ref.astype(np.float16), *tolerance("float16")) is None


def test_verification_over_chunks_counts_every_bad_element_and_names_the_first():
    """Outputs of hundreds of MB are compared chunk by chunk: counts and the first index must be
    those of the whole array, and a chunk that is bitwise the reference must still be checked
    for nothing else."""
    import numpy as np

    from hatch_autotune.tuning.verify import CHUNK

    ref = np.random.default_rng(1).standard_normal((3, CHUNK)).astype(np.float32)
    near = np.nextafter(ref, np.inf)  # one ulp off everywhere: inside float32's tolerance
    assert compare("y", near, ref, *tolerance("float32")) is None
    wrong = ref.copy()
    wrong[1, 5] += 1.0
    wrong[2, CHUNK - 1] += 1.0
    reason = compare("y", wrong, ref, *tolerance("float32"))
    assert reason.startswith("y: 2 element(s) differ (first at (1, 5): got ")
    unwritten = ref.copy()
    unwritten[2, 7:9] = np.nan
    unwritten[0, 3] += 1.0  # a difference too: the unwritten elements are reported first
    assert compare("y", unwritten, ref, *tolerance("float32")).startswith("y: 2 element(s) are NaN or unwritten, first at (2, 7)")
    inf_ref = ref.copy()
    inf_ref[0, 0] = np.inf
    assert compare("y", inf_ref, inf_ref.copy(), *tolerance("float32")) is None
    finite = inf_ref.copy()
    finite[0, 0] = 1e30  # a finite value where the reference is infinite is wrong at any rtol
    assert compare("y", finite, inf_ref, *tolerance("float32")).startswith("y: 1 element(s) differ (first at (0, 0)")
    f64 = ref.astype(np.float64)
    assert compare("d", f64 + 1e-9, f64, *tolerance("float64")).startswith(f"d: {3 * CHUNK} element(s) differ")
    assert tolerance("float32", (0.5, 0.5)) == (0.5, 0.5)


# ---- isolation: a stand-in worker process that really dies --------------------------------------


def client(plan: dict) -> WorkerClient:
    return WorkerClient(FAKE, env={**os.environ, "FAKE_WORKER": json.dumps(plan)})


def setup_msg(configs):
    return {"op": "setup", "configs": {f"v{i}": c for i, c in enumerate(configs)}}


def test_worker_crash_abort_fatal_and_hang_are_reasons_not_exceptions_for_the_parent():
    c = client({"crash": [{"B": 1}], "abort": [{"B": 2}], "hang": [{"B": 3}], "fatal": [{"B": 4}]})
    configs = [{"B": b} for b in range(6)]
    try:
        assert c.request({"op": "hello"}, 10)["ok"]
        c.request(setup_msg(configs), 10)
        assert c.request({"op": "measure", "variant": "v0"}, 10)["status"] == "ok"
        with pytest.raises(WorkerDied, match="crashed \\(signal SIGSEGV\\)"):
            c.request({"op": "measure", "variant": "v1"}, 10)
        assert not c.alive
        c.request(setup_msg(configs), 10)  # a fresh worker starts on the next request
        assert c.restarts == 1
        with pytest.raises(WorkerDied, match="crashed \\(signal SIGABRT\\): fake worker: abort requested"):
            c.request({"op": "measure", "variant": "v2"}, 10)
        c.request(setup_msg(configs), 10)
        with pytest.raises(WorkerDied, match="timed out after 1 s"):
            c.request({"op": "measure", "variant": "v3"}, 1.0)
        c.request(setup_msg(configs), 10)
        with pytest.raises(WorkerDied, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            c.request({"op": "measure", "variant": "v4"}, 10)
        c.request(setup_msg(configs), 10)
        assert c.request({"op": "measure", "variant": "v5"}, 10)["status"] == "ok"
        assert c.restarts == 4
    finally:
        c.close()


# ---- a whole tune() run: real NVRTC compiles, stand-in worker, the lock file written ------------


def _tune(root, tmp_path, plan, mode="tune"):
    logs: list[str] = []
    summary = tune(
        load_project(root),
        mode=mode,
        log=logs.append,
        gpu_arch="sm_90",
        client_factory=lambda device: client(plan),
        cache=CompileCache(tmp_path / "cache"),
    )
    return summary, logs


def test_tune_isolates_failures_and_writes_the_lock(tmp_path):
    root = write_tiny_project(tmp_path / "p", extra="[tool.hatch.build.targets.wheel.hooks.autotune.tuning]\ntimeout-s = 2")
    plan = {
        "base_ms": 1.0,
        "ms": {"BLOCK=64": 1.0, "BLOCK=128": 0.3, "FACTOR=3": 0.2},  # synthetic: BLOCK=256, FACTOR=2 is fastest
        "crash": [{"BLOCK": 64, "FACTOR": 3}],
        "hang": [{"BLOCK": 256, "FACTOR": 3}],
        "wrong": [{"BLOCK": 128, "FACTOR": 3}],
    }
    summary, logs = _tune(root, tmp_path, plan)
    assert len(summary.tuned) == 3  # the 3 buckets of sm_90 (sm_80 cannot be tuned on an sm_90 GPU)
    lock = json.loads((root / "autotune.lock.json").read_text())
    assert lock["schema"] == 1 and len(lock["entries"]) == 3
    entry = lock["entries"]["scale|-|sm_90|n=1024"]
    assert entry["tuned"] and entry["config"] == {"BLOCK": 256, "FACTOR": 2, "BAD": False}
    by_config = {(x["config"]["BLOCK"], x["config"]["FACTOR"]): x for x in entry["measurements"]}
    assert by_config[(64, 3)]["status"] == "failed" and "SIGSEGV" in by_config[(64, 3)]["reason"]
    assert by_config[(256, 3)]["status"] == "failed" and "timed out" in by_config[(256, 3)]["reason"]
    assert by_config[(128, 3)]["status"] == "rejected" and "wrong result" in by_config[(128, 3)]["reason"]
    assert by_config[(64, 2)]["status"] == "eliminated"  # 2.0 ms vs a 1.3 ms leader (+25%)
    assert by_config[(128, 2)]["reason"].startswith("reference")  # the default ran first
    assert entry["default_ms"] == pytest.approx(1.3, rel=0.01) and entry["default"] == {"BLOCK": 128, "FACTOR": 2, "BAD": False}
    assert entry["provenance"]["gpu"] == "Fake GPU (CPU stand-in)" and entry["provenance"]["nvrtc"]
    assert any(line.startswith("tuned scale|-|sm_90|n=1024: 6 configs") for line in logs)
    assert "tuning summary:" in logs[-1] and "1.30x" in logs[-1]

    # A build now takes the tuned winners for sm_90, defaults (with a warning) for sm_80.
    build_logs: list[str] = []
    result = build(root, tmp_path / "cache", build_logs)
    choices = result.kernels[0].choices
    assert all(c.tuned for (t, arch, p), c in choices.items() if arch == "sm_90")
    assert not any(c.tuned for (t, arch, p), c in choices.items() if arch == "sm_80")

    # Tuning again re-tunes nothing; after a template change, everything again.
    summary2, _logs2 = _tune(root, tmp_path, plan)
    assert summary2.tuned == [] and summary2.skipped == 3
    (root / "scale.cu.j2").write_text((root / "scale.cu.j2").read_text() + "// v2\n")
    summary3, _ = _tune(root, tmp_path, plan)
    assert len(summary3.tuned) == 3


def test_progress_within_a_bucket(tmp_path, monkeypatch):
    import hatch_autotune.tuning.bucket as bucket

    monkeypatch.setattr(bucket, "PROGRESS_EVERY", 2)
    root = write_tiny_project(tmp_path / "p")
    _, logs = _tune(root, tmp_path, {"ms": {"BLOCK=64": 1.0}})
    line = next(m for m in logs if "scale|-|sm_90|n=1024: 2/6 configs done" in m)
    assert "0 rejected or failed; best so far {'BLOCK': 128, 'FACTOR': 2, 'BAD': False} 1.0010 ms" in line


def test_retune_redoes_valid_entries(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    _tune(root, tmp_path, {})
    summary, _ = _tune(root, tmp_path, {}, mode="retune")
    assert len(summary.tuned) == 3 and summary.skipped == 0


def test_a_bucket_where_everything_fails_is_an_error(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    with pytest.raises(TuningError, match=r"scale\|-\|sm_90\|n=\d+: every variant failed.*SIGSEGV"):  # the costliest bucket runs first
        _tune(root, tmp_path, {"crash": [{"BAD": False}]})


def test_tune_refuses_without_a_matching_gpu(tmp_path, monkeypatch):
    root = write_tiny_project(tmp_path / "p")
    project = load_project(root)
    with pytest.raises(TuningError, match="the GPU here is sm_86 but the project's archs are sm_80, sm_90"):
        tune(project, gpu_arch="sm_86", log=lambda m: None)
    with pytest.raises(TuningError, match="never touches a GPU"):
        tune(project, mode="offline", gpu_arch="sm_90", log=lambda m: None)
    with pytest.raises(TuningError, match="no kernel named nope"):
        tune(project, kernels=["nope"], gpu_arch="sm_90", log=lambda m: None)
    import hatch_autotune.tuning.tuner as tuner

    monkeypatch.setattr(tuner, "detect_gpus", lambda: [])
    with pytest.raises(TuningError, match="needs a CUDA GPU"):
        tune(project, log=lambda m: None)


def test_devices_of_another_arch_are_not_used(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    logs: list[str] = []
    with pytest.raises(TuningError, match="no device of arch sm_80 answered"):
        tune(
            load_project(root),
            gpu_arch="sm_80",
            log=logs.append,
            client_factory=lambda d: client({}),
            cache=CompileCache(tmp_path / "cache"),
        )
    assert any("device 0 (Fake GPU (CPU stand-in), sm_90) is not sm_80; not using it" in m for m in logs)


def test_the_real_worker_speaks_the_protocol_without_a_gpu():
    from hatch_autotune.plan.devices import detect_gpu_arch

    real = WorkerClient()  # python -m hatch_autotune.tuning.worker
    try:
        reply = real.request({"op": "setup_everything"}, 30)
        assert reply["ok"] is False and "unknown op 'setup_everything'" in reply["error"]
        if detect_gpu_arch() is None:
            hello = real.request({"op": "hello", "device": 0}, 30)
            assert hello["ok"] is False and hello["error"]  # a clear error, not a crash
            assert real.alive
    finally:
        real.close()


def test_the_worker_protocol_messages_keep_their_wire_format():
    """The typed messages write the JSON lines the worker (and a replayed device, or a test's
    fake worker) read, and read back what they wrote."""
    from hatch_autotune.lock import Bucket
    from hatch_autotune.tuning.inputs import ArgRecipe, InputRecipe
    from hatch_autotune.tuning.protocol import (
        DeviceInfo,
        Failure,
        Hello,
        HelloReply,
        Measure,
        Measured,
        Prepare,
        Ready,
        Reference,
        Setup,
        parse_request,
    )

    settings = TuningSpec()
    recipe = InputRecipe(
        "scale",
        {"T": "float32"},
        {"n": 1024},
        7,
        (ArgRecipe("x", "float32", (1024,), "in", 0), ArgRecipe("a", "float32", None, "in", 2)),
        "/p",
    )
    decl = KernelDecl("scale", "scale_f32", "", (), (), {}, {}, LaunchDecl((["n", "n"],), (256,), 0))
    setup = Setup(
        decl,
        {"v1": {"BLOCK": 256}},
        {"T": "float32"},
        Bucket.of({"n": 1024}),
        recipe,
        {"y": (1e-4, 1e-5)},
        settings,
        comparers={"float32/float32": "/tmp/c.cubin"},
    )
    wire_recipe = {
        "kernel": "scale",
        "types": {"T": "float32"},
        "key": {"n": 1024},
        "seed": 7,
        "args": [
            {"name": "x", "dtype": "float32", "shape": [1024], "intent": "in", "position": 0, "key_dim": None},
            {"name": "a", "dtype": "float32", "shape": None, "intent": "in", "position": 2, "key_dim": None},
        ],
        "root": "/p",
        "generator": None,
        "reference": None,
        "constants": [],
        "computed": [],
    }
    wire = {
        "op": "setup", "name": "scale", "kernel": decl.to_json(), "configs": {"v1": {"BLOCK": 256}}, "binaries": {},
        "types": {"T": "float32"}, "key": {"n": 1024},
        "inputs": wire_recipe, "tolerances": {"y": [1e-4, 1e-5]}, "settings": dict(vars(settings)),
        "comparers": {"float32/float32": "/tmp/c.cubin"},
    }  # fmt: skip
    assert setup.to_json() == wire and list(setup.to_json()) == list(wire) and parse_request(json.loads(json.dumps(wire))) == setup
    assert Prepare(recipe).to_json() == {"op": "prepare", "inputs": wire_recipe} and parse_request(
        {"op": "prepare", "inputs": wire_recipe}
    ) == Prepare(recipe)
    assert Measure("v1", None, None, timed=False).to_json()["timed"] is False and "timed" not in Measure("v1").to_json()
    assert parse_request(Measure("v1", None, None, timed=False).to_json()) == Measure("v1", None, None, timed=False)
    assert Ready.from_json({"ok": True, "phases": {"inputs": 0.5}, "prefetched": True}) == Ready({"inputs": 0.5}, True)
    assert Ready.from_json({"ok": True}) == Ready()  # a worker that reports nothing (a test's fake, a replayed device)
    assert Failure("bad hook", kind="input").to_json() == {"ok": False, "error": "bad hook", "kind": "input"}
    assert Failure.from_json({"ok": False, "error": "bad hook", "kind": "input"}).kind == "input"
    assert Hello(1, False).to_json() == {"op": "hello", "device": 1, "flush_l2": False} and parse_request({"op": "hello"}) == Hello(0, True)
    assert Reference("v1", "/tmp/a.cubin").to_json() == {"op": "reference", "variant": "v1", "binary": "/tmp/a.cubin"}
    assert Measure("v1", "/tmp/a.cubin", 0.5).to_json() == {"op": "measure", "variant": "v1", "binary": "/tmp/a.cubin", "leader_ms": 0.5}
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        parse_request({"op": "nope"})
    device = {
        "name": "G",
        "cc": [9, 0],
        "driver": "13.0",
        "limits": {"max_threads_per_block": 1024, "max_registers_per_block": 65536, "max_shared_memory_per_block": 49152},
    }
    reply = HelloReply.from_json({"ok": True, "device": device})  # a worker of before the driver release: 'unknown'
    assert reply.device.arch == "sm_90" and isinstance(reply.device, DeviceInfo) and reply.device.driver_release == "unknown"
    device["driver_release"] = "580.159.04"
    reply = HelloReply.from_json({"ok": True, "device": device})
    assert reply.to_json() == {"ok": True, "device": device} and reply.device.driver_release == "580.159.04"
    timed = {"ok": True, "status": "ok", "samples": [1.0, 1.5], "phases": {"run": 0.1}}
    rejected = {"ok": True, "status": "rejected", "reason": "wrong result: y", "phases": {"run": 0.1, "verify": 0.2}}
    replayed = {"ok": True, "status": "eliminated", "samples": [2.0], "seconds": 0.25}
    assert Measured.from_json(timed).to_json() == timed and Measured.from_json(rejected).to_json() == rejected
    assert Measured.from_json(replayed).seconds == 0.25 and Measured.from_json(replayed).samples == (2.0,)
    assert Failure("boom", fatal=True).to_json() == {"ok": False, "fatal": True, "error": "boom"} and Failure.from_json(
        {"ok": False, "error": "x"}
    ) == Failure("x")


def test_the_driver_release_is_read_from_the_kernel_modules_version(tmp_path):
    """The provenance's driver release: the CUDA driver API says only its CUDA version."""
    from hatch_autotune.tuning.worker_state import driver_release

    proprietary = tmp_path / "p"
    proprietary.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  9 2025\nGCC version:  gcc 13\n")
    open_module = tmp_path / "o"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n")
    garbled = tmp_path / "g"
    garbled.write_text("something else entirely\n")
    assert driver_release(str(proprietary)) == "580.159.04"
    assert driver_release(str(open_module)) == "570.86.15"
    assert driver_release(str(garbled)) == "unknown"
    assert driver_release(str(tmp_path / "missing")) == "unknown"
