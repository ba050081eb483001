"""The local engine: this machine's GPUs tune a project's stale lock entries, and
`run_tuning`, the part every engine shares (the Ray engine too): checks, warm starts, the
schedule over the GPUs, and the lock written as results arrive.

The pieces, one concept per file: what to tune (decide.py), warm starts (warm.py), one bucket's
tuning (bucket.py) in a worker session (session.py) with binaries compiled ahead
(binaries.py), the schedule (schedule.py) and the lock writer (lock_writer.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..compile.cache import CompileCache
from ..compile.tiers import open_compile_cache
from ..declare.config import Mode, ProjectSpec
from ..lock import LockEntry, Status
from ..plan.devices import Gpu, detect_gpus, tunable_targets, tuning_gpus
from ..plan.planner import Instance, Plan, Point, make_plan, target_archs
from ..text import Log, instance_text
from .binaries import CompareBinaries, InstanceBinaries
from .bucket import BucketJob, BucketTuning, bucket_recipe, strategy_text
from .decide import Todo, TuningPlan, check_kernels, plan_tuning, stale_points
from .errors import TuningError
from .inputs import input_bytes
from .lock_writer import LockSaver
from .schedule import Job, ScheduleResult, Slot, run_schedule, slot_targets, text_table
from .search import WarmStart
from .session import WorkerSession
from .warm import transfer_waves, warm_start
from .worker_client import WorkerClient

# Scheduling: a bucket's inputs are made on the host (drawn, written, loaded and uploaded by the
# worker) before anything is measured, seconds per GiB; counting 8 MiB as one more config puts a
# bucket of 1 GiB (128 configs more) early rather than last, where it would stretch the run's
# tail. A rough figure that only orders the jobs; erring high costs little, since the biggest
# inputs also make the longest measurements.
HOST_BYTES_PER_CONFIG = 8 << 20


@dataclass
class TuneSummary:
    tuned: list[tuple[str, LockEntry]] = field(default_factory=list)  # (entry id, lock entry)
    skipped: int = 0  # entries whose lock entry was still valid
    plan: Plan | None = None  # what was tuned, for the build that follows (None: nothing, or some kernels only)
    schedule: ScheduleResult | None = None  # how the buckets were spread over the GPUs (None: nothing was tuned)

    def table(self) -> str:
        rows = [("entry", "winner", "ms", "vs default", "measured", "rejected/failed")]
        for eid, e in self.tuned:
            ms = e.measurements
            win = e.winner_ms
            speedup = f"{e.default_ms / win:.2f}x" if win and e.default_ms else "-"
            rows.append(
                (
                    eid,
                    ",".join(f"{k}={v}" for k, v in e.config.items()),
                    f"{win:.4f}" if win else "-",
                    speedup,
                    str(sum(m.status in (Status.OK, Status.ELIMINATED) for m in ms)),
                    str(sum(m.status in (Status.REJECTED, Status.FAILED) for m in ms)),
                )
            )
        return text_table(rows)


def tune(
    project: ProjectSpec,
    *,
    kernels: list[str] | None = None,
    mode: Mode | str = Mode.TUNE,
    log: Log = print,
    gpu_arch: str | None = None,
    client_factory: Callable[[int], WorkerClient] | None = None,
    cache: CompileCache | None = None,
    gpus: Sequence[Gpu] | None = None,
) -> TuneSummary:
    """Tune the stale (or, in `retune`, all) entries of `project` for every target arch that a
    device here tunes (plan_tuning; in `auto`, none is not an error), or only for those a GPU of
    arch `gpu_arch` tunes, and write them into its lock file as each bucket finishes. `gpus`:
    this machine's devices when the caller has detected them already (the build hook), else
    detected here. Every device that tunes a target arch (`tuning_gpus`) gets one worker, for all
    the targets it tunes (a 9.0 GPU: sm_90 and sm_90a), and the buckets are spread over them
    (schedule.py, the loop the Ray engine shares). The summary carries the plan it tuned (all kernels only), whose lock
    holds the new entries: the build that follows uses it, rendering and reading nothing again."""
    mode = Mode(mode)
    if mode == Mode.OFFLINE:
        raise TuningError("mode 'offline' never touches a GPU; use mode 'tune' or 'retune' to tune")
    check_kernels(project, kernels)
    gpus = detect_gpus() if gpus is None else gpus
    if gpu_arch is None:
        tuning = plan_tuning(project, gpus, mode)
        for note in tuning.notes:
            log(f"hatch-autotune: {note}")
        for w in tuning.warnings:
            log(f"warning: {w}")
        targets = tuning.targets
    else:
        targets = target_archs(project, (gpu_arch,))
        archs = tunable_targets(targets, [Gpu(0, gpu_arch, None)])
        if not archs:
            raise TuningError(f"the GPU here is {gpu_arch} but the project's archs are {', '.join(targets)}; add {gpu_arch} to `archs`")
        tuning = TuningPlan(archs, targets)
    summary = TuneSummary()
    if not tuning.archs:
        return summary
    cache = cache or open_compile_cache()
    plan = make_plan(project, targets, log=log, kernels=kernels)
    todo = plan_run(plan, tuning.archs, mode, kernels, summary, log)
    factory = client_factory or (lambda device: WorkerClient())
    sessions: list[WorkerSession] = []
    try:
        slots: list[Slot] = []
        binaries = InstanceBinaries(cache)
        for arch, inst, points in todo:  # the defaults compile while the workers start
            binaries(inst, arch).request(point_defaults(inst, points))
        with tempfile.TemporaryDirectory(prefix="hatch-autotune-tune-") as tmpdir:
            running = list(dict.fromkeys(a for a, _, _ in todo))  # the target archs with buckets to tune
            compare = {a: CompareBinaries(a, cache, output_dtypes(inst for t, inst, _ in todo if t == a), log) for a in running}
            wanted = device_targets(running, gpus)
            for arch in running:
                devices = [d for d, tuned in wanted.items() if arch in tuned]
                log(
                    f"tuning {arch} on device{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))} (NVRTC {plan.compiler}), mode {mode}"
                )
            sessions += [WorkerSession(factory(d), d, project.tuning) for d in wanted]
            slots += [
                LocalSlot(s, tuned, binaries, plan, Path(tmpdir), log, compare)
                for s, tuned in matching_sessions(list(zip(sessions, wanted.values())), log)
            ]
            run_tuning(plan, todo, slots, binaries, summary, log)
    finally:
        for s in sessions:
            s.close()
    return summary


def run_record(project: ProjectSpec) -> dict[str, Any]:
    """What every entry of one tuning run records beside its own provenance (whichever engine
    measured it): the run (its start and this process), the code that tuned (hatch-autotune's
    version, and its commit where it runs from a git checkout), and the measuring settings."""
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {"run": f"{started} pid {os.getpid()}", "code": code_version(), "settings": dataclasses.asdict(project.tuning)}


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # hatch_autotune/, in a checkout or installed


def code_version(package_dir: Path = PACKAGE_DIR) -> str:
    """'0.1.0' for an installed hatch-autotune; '0.1.0 (git 75a17d9c…, dirty)' from a checkout,
    so a lock tuned by uncommitted code says so."""
    if not (package_dir.parent / ".git").exists():
        return __version__
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package_dir.parent, capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=package_dir.parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return __version__
    if head.returncode != 0 or not head.stdout.strip():
        return __version__
    dirty = ", dirty" if status.returncode == 0 and status.stdout.strip() else ""
    return f"{__version__} (git {head.stdout.strip()}{dirty})"


def plan_run(plan: Plan, archs: Sequence[str], mode: Mode, kernels: Sequence[str] | None, summary: TuneSummary, log: Log) -> Todo:
    """What a run tunes (decide.stale_points); the summary counts the entries still valid and
    keeps the plan when it covers every kernel (the build that follows uses it)."""
    if not kernels:
        summary.plan = plan
    todo, summary.skipped = stale_points(plan, archs, mode, log)
    return todo


def point_defaults(inst: Instance, points: Sequence[Point]) -> list[int]:
    """What the points run untuned (Instance.point_default): the default config, and where it may
    not run a point, the first config that may. Each must compile, as a build needs them."""
    return sorted({d for p in points if (d := inst.point_default(p)) is not None})


def output_dtypes(instances: Iterable[Instance]) -> list[str]:
    """The dtypes of the arrays the instances' kernels write: what their compare kernels take."""
    found: dict[str, None] = {}
    for inst in instances:
        for a in inst.spec.args:
            if a.is_array and a.intent != "in":
                found[inst.types.get(a.dtype, a.dtype)] = None
    return list(found)


def device_targets(archs: Iterable[str], gpus: Sequence[Gpu]) -> dict[int, tuple[str, ...]]:
    """Per device ordinal, the target archs it tunes (`tuning_gpus`): one worker each, however
    many targets, so that no two buckets share a GPU. A target no detected GPU tunes (none
    detected: a stand-in worker, or a driver that would not say) goes to device 0, whose worker
    says what it is (matching_sessions)."""
    out: dict[int, tuple[str, ...]] = {}
    for arch in archs:
        for d in [g.ordinal for g in tuning_gpus(arch, gpus)] or [0]:
            out[d] = (*out.get(d, ()), arch)
    return out


def matching_sessions(wanted: Sequence[tuple[WorkerSession, Sequence[str]]], log: Log) -> list[tuple[WorkerSession, tuple[str, ...]]]:
    """Each session with the target archs it may tune: those its GPU, as its worker reports it,
    tunes (`Gpu.can_tune`: a driver's or a stand-in's word is not the device's). A session that
    tunes none is closed; a target no session tunes is a TuningError. The workers start at
    once, one thread each (a worker's start is seconds of imports and a CUDA context: not one
    after the other)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(wanted))) as pool:
        infos = list(pool.map(lambda w: w[0].hello(), wanted))
    keep = []
    for (s, targets), info in zip(wanted, infos):
        gpu = Gpu(s.device, info.arch, info.name)
        tuned = tuple(t for t in targets if gpu.can_tune(t))
        if len(tuned) < len(targets):
            other = ", ".join(t for t in targets if t not in tuned)
            log(f"tuning: device {s.device} ({info.name}, {info.arch}) is not {other}; not using it" + (f" for {other}" if tuned else ""))
        if tuned:
            keep.append((s, tuned))
        else:
            s.close()
    for arch in dict.fromkeys(t for _, targets in wanted for t in targets):
        if not any(arch in tuned for _, tuned in keep):
            raise TuningError(f"no device of arch {arch} answered")
    return keep


class LocalSlot:
    """One GPU of this machine: its worker session tunes one bucket at a time, of any target arch
    it tunes (`targets`), and makes the inputs of the bucket it is likely to get next while it
    measures (`upcoming`)."""

    depth = 1  # it runs in the scheduler's thread: one bucket at a time

    def __init__(
        self,
        session: WorkerSession,
        targets: Sequence[str],
        binaries: InstanceBinaries,
        plan: Plan,
        tmp: Path,
        log: Log,
        compare: Mapping[str, CompareBinaries] | None = None,
    ):
        self.session, self.targets, self.binaries, self.plan, self.log = session, tuple(targets), binaries, plan, log
        self.compare = compare or {}
        self.arch = session.hello().arch  # its GPU's, as its worker says (asked once: matching_sessions did)
        self.name = f"gpu{session.device}"
        self.workdir = tmp / self.name
        self.workdir.mkdir(exist_ok=True)

    def start(self, job: Job) -> Callable[[], LockEntry]:
        bucket: BucketJob = job.payload
        root, compiler = self.plan.project.root, self.plan.compiler
        binaries, compare = self.binaries(bucket.inst, job.arch), self.compare.get(job.arch)
        return lambda: BucketTuning(self.session, bucket, binaries, job.warm, root, self.workdir, self.log, compiler, compare).run()

    def upcoming(self, job: Job | None) -> None:
        """The job the scheduler would hand this slot next (a guess: another slot may take it)."""
        self.session.expect(bucket_recipe(job.payload, self.plan.project.root) if job is not None else None)


def run_tuning(plan: Plan, todo: Todo, slots: Sequence[Slot], binaries: InstanceBinaries, summary: TuneSummary, log: Log) -> None:
    """The engine-independent part of a tuning run (this machine's GPUs, or a Ray cluster's):
    check each instance's default compiles (a build would stop: no GPU time for it), schedule
    the buckets over the slots wave by wave (warm.transfer_waves: a search within a budget
    starts from the waves before it; one wave otherwise), each job's warm start fixed from the
    lock as its wave starts (the same search whoever runs it, on however many GPUs), and merge
    each result into the lock and save it as it arrives, so an interrupted run resumes where it
    stopped. Lost jobs are a TuningError that names them, raised after everything else is saved."""
    per_arch: dict[str, int] = {}
    for s in slots:
        for arch in slot_targets(s):
            per_arch[arch] = per_arch.get(arch, 0) + 1
    waves: list[list[tuple[str, Instance, Point]]] = []  # transfer_waves of every instance, wave by wave
    for arch, inst, points in todo:
        named = f"{inst.spec.name} ({instance_text(inst.types_key)})"
        for index in point_defaults(inst, points):  # the default, or where it may not run a point's fallback
            default = binaries(inst, arch).get(index)
            if not default.ok:
                if not plan.project.default_may_fail:
                    raise TuningError(plan.default_failure([(inst, arch, default.log, index)]))
                what = (
                    "the default config" if index == inst.default_index else f"{inst.variants[index].label} (where the default may not run)"
                )
                log(f"warning: {what} of {named} does not compile for {arch}; measuring the others (default-may-fail = true)")
        log(
            f"tuning {named} on {arch}: {len(points)} bucket(s) x {len(inst.variants)} configs on {per_arch.get(arch, 0)} GPU(s), {strategy_text(inst.spec.search)}"
        )
        grouped = transfer_waves(points) if inst.spec.search.learns_from_neighbours(len(inst.configs)) else [list(points)]
        for n, group in enumerate(grouped):
            if n == len(waves):
                waves.append([])
            waves[n] += [(arch, inst, p) for p in group]

    def jobs(wave: list[tuple[str, Instance, Point]]) -> list[Job]:
        """The wave's jobs, each with its warm start from the lock as it is now."""
        out = []
        for arch, inst, p in wave:
            search = inst.spec.search
            warm = warm_start(plan.lock, p, inst.configs, search.strategy) if search.warm_start else WarmStart()
            cost = (
                search.configs_tried(len(inst.candidates(p)))
                + input_bytes(inst.spec, p.bucket.as_dict(), inst.types) / HOST_BYTES_PER_CONFIG
            )
            out.append(Job(p.eid, arch, warm, BucketJob(inst, p), cost=cost))
        return out

    saver = LockSaver(plan.lock, plan.project.lock_file)
    run = run_record(plan.project)

    def done(job: Job, entry: LockEntry, slot: Slot) -> None:
        search = job.payload.inst.spec.search
        seed = f", seed {search.seed}" if search.strategy != "exhaustive" else ""
        entry = dataclasses.replace(entry, provenance={**entry.provenance, **run, "search": strategy_text(search) + seed})
        saver.put(job.eid, entry)
        summary.tuned.append((job.eid, entry))

    parts: list[tuple[Sequence[Slot], ScheduleResult]] = []
    live = list(slots)
    try:
        for n, wave in enumerate(waves):
            if len(waves) > 1:
                log(f"tuning: wave {n + 1} of {len(waves)}, {len(wave)} bucket(s)" + (", warm-started from the waves before" if n else ""))
            part = run_schedule(jobs(wave), live, done, log)
            parts.append((live, part))
            live = [s for s, stats in zip(live, part.slots) if not stats.lost]  # a lost slot stays lost
    finally:
        saver.close()  # every result that arrived is on disk, whatever stopped the run
    result = summary.schedule = ScheduleResult.combined(slots, parts)
    total = sum(len(w) for w in waves)
    if len(slots) > 1:
        log("tuning: buckets per GPU\n" + result.table())
    if todo:
        log("tuning summary:\n" + summary.table())
    if result.lost:
        listed = "\n".join(f"  {eid}: {why}" for eid, why in sorted(result.lost.items()))
        raise TuningError(
            f"{len(result.lost)} of {total} bucket(s) were not tuned because their GPUs were lost; the other "
            f"{total - len(result.lost)} are saved in {plan.project.lock_file.name}, and running again tunes only these:\n{listed}"
        )
