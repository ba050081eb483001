"""The tuner's side of arch-specific (`sm_XYa`) and family (`sm_XYf`) targets: which GPUs tune
which target archs (`Gpu.can_tune`, `tuning_gpus`) in the tuning plan, on this machine's GPUs,
in the scheduler and on a Ray cluster. A GPU tunes a plain or 'a' target of its own compute
capability, and an 'f' target of its family with a minor not above its own.

No GPU here: the stand-in worker (fake_worker.py) answers as a device of the compute capability
it is told, with SYNTHETIC timings; the binaries are real NVRTC output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import load_project, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.plan.devices import Gpu
from hatch_autotune.tuning import TuningError, tune
from hatch_autotune.tuning.decide import plan_tuning
from hatch_autotune.tuning.schedule import Job, run_schedule
from hatch_autotune.tuning.tuner import device_targets
from hatch_autotune.tuning.worker_client import WorkerClient

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
BUCKETS = (1024, 65536, 1048576)  # the tiny project's
TIMEOUT = "[tool.hatch.build.targets.wheel.hooks.autotune.tuning]\ntimeout-s = 2"


def project(path: Path, archs: list[str]) -> Path:
    root = write_tiny_project(path, extra=TIMEOUT)
    text = (root / "pyproject.toml").read_text().replace('archs = ["sm_80", "sm_90"]', f"archs = {json.dumps(archs)}")
    (root / "pyproject.toml").write_text(text)
    return root


def gpu(ordinal: int, arch: str) -> Gpu:
    return Gpu(ordinal, arch, f"Fake {arch}")


def ids(*archs: str) -> list[str]:
    return sorted(f"scale|-|{a}|n={n}" for a in archs for n in BUCKETS)


class Run:
    """The local engine on stand-in devices: each worker answers as the compute capability its
    device has in `cc` (by ordinal), and every worker started is counted."""

    def __init__(self, tmp: Path, cc: dict[int, tuple[int, int]]):
        self.tmp, self.cc, self.started, self.logs = tmp, cc, [], []

    def client(self, device: int) -> WorkerClient:
        self.started.append(device)
        plan = {"cc": list(self.cc[device]), "log": str(self.tmp / f"ops{device}.txt")}
        return WorkerClient(FAKE, env={**os.environ, "FAKE_WORKER": json.dumps(plan)})

    def tune(self, root: Path, gpus: list[Gpu], **kw):
        return tune(
            load_project(root), gpus=gpus, client_factory=self.client, cache=CompileCache(self.tmp / "cache"), log=self.logs.append, **kw
        )


# ---- which target archs a machine tunes ---------------------------------------------------------


def test_the_tuning_plan_takes_the_targets_a_gpu_here_tunes(tmp_path):
    hopper = load_project(project(tmp_path / "h", ["sm_90", "sm_90a"]))
    plan = plan_tuning(hopper, [gpu(0, "sm_90")], "tune")
    assert plan.archs == ("sm_90", "sm_90a") and plan.warnings == ()
    # an 8.0 GPU tunes neither: auto builds from the lock, saying why; tune refuses
    plan = plan_tuning(hopper, [gpu(0, "sm_80")], "auto")
    assert plan.archs == () and plan.warnings == (
        "no GPU here is of a target arch (sm_90, sm_90a); devices: 0 (Fake sm_80, sm_80); not tuning",
    )
    with pytest.raises(TuningError, match=r"no GPU here is of a target arch \(sm_90, sm_90a\)"):
        plan_tuning(hopper, [gpu(0, "sm_80")], "tune")
    # sm_80 runs on an 8.6 GPU, but its entries are an 8.0 GPU's to measure
    plan = plan_tuning(load_project(project(tmp_path / "a", ["sm_80", "sm_90"])), [gpu(0, "sm_86"), gpu(1, "sm_90")], "tune")
    assert plan.archs == ("sm_90",)
    assert plan.warnings == (
        "no GPU here is sm_80: its entries are not tuned on this machine",
        "device 0 (Fake sm_86, sm_86) is not of a target arch (sm_80, sm_90): not tuning on it",
    )
    # a 10.3 GPU tunes the 10.0 family's target, not 10.0's arch-specific one
    blackwell = load_project(project(tmp_path / "b", ["sm_100a", "sm_100f"]))
    plan = plan_tuning(blackwell, [gpu(0, "sm_103")], "tune")
    assert plan.archs == ("sm_100f",) and plan.warnings == ("no GPU here is sm_100a: its entries are not tuned on this machine",)


def test_each_gpu_gets_one_worker_for_every_target_it_tunes_on_the_nearest_compute_capability():
    gpus = [gpu(0, "sm_103"), gpu(1, "sm_90"), gpu(2, "sm_100"), gpu(3, "sm_90")]
    assert device_targets(["sm_90", "sm_90a", "sm_100f", "sm_103f"], gpus) == {
        1: ("sm_90", "sm_90a"),
        3: ("sm_90", "sm_90a"),
        2: ("sm_100f",),  # 10.0 measures sm_100f where there is one: not the 10.3
        0: ("sm_103f",),
    }
    assert device_targets(["sm_100f"], [gpu(0, "sm_103")]) == {0: ("sm_100f",)}
    assert device_targets(["sm_90"], []) == {0: ("sm_90",)}  # none detected: device 0, whose worker says what it is


# ---- this machine's GPUs -----------------------------------------------------------------------


def test_a_9_0_gpu_tunes_sm_90_and_sm_90a_on_one_worker_and_an_8_0_gpu_neither(tmp_path):
    root = project(tmp_path / "p", ["sm_90", "sm_90a"])
    run = Run(tmp_path, {0: (9, 0)})
    summary = run.tune(root, [gpu(0, "sm_90")])
    lock = LockFile.load(root / "autotune.lock.json")
    assert sorted(eid for eid, _ in summary.tuned) == sorted(lock.entries) == ids("sm_90", "sm_90a")
    assert run.started == [0]  # one worker: the two targets' buckets never share the GPU's clock
    for eid, entry in lock.entries.items():  # the entry keeps its target arch; the provenance names the GPU
        assert entry.tuned and entry.provenance["cc"] == "9.0" and entry.provenance["gpu"] == "Fake GPU (CPU stand-in)", eid
    assert "tuning sm_90a on device 0" in "\n".join(run.logs)
    before = (root / "autotune.lock.json").read_bytes()

    # an 8.0 GPU tunes neither: auto builds from the lock as it is, no worker started; tune refuses
    a100 = Run(tmp_path, {0: (8, 0)})
    assert a100.tune(root, [gpu(0, "sm_80")], mode="auto").tuned == []
    with pytest.raises(TuningError, match=r"no GPU here is of a target arch \(sm_90, sm_90a\)"):
        a100.tune(root, [gpu(0, "sm_80")], mode="retune")
    assert a100.started == [] and (root / "autotune.lock.json").read_bytes() == before
    assert "warning: no GPU here is of a target arch (sm_90, sm_90a); devices: 0 (Fake sm_80, sm_80); not tuning" in a100.logs


def test_a_10_3_gpu_tunes_the_family_target_and_leaves_the_arch_specific_one(tmp_path):
    root = project(tmp_path / "p", ["sm_100a", "sm_100f"])
    run = Run(tmp_path, {0: (10, 3)})
    summary = run.tune(root, [gpu(0, "sm_103")])
    lock = LockFile.load(root / "autotune.lock.json")
    assert sorted(eid for eid, _ in summary.tuned) == sorted(lock.entries) == ids("sm_100f")
    assert all(e.provenance["cc"] == "10.3" for e in lock.entries.values())
    assert "warning: no GPU here is sm_100a: its entries are not tuned on this machine" in run.logs


def test_a_gpu_arch_given_tunes_what_such_a_gpu_tunes(tmp_path):
    root = project(tmp_path / "p", ["sm_90", "sm_90a"])
    run = Run(tmp_path, {0: (9, 0)})
    summary = tune(
        load_project(root), gpu_arch="sm_90", client_factory=run.client, cache=CompileCache(tmp_path / "cache"), log=run.logs.append
    )
    assert sorted(eid for eid, _ in summary.tuned) == ids("sm_90", "sm_90a")
    with pytest.raises(TuningError, match="the GPU here is sm_80 but the project's archs are sm_90, sm_90a"):
        tune(load_project(root), gpu_arch="sm_80", client_factory=run.client, log=run.logs.append)


def test_a_worker_whose_gpu_cannot_tune_its_targets_is_not_used(tmp_path):
    """The driver said 9.0, the worker answers 8.0: not a device that tunes sm_90 or sm_90a."""
    root = project(tmp_path / "p", ["sm_90", "sm_90a"])
    run = Run(tmp_path, {0: (8, 0)})
    with pytest.raises(TuningError, match="no device of arch sm_90 answered"):
        run.tune(root, [gpu(0, "sm_90")])
    assert any(m.endswith("device 0 (Fake GPU (CPU stand-in), sm_80) is not sm_90, sm_90a; not using it") for m in run.logs)
    ops = tmp_path / "ops0.txt"
    assert not (root / "autotune.lock.json").exists() and (not ops.exists() or "measure" not in ops.read_text())


# ---- the scheduler -----------------------------------------------------------------------------


class Slot:
    """A GPU that runs the jobs of `targets` (None: of its own arch only) and records them."""

    depth = 1

    def __init__(self, name: str, arch: str, targets: tuple[str, ...] | None = None):
        self.name, self.arch, self.ran = name, arch, []
        if targets is not None:
            self.targets = targets

    def start(self, job: Job):
        self.ran.append(job.eid)
        return lambda: LockEntry(checksum="c", config={}, tuned=True)


def jobs(arch: str, n: int, cost: float = 1.0) -> list[Job]:
    return [Job(f"k|-|{arch}|n={i}", arch, cost=cost) for i in range(n)]


def test_a_slot_runs_the_jobs_of_every_target_it_tunes_the_costliest_first():
    hopper = Slot("gpu0", "sm_90", ("sm_90", "sm_90a"))
    ampere = Slot("gpu1", "sm_80")
    work = jobs("sm_90", 2) + jobs("sm_90a", 2, cost=3) + jobs("sm_80", 2)
    result = run_schedule(work, [hopper, ampere], lambda j, e, s: None, log=lambda m: None)
    assert not result.lost
    assert hopper.ran == [j.eid for j in jobs("sm_90a", 2) + jobs("sm_90", 2)] and ampere.ran == [j.eid for j in jobs("sm_80", 2)]
    # a slot without `targets` runs its own arch only: no slot for sm_90a, so its jobs are lost, each with why
    plain = Slot("gpu0", "sm_90")
    result = run_schedule(jobs("sm_90", 1) + jobs("sm_90a", 2), [plain], lambda j, e, s: None, log=lambda m: None)
    assert plain.ran == [jobs("sm_90", 1)[0].eid]
    assert sorted(result.lost) == [j.eid for j in jobs("sm_90a", 2)] and "no sm_90a GPU was left" in result.lost[jobs("sm_90a", 1)[0].eid]


# ---- a Ray cluster -----------------------------------------------------------------------------

ray = pytest.importorskip("ray", reason="Ray is in the test extra: pip install -e '.[test]'")

from test_cluster import ray_env, start_cluster, workers  # noqa: E402, F401 (ray_env: a fixture)

from hatch_autotune.tuning.ray_engine import tune_on_ray  # noqa: E402


def test_an_arch_specific_target_is_tuned_by_the_actors_of_its_gpu_arch(ray_env, tmp_path):  # noqa: F811
    cluster, _ = start_cluster({"sm_90": 1})
    try:
        root = project(tmp_path / "p", ["sm_90", "sm_90a"])
        logs: list[str] = []
        summary = tune_on_ray(load_project(root), cluster.address, workers=workers(), cache=CompileCache(tmp_path / "c"), log=logs.append)
    finally:
        cluster.shutdown()
    lock = LockFile.load(root / "autotune.lock.json")
    assert sorted(eid for eid, _ in summary.tuned) == sorted(lock.entries) == ids("sm_90", "sm_90a")
    assert all(e.provenance["cc"] == "9.0" for e in lock.entries.values())
    assert any("1 x sm_90 (sm_90, sm_90a)" in m for m in logs)  # one actor, on the one sm_90 GPU, for both targets
    assert summary.schedule is not None and [(s.arch, s.jobs) for s in summary.schedule.slots] == [("sm_90", 6)]
