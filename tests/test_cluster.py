"""Tuning spread over several GPUs: the scheduler both engines share (schedule.py), this
machine's GPUs (tuner.py) and a Ray cluster (ray_engine.py).

No GPU here. The Ray tests start REAL local Ray clusters (ray.cluster_utils.Cluster, every node
on 127.0.0.1) whose nodes declare logical GPUs and an arch resource, and each actor runs the
stand-in worker process (fake_worker.py: SYNTHETIC timings, really crashes and hangs). Nodes are
removed mid-run to check what a lost node costs."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import load_project, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.plan.devices import Gpu
from hatch_autotune.tuning import TuningError, tune
from hatch_autotune.tuning.schedule import Job, SlotLost, run_schedule
from hatch_autotune.tuning.worker_client import WorkerClient

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
CC = {"sm_80": [8, 0], "sm_90": [9, 0]}
# crashes (SIGSEGV) and hangs past timeout-s inside the worker, wherever it runs
TROUBLE = {"crash": [{"BLOCK": 256, "FACTOR": 3}], "hang": [{"BLOCK": 64, "FACTOR": 3}], "ms": {"BLOCK=64": -0.3, "FACTOR=3": 0.2}}
TIMEOUT = "[tool.hatch.build.targets.wheel.hooks.autotune.tuning]\ntimeout-s = 2"


def fake_plan(arch: str, **extra) -> dict:
    return {**TROUBLE, "cc": CC[arch], **extra}


def project(path: Path, archs: str = '["sm_80", "sm_90"]') -> Path:
    root = write_tiny_project(path, extra=TIMEOUT)
    text = (root / "pyproject.toml").read_text().replace('archs = ["sm_80", "sm_90"]', f"archs = {archs}")
    (root / "pyproject.toml").write_text(text)
    return root


def comparable(lock: LockFile) -> dict:
    """The lock's entries without the tuning date and run (two runs differ in nothing else here)."""
    out = {}
    for eid, entry in lock.entries.items():
        raw = entry.to_json()
        raw["provenance"] = {k: v for k, v in raw["provenance"].items() if k not in ("date", "run", "phases")}  # when, which run, how long
        out[eid] = raw
    return out


def local_tune(root: Path, cache: Path, devices: dict[int, str], logs: list[str] | None = None, **plan) -> LockFile:
    """The local engine on stand-in devices (ordinal -> arch), one worker each."""
    gpus = [Gpu(d, arch, f"Fake {arch}") for d, arch in devices.items()]
    factory = lambda d: WorkerClient(FAKE, env={**os.environ, "FAKE_WORKER": json.dumps(fake_plan(devices[d], **plan))})  # noqa: E731
    log = logs.append if logs is not None else (lambda m: None)
    tune(load_project(root), gpus=gpus, client_factory=factory, cache=CompileCache(cache), log=log)
    return LockFile.load(root / "autotune.lock.json")


# ---- the scheduler ---------------------------------------------------------------------------


class ScriptedSlot:
    """A slot whose behaviour per job is scripted: 'lost' (its actor died), 'fail', else a result.
    `depth` 2 queues like a Ray actor: `started` records each hand-over, `ran` each job it ran."""

    def __init__(self, name: str, arch: str, script: dict[str, str] | None = None, delay: float = 0.01, depth: int = 1):
        self.name, self.arch, self.script, self.delay, self.depth = name, arch, script or {}, delay, depth
        self.ran: list[str] = []
        self.finished = 0
        self.started: list[tuple[str, int]] = []  # (job, how many of its jobs had finished then)
        self.dead = False

    def start(self, job: Job):
        self.started.append((job.eid, self.finished))
        return lambda: self._run(job)

    def _run(self, job: Job) -> LockEntry:
        if self.dead:  # an actor's queued calls fail with it
            raise SlotLost(f"{self.name} died")
        self.ran.append(job.eid)
        time.sleep(self.delay)
        what = self.script.get(job.eid)
        if what == "lost":
            self.dead = True
            raise SlotLost(f"{self.name} died")
        if what == "fail":
            raise TuningError(f"{job.eid}: every variant failed")
        self.finished += 1
        return LockEntry(checksum="c", config={"slot": self.name}, tuned=True)


def jobs(arch: str, n: int) -> list[Job]:
    return [Job(f"k|-|{arch}|n={i}", arch) for i in range(n)]


def test_each_job_runs_once_on_a_slot_of_its_arch():
    slots = [ScriptedSlot("a", "sm_80"), ScriptedSlot("b", "sm_90"), ScriptedSlot("c", "sm_90")]
    done: dict[str, str] = {}
    result = run_schedule(jobs("sm_80", 4) + jobs("sm_90", 6), slots, lambda j, e, s: done.setdefault(j.eid, s.name), log=lambda m: None)
    assert sorted(done) == sorted(j.eid for j in jobs("sm_80", 4) + jobs("sm_90", 6))
    assert all(done[j.eid] == "a" for j in jobs("sm_80", 4)) and {done[j.eid] for j in jobs("sm_90", 6)} == {"b", "c"}
    assert not result.lost and sum(s.jobs for s in result.slots) == 10


def test_the_job_of_a_lost_slot_goes_to_another_slot_of_its_arch():
    first = jobs("sm_90", 3)[0].eid
    dying = ScriptedSlot("dying", "sm_90", {first: "lost"})
    slots = [dying, ScriptedSlot("ok", "sm_90", delay=0.05)]
    done: dict[str, str] = {}
    logs: list[str] = []
    result = run_schedule(jobs("sm_90", 3), slots, lambda j, e, s: done.setdefault(j.eid, s.name), log=logs.append)
    assert done == {j.eid: "ok" for j in jobs("sm_90", 3)} and dying.ran == [first]  # the lost slot takes nothing more
    assert not result.lost and result.slots[0].lost == "dying died"
    assert any(f"{first} goes back to the queue" in m for m in logs)


def test_retries_are_bounded_and_what_no_slot_finished_is_reported_lost():
    eid = jobs("sm_90", 1)[0].eid
    slots = [ScriptedSlot(f"s{i}", "sm_90", {eid: "lost"}) for i in range(4)] + [ScriptedSlot("other", "sm_80")]
    result = run_schedule(jobs("sm_90", 1) + jobs("sm_80", 2), slots, lambda j, e, s: None, log=lambda m: None, retries=2)
    assert list(result.lost) == [eid] and result.lost[eid].count("died") == 3  # the first try and 2 retries
    assert sum(s.jobs for s in result.slots) == 2  # the sm_80 jobs are unaffected
    # every slot of an arch gone: its jobs are lost, each with the reason
    result = run_schedule(
        jobs("sm_90", 3), [ScriptedSlot("only", "sm_90", {jobs("sm_90", 3)[0].eid: "lost"})], lambda j, e, s: None, log=lambda m: None
    )
    assert sorted(result.lost) == sorted(j.eid for j in jobs("sm_90", 3))
    assert "no sm_90 GPU was left" in result.lost[jobs("sm_90", 3)[2].eid]


def test_the_costliest_jobs_go_first():
    order: list[str] = []
    costly = [Job(f"k|-|sm_90|n={i}", "sm_90", cost=c) for i, c in enumerate([1, 5, 3, 5, 2])]
    run_schedule(costly, [ScriptedSlot("a", "sm_90", delay=0)], lambda j, e, s: order.append(j.eid), log=lambda m: None)
    assert order == [f"k|-|sm_90|n={i}" for i in (1, 3, 2, 4, 0)]  # equal costs keep their order


def test_a_queueing_slot_gets_its_next_job_before_the_running_one_ends_but_not_the_last_ones():
    queued = ScriptedSlot("ray", "sm_90", depth=2)
    plain = ScriptedSlot("local", "sm_90", depth=1)
    result = run_schedule(jobs("sm_90", 12), [queued, plain], lambda j, e, s: None, log=lambda m: None)
    assert not result.lost and sorted(queued.ran + plain.ran) == sorted(j.eid for j in jobs("sm_90", 12))
    assert [done for _, done in queued.started[:2]] == [0, 0]  # the second was handed over before the first finished
    assert all(done == i for i, (_, done) in enumerate(plain.started))  # depth 1: one at a time
    assert result.slots[1].jobs == len(plain.ran) and result.slots[1].idle_s >= 0
    # alone: one queued behind the running one while more than one waits; the last waits for a free slot
    alone = ScriptedSlot("ray", "sm_90", depth=2)
    run_schedule(jobs("sm_90", 4), [alone], lambda j, e, s: None, log=lambda m: None)
    assert alone.started == [(j.eid, done) for j, done in zip(jobs("sm_90", 4), [0, 0, 1, 3])]


def test_the_jobs_queued_on_a_lost_slot_go_back_and_only_the_running_one_counts_a_try():
    first = jobs("sm_90", 6)[0].eid
    dying = ScriptedSlot("dying", "sm_90", {first: "lost"}, depth=2)
    ok = ScriptedSlot("ok", "sm_90", delay=0.03)
    logs: list[str] = []
    result = run_schedule(jobs("sm_90", 6), [dying, ok], lambda j, e, s: None, log=logs.append, retries=0)
    queued_behind = dying.started[1][0]
    assert dying.ran == [first] and queued_behind != first
    assert list(result.lost) == [first]  # retries=0: the one it ran is lost, with why
    assert queued_behind in ok.ran and sorted(ok.ran) == sorted(j.eid for j in jobs("sm_90", 6) if j.eid != first)
    assert any(f"{first} lost after 1 tries" in m for m in logs)


def test_a_job_that_fails_by_itself_stops_the_run():
    bad = jobs("sm_90", 8)[1].eid
    slots = [ScriptedSlot("a", "sm_90", {bad: "fail"}), ScriptedSlot("b", "sm_90", {bad: "fail"})]
    with pytest.raises(TuningError, match="every variant failed"):
        run_schedule(jobs("sm_90", 8), slots, lambda j, e, s: None, log=lambda m: None)
    assert len(slots[0].ran) + len(slots[1].ran) < 8  # nothing new starts after the failure


# ---- this machine's GPUs ----------------------------------------------------------------------


def test_several_local_gpus_give_the_lock_one_gpu_gives(tmp_path):
    one = local_tune(project(tmp_path / "one"), tmp_path / "cache", {0: "sm_90", 1: "sm_80"})
    four = local_tune(project(tmp_path / "four"), tmp_path / "cache", {0: "sm_90", 1: "sm_80", 2: "sm_90", 3: "sm_80"})
    assert len(one.entries) == 6 and comparable(one) == comparable(four)
    entry = one.entries["scale|-|sm_90|n=1024"]
    statuses = {json.dumps(m.config, sort_keys=True): m for m in entry.measurements}
    assert statuses['{"BAD": false, "BLOCK": 256, "FACTOR": 3}'].status == "failed"  # the crash
    assert "timed out" in statuses['{"BAD": false, "BLOCK": 64, "FACTOR": 3}'].reason  # the hang
    assert entry.config == {"BLOCK": 64, "FACTOR": 2, "BAD": False}


def test_a_budgeted_search_tunes_in_waves_from_the_middle_bucket_and_any_number_of_gpus_gives_one_lock(tmp_path):
    """Within a budget, an instance's buckets are tuned in waves (warm.transfer_waves): the bucket
    in the middle of the key space first, then the others, each measuring that one's winner
    right after the default (its warm start, fixed when its wave starts). Whichever GPU finishes
    first, the lock is the one a single GPU writes."""
    locks, logs = [], []
    for name, devices in (("one", {0: "sm_90", 1: "sm_80"}), ("four", {0: "sm_90", 1: "sm_80", 2: "sm_90", 3: "sm_80"})):
        root = project(tmp_path / name)
        (root / "pyproject.toml").write_text(
            (root / "pyproject.toml").read_text() + 'search = { strategy = "random", budget = 2, seed = 6 }\n'
        )
        logs.append([])
        locks.append(local_tune(root, tmp_path / "cache", devices, logs=logs[-1]))
    assert len(locks[0].entries) == 6 and comparable(locks[0]) == comparable(locks[1])
    assert sum(m == "tuning: wave 1 of 2, 2 bucket(s)" for m in logs[0]) == 1  # the middle bucket of each arch
    assert sum(m == "tuning: wave 2 of 2, 4 bucket(s), warm-started from the waves before" for m in logs[0]) == 1
    default = {"BAD": False, "BLOCK": 128, "FACTOR": 2}
    middle = {arch: locks[0].entries[f"scale|-|{arch}|n=65536"].config for arch in ("sm_80", "sm_90")}
    assert middle["sm_80"] == {"BAD": False, "BLOCK": 64, "FACTOR": 2}  # the fastest (the fake's times), its 2nd try with seed 6
    for arch in ("sm_80", "sm_90"):
        for n in (1024, 1048576):
            timed = [m.config for m in locks[0].entries[f"scale|-|{arch}|n={n}"].measurements if m.status == "ok"]
            assert len(timed) == 2 and default in timed and middle[arch] in timed  # the default and the middle's winner
    # without warm starts, one wave: every bucket measures the default and a random config
    root = project(tmp_path / "cold")
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml").read_text() + 'search = { strategy = "random", budget = 2, seed = 6, warm-start = false }\n'
    )
    cold_logs: list[str] = []
    local_tune(root, tmp_path / "cache", {0: "sm_90", 1: "sm_80"}, logs=cold_logs)
    assert not any("tuning: wave" in m for m in cold_logs)


def test_the_lock_is_saved_behind_the_run_and_complete_when_it_ends(tmp_path):
    from hatch_autotune.tuning.lock_writer import LockSaver

    path = tmp_path / "autotune.lock.json"
    lock = LockFile()
    saver = LockSaver(lock, path)
    entries = {f"scale|-|sm_90|n={i + 1}": LockEntry(checksum=f"c{i}", config={"BLOCK": 64}, tuned=True) for i in range(200)}
    for eid, entry in entries.items():
        saver.put(eid, entry)
    saver.close()
    assert LockFile.load(path).entries == entries == lock.entries
    assert not list(tmp_path.glob("*.tmp*"))  # atomic writes leave nothing behind


def test_a_lock_that_cannot_be_saved_stops_the_run_with_the_reason(tmp_path, monkeypatch):
    """A full disk (simulated: root writes anywhere here) stops the run at its next bucket."""
    import hatch_autotune.lock.file as lock_mod

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lock_mod, "atomic_write", full)
    root = project(tmp_path / "p", archs='["sm_90"]')
    ops = tmp_path / "ops.txt"
    with pytest.raises(TuningError, match=r"cannot save .*autotune.lock.json: \[Errno 28\] No space left on device"):
        local_tune(root, tmp_path / "cache", {0: "sm_90"}, crash=[], hang=[], sleep_ms=100, log=str(ops))
    assert ops.read_text().count("setup") == 2  # of 3 buckets: the one whose save failed, and the one under way then


# ---- a Ray cluster ---------------------------------------------------------------------------

ray = pytest.importorskip("ray", reason="Ray is in the test extra: pip install -e '.[test]'")
from ray.cluster_utils import Cluster  # noqa: E402

from hatch_autotune.tuning.ray_engine import arch_resources, tune_on_ray  # noqa: E402


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory):
    """Every Ray process on loopback (conftest sets Ray's switch before Ray is imported), and
    every node's compile cache in one temp directory."""
    from ray._private import ray_constants

    assert not ray_constants.ENABLE_RAY_CLUSTER, "Ray was imported before conftest kept it on loopback"
    saved = os.environ.get("HATCH_AUTOTUNE_CACHE_DIR")
    os.environ["HATCH_AUTOTUNE_CACHE_DIR"] = str(tmp_path_factory.mktemp("ray-cache"))
    yield
    if saved is None:
        os.environ.pop("HATCH_AUTOTUNE_CACHE_DIR", None)
    else:
        os.environ["HATCH_AUTOTUNE_CACHE_DIR"] = saved


def start_cluster(*nodes: dict[str, int]) -> tuple[Cluster, list]:
    """A local cluster, one node per dict of {arch: GPUs}, the first the head."""
    cluster = Cluster()
    handles = []
    for gpus in nodes:
        handles.append(
            cluster.add_node(
                num_cpus=1,
                num_gpus=sum(gpus.values()),
                resources={f"hatch-autotune:{a}": n for a, n in gpus.items()},
                node_ip_address="127.0.0.1",
                include_dashboard=False,
            )
        )
    cluster.wait_for_nodes()
    return cluster, handles


def workers(**extra) -> dict:
    return {arch: {"command": FAKE, "env": {"FAKE_WORKER": json.dumps(fake_plan(arch, **extra))}} for arch in CC}


@pytest.fixture(scope="module")
def mixed_cluster(ray_env):
    """Two nodes of different GPUs: the head with two sm_90, the other with two sm_80."""
    cluster, _ = start_cluster({"sm_90": 2}, {"sm_80": 2})
    yield cluster
    cluster.shutdown()


def test_a_cluster_of_mixed_gpus_tunes_every_arch_in_one_run_as_a_local_machine_would(mixed_cluster, tmp_path):
    root = project(tmp_path / "p")
    logs: list[str] = []
    summary = tune_on_ray(
        load_project(root), mixed_cluster.address, mode="auto", workers=workers(), cache=CompileCache(tmp_path / "c"), log=logs.append
    )
    lock = LockFile.load(root / "autotune.lock.json")
    assert len(summary.tuned) == 6 and len(lock.entries) == 6
    for eid, entry in lock.entries.items():  # each arch measured on its own GPUs
        assert entry.provenance["cc"] == {"sm_80": "8.0", "sm_90": "9.0"}[eid.split("|")[2]]
    # the same verification, choice and lock entries as the local engine, crash and hang included
    local = local_tune(project(tmp_path / "local"), tmp_path / "c", {0: "sm_90", 1: "sm_80"})
    assert comparable(lock) == comparable(local)
    assert any(
        m.startswith("tuning on the Ray cluster at") and "2 x sm_80, 2 x sm_90" in m and m.endswith("mode tune") for m in logs
    )  # auto: tune
    table = logs[logs.index(next(m for m in logs if m.startswith("tuning: buckets per GPU")))]
    assert table.count("sm_80") == 2 and table.count("sm_90") == 2  # progress per node and arch
    # run again: every entry is valid, nothing is sent to the cluster
    again = tune_on_ray(load_project(root), mixed_cluster.address, workers=workers(), cache=CompileCache(tmp_path / "c"), log=logs.append)
    assert again.tuned == [] and again.skipped == 6


def test_an_actor_whose_gpu_is_not_its_arch_is_not_used_and_its_work_is_reported(mixed_cluster, tmp_path):
    root = project(tmp_path / "p")
    wrong = workers()
    wrong["sm_80"]["env"]["FAKE_WORKER"] = json.dumps(fake_plan("sm_90"))  # the node says sm_80, its GPU is 9.0
    logs: list[str] = []
    with pytest.raises(TuningError, match=r"3 of 6 bucket\(s\) were not tuned") as exc:
        tune_on_ray(load_project(root), mixed_cluster.address, workers=wrong, cache=CompileCache(tmp_path / "c"), log=logs.append)
    assert "scale|-|sm_80|n=1024: no sm_80 GPU was left to run it" in str(exc.value)
    assert sum("is not used: its GPU is sm_90" in m for m in logs) == 2
    assert sorted(LockFile.load(root / "autotune.lock.json").entries) == [f"scale|-|sm_90|n={n}" for n in (1024, 1048576, 65536)]


def remove_when_measuring(cluster: Cluster, node, ops: Path, after: int) -> threading.Thread:
    """Remove `node` once the workers have logged `after` measurements (the run is under way)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if ops.exists() and ops.read_text().count("measure") >= after:
                cluster.remove_node(node)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_node_lost_mid_run_costs_only_its_work_in_flight_and_the_lock_is_the_same(ray_env, tmp_path):
    cluster, (_, doomed) = start_cluster({"sm_90": 1}, {"sm_90": 2})
    try:
        root = project(tmp_path / "p", archs='["sm_90"]')
        ops = tmp_path / "ops.txt"
        watcher = remove_when_measuring(cluster, doomed, ops, after=4)
        logs: list[str] = []
        summary = tune_on_ray(
            load_project(root),
            cluster.address,
            workers=workers(sleep_ms=150, log=str(ops)),
            cache=CompileCache(tmp_path / "c"),
            log=logs.append,
        )
        watcher.join(5)
    finally:
        cluster.shutdown()
    lost = [m for m in logs if m.startswith("warning:") and "is lost" in m]
    assert lost and all("goes back to the queue" in m for m in lost)  # its buckets were retried on the head
    assert len(summary.tuned) == 3
    undisturbed = local_tune(project(tmp_path / "local", archs='["sm_90"]'), tmp_path / "c", {0: "sm_90"})
    assert comparable(LockFile.load(root / "autotune.lock.json")) == comparable(undisturbed)


def test_when_no_gpu_of_an_arch_is_left_the_run_says_what_was_lost_and_a_rerun_resumes(ray_env, tmp_path):
    cluster, (_, doomed) = start_cluster({"sm_80": 1}, {"sm_90": 1})
    try:
        root = project(tmp_path / "p")
        ops = tmp_path / "ops.txt"
        watcher = remove_when_measuring(cluster, doomed, ops, after=2)
        started = time.monotonic()
        with pytest.raises(TuningError, match="were not tuned because their GPUs were lost") as exc:
            tune_on_ray(
                load_project(root),
                cluster.address,
                workers=workers(sleep_ms=150, log=str(ops)),
                cache=CompileCache(tmp_path / "c"),
                log=lambda m: None,
            )
        assert time.monotonic() - started < 120
        watcher.join(5)
        saved = LockFile.load(root / "autotune.lock.json").entries
        assert {e for e in saved if "sm_80" in e} == {f"scale|-|sm_80|n={n}" for n in (1024, 65536, 1048576)}
        missing = [f"scale|-|sm_90|n={n}" for n in (1024, 65536, 1048576) if f"scale|-|sm_90|n={n}" not in saved]
        assert missing and all(eid in str(exc.value) for eid in missing)
        # a new sm_90 node joins: running again tunes only what is missing
        cluster.add_node(num_cpus=1, num_gpus=1, resources={"hatch-autotune:sm_90": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        summary = tune_on_ray(
            load_project(root), cluster.address, workers=workers(), cache=CompileCache(tmp_path / "c"), log=lambda m: None
        )
    finally:
        cluster.shutdown()
    assert sorted(eid for eid, _ in summary.tuned) == sorted(missing) and summary.skipped == 6 - len(missing)
    assert len(LockFile.load(root / "autotune.lock.json").entries) == 6


def test_clear_errors_for_a_cluster_that_cannot_tune(ray_env, tmp_path):
    root = project(tmp_path / "p")
    started = time.monotonic()
    with pytest.raises(TuningError, match=r"cannot reach the Ray cluster at 127.0.0.1:9: .*ray start --head"):
        tune_on_ray(load_project(root), "127.0.0.1:9", log=lambda m: None)
    with pytest.raises(TuningError, match="expected the Ray head node's HOST:PORT"):
        tune_on_ray(load_project(root), "not-an-address", log=lambda m: None)
    assert time.monotonic() - started < 15
    cluster, _ = start_cluster({})
    try:
        with pytest.raises(TuningError, match="advertises no GPU arch: start each GPU node with"):
            tune_on_ray(load_project(root), cluster.address, log=lambda m: None)
    finally:
        cluster.shutdown()


def test_a_node_advertises_its_gpus_by_arch():
    gpus = [Gpu(0, "sm_90", "H100"), Gpu(1, "sm_90", "H100"), Gpu(2, "sm_80", "A100")]
    assert arch_resources(gpus) == {"hatch-autotune:sm_90": 2, "hatch-autotune:sm_80": 1}
    assert arch_resources([]) == {}
