"""One bucket's tuning: its inputs made once and its reference settled (reference.py), then the
search over its configs (the default and the warm starts first) within the kernel's budget, each
config pruned or measured in the worker, and the winner chosen in a runoff of the configs the
search could not tell apart (choice.py); the result is its lock entry (bucket_result.py). The
core loop of Triton's autotuner: prune -> measure (verify, then time) -> choose. The decisions
(`prune_reason`, choice.py's, reference.py's) are plain functions, tested on the CPU."""

from __future__ import annotations

import datetime
import math
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..compile import nvrtc as compile_mod
from ..compile.render import Variant
from ..declare.config import KernelSpec, SearchSpec
from ..declare.kernel_decl import kernel_decl
from ..lock import TIMED, Bucket, LockEntry, Measurement, Status
from ..plan.exclusions import summary
from ..plan.planner import Instance, Point
from ..text import Log
from .binaries import CompareBinaries, VariantBinaries
from .bucket_result import BucketResult
from .choice import RunoffResult, contenders, measured, run_runoff
from .inputs import InputRecipe
from .protocol import DeviceInfo, Failure, Limits, Measure, Measured, Reference, Setup
from .reference import settle_reference
from .search import SearchSpace, WarmStart, make_strategy, run_search
from .session import WorkerSession
from .verify import tolerance
from .worker_client import WorkerDied

PROGRESS_EVERY = 16  # configs between progress lines within a bucket
REFERENCE_NOTE = "reference (no user reference configured)"  # the reason of the config whose outputs became the reference
# Where a bucket's wall time goes (seconds, the lock's provenance "phases"): waiting for NVRTC,
# measuring (the worker's run, verify and time of every variant), and the fixed cost: setting
# the bucket up (inputs made and uploaded) and settling its reference, the rest in "overhead".
# "search" is the strategy's own time (ask, tell, upcoming), a part of "overhead".
COSTS = ("wall", "compile_wait", "measure", "setup", "reference", "overhead", "search")


@dataclass(frozen=True)
class BucketJob:
    """One point to tune, with its type instance."""

    inst: Instance
    point: Point

    @property
    def spec(self) -> KernelSpec:
        return self.inst.spec

    @property
    def variants(self) -> list[Variant]:
        return self.inst.variants

    @property
    def types(self) -> dict[str, str]:
        return self.inst.types

    @property
    def eid(self) -> str:
        return self.point.eid

    @property
    def bucket(self) -> Bucket:
        return self.point.bucket


# ---- decisions ---------------------------------------------------------------------------


def prune_reason(
    config: Mapping[str, Any],
    res: Any,
    block_threads: Callable[[Mapping[str, Any]], int],
    shared_dynamic: Callable[[Mapping[str, Any]], int],
    limits: Limits,
    prune_spills: bool,
) -> str | None:
    """Why a compiled config cannot run on the device, from its compile-time resource usage
    (None: it can); `res` None means it did not compile."""
    if res is None:
        return "did not compile"
    threads = block_threads(config)
    if threads > limits.max_threads_per_block:
        return f"{threads} threads per block > {limits.max_threads_per_block}"
    if res.registers * threads > limits.max_registers_per_block:
        return f"{res.registers} registers x {threads} threads > {limits.max_registers_per_block} per block"
    shared = res.shared_bytes + shared_dynamic(config)
    limit = shared_limit(limits)
    if shared > limit:
        # above 48 KiB the launch sets MAX_DYNAMIC_SHARED_SIZE_BYTES, up to the device's opt-in limit
        return f"{shared} bytes of shared memory ({res.shared_bytes} static + {shared - res.shared_bytes} dynamic) > {limit} per block"
    if prune_spills and (res.spill_stores or res.spill_loads):
        return f"spills registers ({res.spill_stores} B stores, {res.spill_loads} B loads)"
    return None


def shared_limit(limits: Limits) -> int:
    """The most shared memory (static and dynamic) a block may use on the device: its opt-in
    limit, which the launch opts into above 48 KiB (a worker that does not report it: the plain
    per-block limit, protocol.Limits)."""
    return max(limits.max_shared_memory_per_block_optin, limits.max_shared_memory_per_block)


def provenance(device: DeviceInfo, compiler: str) -> dict[str, Any]:
    """Where and with what an entry was tuned. `nvrtc` (major.minor) is what NvrtcPolicy
    compares; `nvrtc_build` (the wheel's full version) says which binaries were measured."""
    try:
        from importlib.metadata import version

        cuda_python = version("cuda-bindings")
    except Exception:
        cuda_python = "unknown"
    return {
        "gpu": device.name,
        "cc": ".".join(str(c) for c in device.cc),
        "driver": device.driver,
        "driver_release": device.driver_release,
        "nvrtc": compiler,
        "nvrtc_build": compile_mod.nvrtc_build(int(compiler.split(".")[0])),
        "cuda_bindings": cuda_python,
        "hatch_autotune": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
    }


def strategy_text(search: SearchSpec) -> str:
    """'strategy auto, budget 15% of the space or 5 s': the search, for the log and the reasons."""
    limits = [f"{search.budget} configs" if isinstance(search.budget, int) else f"{search.budget} of the space"] if search.budget else []
    limits += [f"{search.seconds:g} s"] if search.seconds else []
    return f"strategy {search.strategy}" + (f", budget {' or '.join(limits)}" if limits else "")


# ---- the bucket ----------------------------------------------------------------------------


class BucketTuning:
    """One bucket tuned in one worker session: `run` returns its lock entry. It keeps what the
    search has learnt so far: every measurement, the leader (the fastest config timed in full:
    the worker stops a clear loser against it early), which config's outputs became the
    reference and what it was checked against, the search's clock, the worker's time per phase,
    and where the bucket's own wall time went (`costs`: what is neither compiling nor
    measuring is the fixed cost the lock's provenance reports)."""

    def __init__(
        self,
        session: WorkerSession,
        job: BucketJob,
        binaries: VariantBinaries,
        warm: WarmStart,
        root: Path,
        tmp: Path,
        log: Log,
        compiler: str,
        compare: CompareBinaries | None = None,
    ):
        self.session, self.job, self.binaries, self.warm = session, job, binaries, warm
        self.root, self.tmp, self.log, self.compiler, self.compare = root, tmp, log, compiler, compare
        self.configs = job.inst.configs
        self.key = job.bucket.as_dict()  # what the launch geometry and the inputs read
        # The configs that may serve this point (plan/exclusions.py), in canonical order: the
        # others are never compiled nor measured here, and the lock entry counts them by reason.
        self.excluded = job.inst.excluded(job.point)
        self.candidates = [i for i in range(len(self.configs)) if i not in self.excluded]
        default = job.inst.point_default(job.point)
        assert default is not None, f"{job.eid}: no config may serve it (make_plan refuses such a point)"
        self.default = default  # the default config, or where it may not run here the first config that may
        self.measurements: dict[int, Measurement] = {}
        self.best: Measurement | None = None  # the leader
        self.reference: int | None = None  # the config whose outputs are the reference (None: the user's, or none yet)
        self.reference_text = ""  # what the lock records: what every variant was verified against
        self.seconds = 0.0  # the search's clock: compiling and measuring
        self.phases: dict[str, float] = {}  # the worker's seconds per phase, summed over the bucket
        self.costs: dict[str, float] = dict.fromkeys(COSTS, 0.0)  # the bucket's wall time, by where it went
        self.total = len(self.candidates)
        self.setup: Setup | None = None
        self.info: DeviceInfo | None = None
        self.runoff: RunoffResult | None = None  # the runoff among the search's contenders, if one was run

    def run(self) -> LockEntry:
        """Set the bucket up (its first configs compiling meanwhile), settle the reference,
        then search its configs (the default and the warm starts first) within the kernel's
        search budget, measuring each in the worker, and return its lock entry."""
        began = time.monotonic()
        job, search = self.job, self.job.spec.search
        self.info = self.session.info or self.session.hello()
        default_index = self.default
        first = [default_index, *(i for i in self.warm.first if i not in self.excluded)]
        self.binaries.request(first)  # compiling while the worker makes the inputs
        self.setup = bucket_setup(job, self.root, self.tmp, self.session, self.compare)
        t = time.monotonic()
        ready = self.session.setup(self.setup)
        self.costs["setup"] = time.monotonic() - t
        self.phases.update(ready.phases)  # inputs (made, or waited for when made ahead), upload
        t, waited, measured_s = time.monotonic(), self.costs["compile_wait"], self.costs["measure"]
        settled = settle_reference(self, job.spec, job.eid, default_index, self.log)
        self.reference, self.reference_text = settled.index, settled.text
        self.costs["reference"] = time.monotonic() - t - (self.costs["compile_wait"] - waited) - (self.costs["measure"] - measured_s)
        cand = self.candidates  # the search sees the candidates only: its positions are theirs
        local = {g: j for j, g in enumerate(cand)}
        budget = search.budget_for(len(cand))
        self.total = search.configs_tried(len(cand))
        seed = zlib.crc32(f"{search.seed}:{job.eid}".encode())
        prior = [[p[g] for g in cand] for p in self.warm.prior] if self.excluded else self.warm.prior
        space = SearchSpace(job.spec.space, [self.configs[g] for g in cand])
        strategy = make_strategy(search.strategy, space, seed, [local[g] for g in first], prior)
        b, own = self.binaries, [0.0]
        run_search(
            strategy,
            lambda j: self.measure(cand[j]),
            budget,
            clock=lambda: self.seconds,
            prepare=lambda batch: b.request([cand[j] for j in batch]),
            prefetch=lambda batch: b.prefetch([cand[j] for j in batch]),
            ahead=b.workers,
            own_time=own,
        )
        self.costs["search"] = own[0]
        self.runoff = self._runoff(default_index)
        self.costs["wall"] = time.monotonic() - began
        self.costs["overhead"] = self.costs["wall"] - self.costs["compile_wait"] - self.costs["measure"]
        return self._result().entry(lambda i: self.binaries.get(i).log, self.log)

    @contextmanager
    def _compiling(self) -> Iterator[None]:
        """The time inside counted as waiting for NVRTC."""
        t = time.monotonic()
        try:
            yield
        finally:
            self.costs["compile_wait"] += time.monotonic() - t

    def _unrunnable(self, i: int) -> str | None:
        """Why config i cannot run on the device (it did not compile, or exceeds a limit)."""
        job, spec, config = self.job, self.job.spec, self.configs[i]
        assert self.info is not None
        with self._compiling():
            result = self.binaries.get(i)

        def env(c: Mapping[str, Any]) -> dict[str, Any]:
            return {**self.key, **spec.dims, **c, **spec.type_env(job.types)}

        return prune_reason(
            config,
            result.resources if result.ok else None,
            lambda c: math.prod(int(e(env(c))) for e in spec.block),
            lambda c: int(spec.shared(env(c))),
            self.info.limits,
            self.session.settings.prune_spills,
        )

    def _file(self, i: int) -> str:
        with self._compiling():
            return self.binaries.file(i, self.tmp)

    # -- what settling the reference asks (reference.py) -----------------------------------

    def runnable(self, ranked: Sequence[int], limit: int) -> Iterator[int]:
        """The configs of `ranked` that can run, in that order, compiled a pool's worth at a
        time; at most `limit` looked at (a bound on what settling the reference compiles)."""
        ranked = [i for i in ranked if i not in self.excluded][:limit]
        ranked = [i for i in ranked if i not in self.measurements]
        step = max(1, self.binaries.workers)
        for lo in range(0, len(ranked), step):
            batch = ranked[lo : lo + step]
            self.binaries.request(batch)
            for i in batch:
                reason = self._unrunnable(i)
                if reason is None:
                    yield i
                else:
                    self.record(measured(i, self.configs[i], Status.PRUNED, reason=reason))

    def adopt(self, i: int) -> None:
        """Config i's outputs made the reference in the worker; WorkerDied when it died doing
        so, the time that took counted as measuring."""
        vid, binary = self.job.variants[i].id, self._file(i)
        asked = time.monotonic()
        try:
            self.session.reference(Reference(vid, binary))
        except WorkerDied:
            self.costs["measure"] += time.monotonic() - asked
            raise

    def check(self, i: int) -> tuple[bool, str | None]:
        """Run config i once against the reference without timing it: whether it ran (one
        that did not is recorded as failed), and why its outputs disagree (None: they agree)."""
        vid, binary = self.job.variants[i].id, self._file(i)
        asked = time.monotonic()
        try:
            reply = self.session.measure(Measure(vid, binary, None, timed=False))
        except WorkerDied as exc:
            reply = Failure(str(exc))
        if isinstance(reply, Failure):  # the time a crash or hang took is its measurement's, not the reference's
            self.costs["measure"] += time.monotonic() - asked
            self.record(measured(i, self.configs[i], Status.FAILED, reason=reply.error or "unknown error"))
            return False, reply.error
        return True, (reply.reason or "wrong result") if reply.status == Status.REJECTED else None

    # -- the search ------------------------------------------------------------------------

    def record(self, m: Measurement) -> float | None:
        """Keep a config's measurement; its time for the search (None: it did not run)."""
        self.measurements[m.index if m.index is not None else -1] = m
        if (
            m.status == Status.OK
            and m.median_ms is not None
            and (self.best is None or self.best.median_ms is None or m.median_ms < self.best.median_ms)
        ):
            self.best = m
        done = len(self.measurements)
        if done % PROGRESS_EVERY == 0 and done < self.total:
            rejected = sum(x.status in (Status.REJECTED, Status.FAILED) for x in self.measurements.values())
            best = self.best
            lead = f"best so far {best.config} {best.median_ms:.4f} ms" if best else "none timed yet"
            self.log(f"  {self.job.eid}: {done}/{self.total} configs done, {rejected} rejected or failed; {lead}")
        return m.median_ms if m.status in TIMED else None

    def measure(self, i: int) -> float | None:
        """Config i pruned, or measured in the worker; its time for the search. A config that
        settling the reference found failed or pruned is not run again."""
        if i in self.measurements:
            known = self.measurements[i]
            return known.median_ms if known.status in TIMED else None
        config = self.configs[i]
        started = time.monotonic()
        reason = self._unrunnable(i)
        if reason:
            self.seconds += time.monotonic() - started
            return self.record(measured(i, config, Status.PRUNED, reason=reason))
        variant, binary = self.job.variants[i].id, self._file(i)
        leader = self.best.median_ms if self.best is not None else None
        asked = time.monotonic()
        reply = self._in_worker(Measure(variant, binary, leader))
        # a replayed device reports its simulated time; a GPU's is the wall clock
        seconds = reply.seconds if not isinstance(reply, Failure) else None
        self.seconds += (asked - started) + (seconds if seconds is not None else time.monotonic() - asked)
        if isinstance(reply, Failure):
            return self.record(measured(i, config, Status.FAILED, reason=reply.error or "unknown error"))
        m = measured(i, config, reply.status, reply.samples, reply.reason)
        if self.reference == i:
            m = replace(m, reason=REFERENCE_NOTE)
        return self.record(m)

    def _in_worker(self, request: Measure) -> Measured | Failure:
        """The worker's reply to a timed measurement (a worker that died: a Failure saying
        how), its time counted as measuring and its phases added up."""
        asked = time.monotonic()
        try:
            reply = self.session.measure(request)
        except WorkerDied as exc:
            reply = Failure(str(exc))
        finally:
            self.costs["measure"] += time.monotonic() - asked
        if not isinstance(reply, Failure):
            for phase, s in reply.phases.items():
                self.phases[phase] = self.phases.get(phase, 0.0) + s
        return reply

    def _retime(self, i: int) -> Sequence[float] | str:
        """Config i timed again for a runoff round, in full (no leader to stop it early): its
        timings, or why it failed (crashed, hung, or gave a wrong result this time)."""
        reply = self._in_worker(Measure(self.job.variants[i].id, self._file(i), None))
        if isinstance(reply, Failure):
            return reply.error or "unknown error"
        if reply.status != Status.OK or not reply.samples:
            return reply.reason or f"status {reply.status}"
        return reply.samples

    def _runoff(self, default_index: int) -> RunoffResult | None:
        """Time the search's contenders again, interleaved (choice.run_runoff), and keep their
        runoff measurements in place of the search's; None when there is nothing to decide
        (one contender) or the settings turn it off (`runoff-rounds = 0`)."""
        rounds = self.session.settings.runoff_rounds
        field = contenders(list(self.measurements.values()))
        if rounds <= 0 or len(field) < 2:
            return None
        self.log(f"  {self.job.eid}: runoff of {len(field)} configs the search could not tell apart, {rounds} interleaved rounds")
        result = run_runoff(field, self._retime, rounds, default_index)
        for m in result.measurements:
            assert m.index is not None
            self.measurements[m.index] = replace(m, reason=REFERENCE_NOTE) if self.reference == m.index and m.status == Status.OK else m
        return result

    def _result(self) -> BucketResult:
        """What the bucket's tuning found, for its log line and its lock entry."""
        job, spec = self.job, self.job.spec
        assert self.info is not None
        return BucketResult(
            eid=job.eid,
            checksum=job.point.checksum,
            configs=self.configs,
            default_index=self.default,
            candidates=self.candidates,
            excluded=summary(self.excluded),
            default=self.configs[self.default],  # what the point runs untuned: the default, where it may run here
            measurements=self.measurements,
            runoff=self.runoff,
            strategy=strategy_text(spec.search),
            seconds=self.seconds,
            prior=len(self.warm.prior),
            phases=self.phases,
            costs=self.costs,
            reference=self.reference_text,
            provenance={**provenance(self.info, self.compiler), "timing": spec.timing.text()},
        )


def bucket_setup(job: BucketJob, root: Path, tmp: Path, session: WorkerSession, compare: CompareBinaries | None) -> Setup:
    """The Setup of a bucket: the recipe of its inputs (the worker makes them, and the user's
    reference outputs), its tolerances and its compare kernels."""
    spec = job.spec
    outputs = [a for a in spec.args if a.is_array and a.intent != "in"]
    dtypes = [job.types.get(a.dtype, a.dtype) for a in outputs]
    return Setup(
        kernel=kernel_decl(spec),  # the runtime's view of the kernel
        configs={v.id: v.config_dict for v in job.variants},  # every candidate variant of the bucket
        types=job.types,
        key=job.bucket,
        inputs=bucket_recipe(job, root),
        tolerances={a.name: tolerance(d, spec.tolerance) for a, d in zip(outputs, dtypes)},
        settings=spec.timing.applied(session.settings),  # timed as the kernel declares (`timing`)
        binaries={},  # each request names its variant's binary: they are compiled as the search goes
        comparers=compare.files(tmp, dtypes) if compare is not None else {},
    )


def bucket_recipe(job: BucketJob, root: Path) -> InputRecipe:
    """The recipe of a bucket's inputs, seeded by its entry id: the same data whoever makes it."""
    return InputRecipe.of(job.spec, job.types, job.bucket.as_dict(), root, seed=zlib.crc32(job.eid.encode()))
