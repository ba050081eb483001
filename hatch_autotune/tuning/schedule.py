"""Scheduling: tuning jobs (one bucket of one type instance on one arch) spread over GPU slots.

One loop serves both engines: the workers of this machine's GPUs (tuner.py) and the actors of a
Ray cluster (ray_engine.py). A slot is one GPU; it runs the jobs of the target archs it tunes
(`slot_targets`: a 9.0 GPU tunes sm_90 and sm_90a, one slot all the same, so that two buckets never
share a GPU's clock). Each slot takes the next job of its targets as soon as it is free, the
costliest first (the longest-processing-time rule: no slot is left with a big bucket while the
others idle at the end). A slot whose engine queues work (a Ray actor, `depth` 2) is handed its
next job while it still runs one, as long as more jobs of the arch wait than it has slots, so
that it never waits for the driver's round trip between buckets; the last jobs go to whichever
slot is free.
A slot that is lost (its actor or node died) hands its jobs back to the queue, where another
slot of the arch takes them; the job it was running counts as a try, at most `retries` more; a
job that no slot can finish is reported as lost, never left as a silent gap. A job that fails on
its own (every variant failed) stops the run, as it would on one GPU. Results are handed to
`on_done` one at a time, in the order they arrive; the caller merges them into the lock by entry
id, so the lock is the same whatever that order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..lock import LockEntry
from ..text import Log
from .search import WarmStart

RETRIES = 2  # a job whose slot is lost goes to another slot at most this many times


class SlotLost(RuntimeError):
    """The slot cannot run anything any more (its Ray actor or node died): its job is retried."""


@dataclass(frozen=True)
class Job:
    """One point to tune: its lock id, arch, warm start (fixed when the run starts so that a
    result does not depend on which jobs finished before it), and what the
    engine needs to run it (a tuner BucketJob locally; the id is enough for a Ray actor)."""

    eid: str
    arch: str
    warm: WarmStart = WarmStart()
    payload: Any = None
    cost: float = 1.0  # an estimate of its time (configs to measure, inputs to make): bigger goes first


class Slot(Protocol):
    name: str  # where it runs, for progress: "gpu1" or "<node>/gpu0"
    arch: str  # its GPU's arch, for progress; the job arch it runs unless it has `targets`
    depth: int  # jobs it holds at once: 1 runs one at a time; 2 queues the next behind the running one

    def start(self, job: Job) -> Callable[[], LockEntry]:
        """Hand `job` over; the callable waits for its lock entry (SlotLost: the slot is gone).
        A slot of depth 1 may do all the work in the callable. A slot may also have
        `upcoming(job | None)`: called before each wait with the job it would likely get next
        (the head of its arch's queue), so that it prepares it meanwhile. A slot that runs the jobs
        of other target archs than `arch` (sm_90a on a 9.0 GPU) has `targets`: those archs."""
        ...


def slot_targets(slot: Slot) -> tuple[str, ...]:
    """The job archs a slot runs: its `targets` where it has them, else its own arch."""
    return tuple(getattr(slot, "targets", None) or (slot.arch,))


@dataclass
class SlotStats:
    name: str
    arch: str
    jobs: int = 0
    busy_s: float = 0.0  # the slot's time with a job, as the scheduler sees it
    idle_s: float = 0.0  # between the end of one job and the start of the next: the engine's overhead per job
    lost: str = ""  # why the slot was lost, if it was


@dataclass
class ScheduleResult:
    slots: list[SlotStats] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)  # entry id -> why no slot finished it
    wall_s: float = 0.0  # from the first job handed out to the last slot done

    @classmethod
    def combined(cls, slots: Sequence[Slot], parts: Sequence[tuple[Sequence[Slot], ScheduleResult]]) -> ScheduleResult:
        """One result of schedules run one after another (a tuning run's waves), each over some
        of `slots` (those not lost before it): per slot in `slots`' order, its jobs and times
        summed and the first reason it was lost; the lost jobs of all; the walls summed."""
        out = cls(slots=[SlotStats(s.name, s.arch) for s in slots])
        mine = {id(s): stats for s, stats in zip(slots, out.slots)}
        for ran, part in parts:
            for s, stats in zip(ran, part.slots):
                total = mine[id(s)]
                total.jobs += stats.jobs
                total.busy_s += stats.busy_s
                total.idle_s += stats.idle_s
                total.lost = total.lost or stats.lost
            out.lost.update(part.lost)
            out.wall_s += part.wall_s
        return out

    def table(self) -> str:
        rows = [("GPU", "arch", "buckets", "busy s", "")]
        rows += [(s.name, s.arch, str(s.jobs), f"{s.busy_s:.1f}", f"lost: {s.lost}" if s.lost else "") for s in self.slots]
        return text_table(rows)


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, for the tuning log."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run_schedule(
    jobs: Sequence[Job],
    slots: Sequence[Slot],
    on_done: Callable[[Job, LockEntry, Slot], None],
    log: Log,
    retries: int = RETRIES,
) -> ScheduleResult:
    """Run every job on a slot that runs its arch (`slot_targets`), one thread per slot; returns
    per-slot statistics and the jobs that were lost. The first error of a job itself is raised
    once every slot has finished the job it was waiting for. A slot of depth 1 counts its idle time here
    (from one result to the next job); a deeper one's engine knows it better (ray_engine)."""
    pending: dict[str, deque[Job]] = {}
    for job in sorted(jobs, key=lambda j: -j.cost):  # stable: equal costs keep the caller's order
        pending.setdefault(job.arch, deque()).append(job)
    running = {arch: 0 for arch in pending}  # handed to a slot, not yet done: may come back
    targets = [slot_targets(s) for s in slots]
    slots_of = {arch: sum(arch in t for t in targets) for arch in pending}
    failures: dict[str, list[str]] = {}
    result = ScheduleResult(slots=[SlotStats(s.name, s.arch) for s in slots])
    errors: list[BaseException] = []
    cond = threading.Condition()
    total, done = len(jobs), [0]

    def head(archs: tuple[str, ...], spare: bool) -> deque[Job] | None:
        """The queue a slot of `archs` takes from next (under `cond`): of those it may take
        from, the one whose head is costliest (the first of its archs on a tie)."""
        able = [q for a in archs if (q := pending.get(a)) and (not spare or len(q) > slots_of[a])]
        return max(able, key=lambda q: q[0].cost) if able else None

    def next_job(archs: tuple[str, ...], spare: bool) -> Job | None:
        """The next job of the archs a slot runs. For a free slot (not `spare`) it waits while
        another slot's job of those archs may come back; one queued behind a running job is taken
        only while more jobs of its arch wait than the arch has slots, and never waited for."""
        with cond:
            while True:
                if errors:
                    return None
                queue = head(archs, spare)
                if queue:
                    job = queue.popleft()
                    running[job.arch] += 1
                    return job
                if spare or not any(running.get(a) for a in archs):
                    return None
                cond.wait()

    def drive(slot: Slot, stats: SlotStats, archs: tuple[str, ...]) -> None:
        held: deque[tuple[Job, Callable[[], LockEntry]]] = deque()  # the running job first
        last_end: float | None = None
        while True:
            job = next_job(archs, spare=bool(held)) if len(held) < slot.depth else None
            if job is not None:
                held.append((job, slot.start(job)))
                continue
            if not held:
                return
            job, wait = held[0]
            upcoming = getattr(slot, "upcoming", None)
            if upcoming is not None:  # the slot may make the next job's inputs while this one runs
                with cond:
                    queue = head(archs, spare=False)
                    guess = queue[0] if queue else None
                upcoming(guess)
            began = time.monotonic()
            try:
                entry = wait()
            except SlotLost as exc:
                with cond:
                    stats.lost = str(exc)
                    for j, _ in held:
                        running[j.arch] -= 1
                    for j, _ in list(held)[:0:-1]:  # queued behind it, never started: no try counted
                        pending[j.arch].appendleft(j)
                    tries = failures.setdefault(job.eid, [])
                    tries.append(f"{slot.name}: {exc}")
                    if len(tries) > retries:
                        result.lost[job.eid] = "; ".join(tries)
                    else:
                        pending[job.arch].appendleft(job)
                    cond.notify_all()
                again = "lost after " + str(len(tries)) + " tries" if job.eid in result.lost else "goes back to the queue"
                log(f"warning: {slot.name} ({slot.arch}) is lost ({exc}); {job.eid} {again}")
                return
            except BaseException as exc:
                with cond:
                    for j, _ in held:
                        running[j.arch] -= 1
                    errors.append(exc)
                    cond.notify_all()
                return
            ended = time.monotonic()
            held.popleft()
            with cond:
                running[job.arch] -= 1
                stats.jobs += 1
                stats.busy_s += ended - began
                if last_end is not None and slot.depth == 1:
                    stats.idle_s += began - last_end
                last_end = ended
                done[0] += 1
                cond.notify_all()
                try:
                    on_done(job, entry, slot)
                except BaseException as exc:
                    errors.append(exc)
                    for j, _ in held:
                        running[j.arch] -= 1
                    return
                if len(slots) > 1:
                    log(f"  [{done[0]}/{total}] {job.eid} done on {slot.name}")

    threads = [
        threading.Thread(target=drive, args=(s, st, t), name=f"hatch-autotune-{s.name}") for s, st, t in zip(slots, result.slots, targets)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall_s = time.monotonic() - started
    if errors:
        raise errors[0]
    for arch, left in pending.items():  # every slot of the arch is gone
        for job in left:
            tries = failures.get(job.eid, [])
            result.lost[job.eid] = "; ".join(tries) if tries else f"no {arch} GPU was left to run it"
    return result
