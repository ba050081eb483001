"""One bucket's tuning: its inputs and reference made once, then the search over its configs
(the default and the warm starts first) within the kernel's budget, each config pruned or
measured in the worker, and the winner chosen in a runoff of the configs the search could not
tell apart (choice.py); the result is its lock entry. The core loop of Triton's autotuner:
prune -> measure (verify, then time) -> choose. The decisions (`prune_reason`, choice.py's)
are plain functions, tested on the CPU."""

from __future__ import annotations

import datetime
import math
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from .. import __version__
from ..compile import nvrtc as compile_mod
from ..compile.render import Variant
from ..declare.config import KernelSpec, SearchSpec
from ..declare.kernel_json import kernel_json
from ..lock import TIMED, Bucket, LockEntry, Measurement, Runoff
from ..plan.planner import PROVENANCE_MAX_CHARS, Instance, Point
from ..text import log_excerpt
from .binaries import CompareBinaries, VariantBinaries
from .choice import RunoffResult, choose_winner, contenders, measured, run_runoff
from .errors import TuningError
from .inputs import InputRecipe
from .protocol import DeviceInfo, Failure, Limits, Measure, Measured, Reference, Setup
from .search import SearchSpace, WarmStart, make_strategy, run_search
from .session import WorkerSession
from .verify import tolerance
from .worker import WorkerDied

Log = Callable[[str], None]
PROGRESS_EVERY = 16  # configs between progress lines within a bucket
REFERENCE_NOTE = "reference (no user reference configured)"  # the reason of the config whose outputs became the reference
WITNESS_LOOKS = 64  # configs looked at (compiled) for a second opinion on the reference, at most
DISSENT = 3  # witnesses that may disagree with the default before the majority is asked
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
    if res.shared_bytes + shared_dynamic(config) > limits.max_shared_memory_per_block:
        # the opt-in limit would need cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE), which the
        # launcher does not set: a larger block would fail to launch
        return f"{res.shared_bytes + shared_dynamic(config)} bytes of shared memory > {limits.max_shared_memory_per_block}"
    if prune_spills and (res.spill_stores or res.spill_loads):
        return f"spills registers ({res.spill_stores} B stores, {res.spill_loads} B loads)"
    return None


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
        "nvrtc_build": compile_mod.nvrtc_build(),
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
        self.measurements: dict[int, Measurement] = {}
        self.best: Measurement | None = None  # the leader
        self.reference: int | None = None  # the config whose outputs are the reference (None: the user's, or none yet)
        self.reference_text = ""  # what the lock records: what every variant was verified against
        self.seconds = 0.0  # the search's clock: compiling and measuring
        self.phases: dict[str, float] = {}  # the worker's seconds per phase, summed over the bucket
        self.costs: dict[str, float] = dict.fromkeys(COSTS, 0.0)  # the bucket's wall time, by where it went
        self.total = len(self.configs)
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
        default_index = job.inst.default_index
        self.binaries.request([default_index, *self.warm.first])  # compiling while the worker makes the inputs
        self.setup = self._setup()
        t = time.monotonic()
        ready = self.session.setup(self.setup)
        self.costs["setup"] = time.monotonic() - t
        self.phases.update(ready.phases)  # inputs (made, or waited for when made ahead), upload
        t, waited, measured_s = time.monotonic(), self.costs["compile_wait"], self.costs["measure"]
        self._settle_reference()
        self.costs["reference"] = time.monotonic() - t - (self.costs["compile_wait"] - waited) - (self.costs["measure"] - measured_s)
        budget = search.budget_for(len(self.configs))
        self.total = search.configs_tried(len(self.configs))
        seed = zlib.crc32(f"{search.seed}:{job.eid}".encode())
        strategy = make_strategy(
            search.strategy, SearchSpace(job.spec.space, self.configs), seed, [default_index, *self.warm.first], self.warm.prior
        )
        b, own = self.binaries, [0.0]
        run_search(
            strategy,
            self.measure,
            budget,
            clock=lambda: self.seconds,
            prepare=b.request,
            prefetch=b.prefetch,
            ahead=b.workers,
            own_time=own,
        )
        self.costs["search"] = own[0]
        self.runoff = self._runoff(default_index)
        self.costs["wall"] = time.monotonic() - began
        self.costs["overhead"] = self.costs["wall"] - self.costs["compile_wait"] - self.costs["measure"]
        return self._entry()

    def _setup(self) -> Setup:
        """The Setup of the bucket: the recipe of its inputs (the worker makes them, and the
        user's reference outputs), its tolerances and its compare kernels."""
        job, spec = self.job, self.job.spec
        outputs = [a for a in spec.args if a.is_array and a.intent != "in"]
        dtypes = [job.types.get(a.dtype, a.dtype) for a in outputs]
        return Setup(
            name=spec.name,
            # the runtime's view of the kernel, with every candidate variant of the bucket
            kernel={**kernel_json(spec), "variants": {v.id: {"config": v.config_dict} for v in job.variants}},
            types=job.types,
            key=job.bucket,
            inputs=bucket_recipe(job, self.root),
            tolerances={a.name: tolerance(d, spec.tolerance) for a, d in zip(outputs, dtypes)},
            settings=self.session.settings,
            binaries={},  # each request names its variant's binary: they are compiled as the search goes
            comparers=self.compare.files(self.tmp, dtypes) if self.compare is not None else {},
        )

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
        env = lambda c: {**self.key, **c, **spec.type_env(job.types)}  # noqa: E731
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

    # -- the reference ---------------------------------------------------------------------

    def _runnable(self, ranked: Sequence[int], limit: int) -> Iterator[int]:
        """The configs of `ranked` that can run, in that order, compiled a pool's worth at a
        time; at most `limit` looked at (a bound on what settling the reference compiles)."""
        ranked = [i for i in ranked[:limit] if i not in self.measurements]
        step = max(1, self.binaries.workers)
        for lo in range(0, len(ranked), step):
            batch = ranked[lo : lo + step]
            self.binaries.request(batch)
            for i in batch:
                reason = self._unrunnable(i)
                if reason is None:
                    yield i
                else:
                    self._record(measured(i, self.configs[i], "pruned", reason=reason))

    def _check(self, i: int) -> tuple[bool, str | None]:
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
            self._record(measured(i, self.configs[i], "failed", reason=reply.error or "unknown error"))
            return False, reply.error
        return True, (reply.reason or "wrong result") if reply.status == "rejected" else None

    def _witness(self, chosen: Sequence[int], skip: set[int]) -> tuple[int, str | None] | None:
        """The runnable config most unlike the configs `chosen` so far (the most axes that
        differ, summed over them: each witness differs from the reference and from the other
        witnesses, so that a bug tied to one parameter value cannot outvote it), and its check
        against the reference (None: it agrees); None when no other config runs."""

        def unlike(i: int) -> int:
            return sum(self.configs[i].get(k) != v for c in chosen for k, v in self.configs[c].items())

        ranked = sorted((i for i in range(len(self.configs)) if i not in skip and i not in chosen), key=lambda i: (-unlike(i), i))
        for i in self._runnable(ranked, WITNESS_LOOKS - len(skip)):
            ran, why = self._check(i)
            skip.add(i)
            if ran:
                return i, why
        return None

    def _settle_reference(self) -> None:
        """What every variant is verified against. The kernel's reference function, when it
        declares one; else the outputs of the default config (or, if it cannot run, the first
        config that runs), trusted once a structurally different config agrees with them: a
        wrong default would otherwise make every variant "verified". Witnesses are checked
        until one agrees, at most DISSENT disagreeing; when all of those disagree with the
        default but agree among themselves, the default is the odd one out and the first of
        them becomes the reference; with no agreement anywhere nothing can be trusted, and the
        bucket is an error that says to declare a reference function."""
        job, spec = self.job, self.job.spec
        if spec.reference is not None:
            self.reference_text = f"the kernel's reference function {spec.reference}"
            return
        default = job.inst.default_index
        anchor = None
        for i in self._runnable([default, *(i for i in range(len(self.configs)) if i != default)], len(self.configs)):
            vid, binary = job.variants[i].id, self._file(i)
            asked = time.monotonic()
            try:
                self.session.reference(Reference(vid, binary))
            except WorkerDied as exc:
                self.costs["measure"] += time.monotonic() - asked
                self._record(measured(i, self.configs[i], "failed", reason=str(exc)))
                continue
            anchor = self.reference = i
            break
        if anchor is None:
            return  # nothing runs: the search finds every config failed or pruned, and says so
        name = "the default config" if anchor == default else f"config {anchor} (the default cannot run)"
        skip: set[int] = set()
        dissent: list[tuple[int, str]] = []
        while len(dissent) < DISSENT:
            found = self._witness([anchor, *(i for i, _ in dissent)], skip)
            if found is None:
                break
            i, why = found
            if why is None:
                others = f"; {len(dissent)} other config(s) disagreed, first config {dissent[0][0]}" if dissent else ""
                self.reference_text = f"{name}, cross-checked with config {i}{others}"
                return
            dissent.append((i, why))
        if not dissent:
            self.reference_text = f"{name}, not cross-checked: no other config runs"
            return
        described = lambda ix: ", ".join(f"config {i} {dict(self.configs[i])}" for i in ix)  # noqa: E731
        if len(dissent) == 1:
            raise TuningError(
                f"{job.eid}: the outputs of {described([anchor, dissent[0][0]])} differ ({dissent[0][1]}) and no third config "
                f"runs to tell which is right; declare a `reference` function for kernel {spec.name!r}"
            )
        first = dissent[0][0]
        self.session.reference(Reference(job.variants[first].id, self._file(first)))  # is it the default that is wrong?
        agreeing = [i for i, _ in dissent[1:] if self._check(i) == (True, None)]
        if agreeing:
            self.reference = first
            self.reference_text = f"config {first}, cross-checked with config {agreeing[0]} ({name} disagreed with {len(dissent)} configs)"
            self.log(
                f"warning: {job.eid}: the outputs of {name} {dict(self.configs[anchor])} differ from those of configs "
                f"{', '.join(str(i) for i, _ in dissent)}, which agree with one another: it is rejected as wrong "
                f"(declare a `reference` function for kernel {spec.name!r} to verify against known-good outputs)"
            )
            return
        raise TuningError(
            f"{job.eid}: {described([anchor, *(i for i, _ in dissent)])} all give different results "
            f"({'; '.join(why for _, why in dissent)}): no output can be trusted as the reference; declare a `reference` "
            f"function for kernel {spec.name!r}"
        )

    # -- the search ------------------------------------------------------------------------

    def _record(self, m: Measurement) -> float | None:
        """Keep a config's measurement; its time for the search (None: it did not run)."""
        self.measurements[m.index if m.index is not None else -1] = m
        if (
            m.status == "ok"
            and m.median_ms is not None
            and (self.best is None or self.best.median_ms is None or m.median_ms < self.best.median_ms)
        ):
            self.best = m
        done = len(self.measurements)
        if done % PROGRESS_EVERY == 0 and done < self.total:
            rejected = sum(x.status in ("rejected", "failed") for x in self.measurements.values())
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
            return self._record(measured(i, config, "pruned", reason=reason))
        variant, binary = self.job.variants[i].id, self._file(i)
        leader = self.best.median_ms if self.best is not None else None
        asked = time.monotonic()
        reply = self._in_worker(Measure(variant, binary, leader))
        # a replayed device reports its simulated time; a GPU's is the wall clock
        seconds = reply.seconds if not isinstance(reply, Failure) else None
        self.seconds += (asked - started) + (seconds if seconds is not None else time.monotonic() - asked)
        if isinstance(reply, Failure):
            return self._record(measured(i, config, "failed", reason=reply.error or "unknown error"))
        m = measured(i, config, reply.status, reply.samples, reply.reason)
        if self.reference == i:
            m = replace(m, reason=REFERENCE_NOTE)
        return self._record(m)

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
        if reply.status != "ok" or not reply.samples:
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
            self.measurements[m.index] = replace(m, reason=REFERENCE_NOTE) if self.reference == m.index and m.status == "ok" else m
        return result

    def _entry(self) -> LockEntry:
        """The lock entry: the winner, every config's measurement (skipped ones too), the
        default's time and where it was measured; TuningError when nothing ran."""
        job, spec, search, configs = self.job, self.job.spec, self.job.spec.search, self.configs
        assert self.info is not None
        default_index, measurements = job.inst.default_index, self.measurements
        skipped = f"not tried by the search ({strategy_text(search)})"
        ordered = [measurements.get(i) or measured(i, configs[i], "skipped", reason=skipped) for i in range(len(configs))]
        winner = self.runoff.winner if self.runoff is not None and self.runoff.winner is not None else choose_winner(ordered, default_index)
        if winner is None or winner.median_ms is None:
            first = next((m for m in ordered if m.status in ("failed", "rejected", "pruned")), ordered[0])
            detail = (
                f":\n{log_excerpt(self.binaries.get(first.index).log)}"
                if first.reason == "did not compile" and first.index is not None
                else ""
            )
            tried = "tried " if len(measurements) < len(configs) else ""
            raise TuningError(f"{job.eid}: every variant {tried}failed or was rejected; the first ({first.config}): {first.reason}{detail}")
        default = measurements.get(default_index)
        default_ms = default.median_ms if default is not None and default.status == "ok" else None
        counts = {s: sum(m.status == s for m in ordered) for s in ("ok", "eliminated", "rejected", "failed", "pruned")}
        searched = (
            f", {len(measurements)} tried ({strategy_text(search)}, {self.seconds:.1f} s)" if len(measurements) < len(configs) else ""
        )
        self.log(
            f"tuned {job.eid}: {len(configs)} configs{searched}, {counts['ok'] + counts['eliminated']} measured "
            f"({counts['eliminated']} eliminated early), {counts['rejected']} rejected, {counts['failed']} failed, "
            f"{counts['pruned']} pruned; best {winner.config} {winner.median_ms:.4f} ms"
            + (f" ({default_ms / winner.median_ms:.2f}x the default)" if default_ms else "")
            + (f"; prior: the times of {len(self.warm.prior)} earlier result(s)" if self.warm.prior else "")
            + (f"; worker {', '.join(f'{k} {v:.1f} s' for k, v in self.phases.items())}" if self.phases else "")
            + f"; fixed cost {self.costs['overhead']:.2f} s (setup {self.costs['setup']:.2f}, reference {self.costs['reference']:.2f}, search {self.costs['search']:.2f})"
            + f"; verified against {self.reference_text}"
            + (f"; {runoff_text(self.runoff.record)}" if self.runoff is not None else "")
        )
        return LockEntry(
            checksum=job.point.checksum,
            config=winner.config,
            tuned=True,
            index=winner.index,
            default=dict(spec.default),
            default_ms=round(default_ms, 6) if default_ms else None,
            measurements=tuple(m.as_recorded() for m in ordered),
            provenance={
                **provenance(self.info, self.compiler),
                "reference": self.reference_text[:PROVENANCE_MAX_CHARS],
                "phases": {k: round(v, 4) for k, v in {**self.costs, **self.phases}.items()},
            },
            runoff=self.runoff.record if self.runoff is not None else None,
        )


def runoff_text(record: Runoff) -> str:
    """'runoff of 3 configs, 5 rounds: the winner 1.2% ahead of the next, fastest in 4 rounds'."""
    n = len(record.contenders)
    if record.margin is None:
        return f"runoff of {n} configs, {record.rounds} rounds: the others failed"
    lead = (
        f"{record.margin:.1%} ahead of the next"
        if record.margin >= 0
        else f"chosen within {-record.margin:.1%} of a faster one (a near-tie)"
    )
    return f"runoff of {n} configs, {record.rounds} rounds: the winner {lead}, fastest in {record.rounds_won} round(s)"


def bucket_recipe(job: BucketJob, root: Path) -> InputRecipe:
    """The recipe of a bucket's inputs, seeded by its entry id: the same data whoever makes it."""
    return InputRecipe.of(job.spec, job.types, job.bucket.as_dict(), root, seed=zlib.crc32(job.eid.encode()))
