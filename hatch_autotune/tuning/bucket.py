"""One bucket's tuning: its inputs and reference made once, then the search over its configs
(the default and the warm starts first) within the kernel's budget, each config pruned or
measured in the worker, and the winner chosen among near-ties; the result is its lock entry.
The core loop of Triton's autotuner: prune -> measure (verify, then time) -> choose. The
decisions (`prune_reason`, `choose_winner`) are plain functions, tested on the CPU."""

from __future__ import annotations

import datetime
import math
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import __version__
from ..compile import nvrtc as compile_mod
from ..compile.render import Variant
from ..declare.config import KernelSpec, SearchSpec
from ..declare.kernel_json import kernel_json
from ..lock import TIMED, Bucket, LockEntry, Measurement
from ..plan.planner import Instance, Point
from ..text import log_excerpt
from .bench import median, spread
from .binaries import VariantBinaries
from .errors import TuningError
from .inputs import bucket_inputs, reference_outputs
from .protocol import DeviceInfo, Failure, Limits, Measure, Reference, Setup
from .search import SearchSpace, WarmStart, make_strategy, run_search
from .session import WorkerSession
from .verify import tolerance
from .worker import WorkerDied

Log = Callable[[str], None]
TIE_FLOOR = 0.005  # timings closer than 0.5% are a tie whatever the measured spread
PROGRESS_EVERY = 16  # configs between progress lines within a bucket
REFERENCE_NOTE = "reference (no user reference configured)"  # the reason of the config whose outputs became the reference


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


def measured(index: int, config: Mapping[str, Any], status: str, samples: Sequence[float] = (), reason: str = "") -> Measurement:
    """The measurement of a config from its timings (ms; none for a config that was not timed),
    its median and spread exact: the lock rounds them (Measurement.as_recorded)."""
    if not samples:
        return Measurement(index, config, status, 0, reason=reason)
    return Measurement(index, config, status, len(samples), median(samples), spread(samples), reason)


def choose_winner(measurements: Sequence[Measurement], default_index: int) -> Measurement | None:
    """The fastest by median; among near-ties (within the measured spread, or 0.5%), the
    canonical one: the default if it is tied, else the lowest config index. None if none ran."""
    ok = [(m.median_ms, m.spread_ms or 0.0, m) for m in measurements if m.status == "ok" and m.samples and m.median_ms is not None]
    if not ok:
        return None
    best_ms, best_spread, best = min(ok, key=lambda t: (t[0], t[2].index))
    tied = [m for ms, sp, m in ok if ms - best_ms <= max(best_spread, sp, TIE_FLOOR * best_ms)]
    for m in tied:
        if m.index == default_index:
            return m
    return min(tied, key=lambda m: m.index if m.index is not None else math.inf)


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
    reference, the search's clock and the worker's time per phase."""

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
    ):
        self.session, self.job, self.binaries, self.warm = session, job, binaries, warm
        self.root, self.tmp, self.log, self.compiler = root, tmp, log, compiler
        self.configs = job.inst.configs
        self.key = job.bucket.as_dict()  # what the launch geometry and the inputs read
        self.measurements: dict[int, Measurement] = {}
        self.best: Measurement | None = None  # the leader
        self.reference: int | None = None  # the config whose outputs are the reference (None: the user's, or none yet)
        self.seconds = 0.0  # the search's clock: compiling and measuring
        self.phases: dict[str, float] = {}  # the worker's seconds per phase, summed over the bucket
        self.total = len(self.configs)
        self.setup: Setup | None = None
        self.user_reference = False
        self.info: DeviceInfo | None = None

    def run(self) -> LockEntry:
        """Search the bucket's configs (the default and the warm starts first) within the
        kernel's search budget, measuring each in the worker, and return its lock entry."""
        job, search = self.job, self.job.spec.search
        self.setup = self._setup()
        self.info = self.session.info or self.session.hello()
        if self.user_reference:
            self.session.prepare([self.setup])
        budget = search.budget_for(len(self.configs))
        self.total = search.configs_tried(len(self.configs))
        default_index = job.inst.default_index
        seed = zlib.crc32(f"{search.seed}:{job.eid}".encode())
        strategy = make_strategy(
            search.strategy, SearchSpace(job.spec.space, self.configs), seed, [default_index, *self.warm.first], self.warm.prior
        )
        b = self.binaries
        run_search(strategy, self.measure, budget, clock=lambda: self.seconds, prepare=b.request, prefetch=b.prefetch, ahead=b.workers)
        return self._entry()

    def _setup(self) -> Setup:
        """The bucket's inputs and (when the kernel has a reference function) reference outputs,
        written for the worker, and the Setup that names them."""
        import numpy as np

        job, spec = self.job, self.job.spec
        inputs = bucket_inputs(spec, job.types, self.key, self.root, seed=zlib.crc32(job.eid.encode()))
        arrays: dict[str, Any] = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
        scalars = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in inputs.items() if not isinstance(v, np.ndarray)}
        inputs_file = self.tmp / "inputs.npz"
        np.savez(inputs_file, **arrays)
        reference = reference_outputs(spec, inputs, self.root, job.types)
        reference_file = None
        if reference is not None:
            reference_file = self.tmp / "reference.npz"
            np.savez(reference_file, **reference)
        self.user_reference = reference is not None
        outputs = [a for a in spec.args if a.is_array and a.intent != "in"]
        return Setup(
            name=spec.name,
            # the runtime's view of the kernel, with every candidate variant of the bucket
            kernel={**kernel_json(spec), "variants": {v.id: {"config": v.config_dict} for v in job.variants}},
            types=job.types,
            key=job.bucket,
            inputs=str(inputs_file),
            scalars=scalars,
            reference=str(reference_file) if reference_file else None,
            tolerances={a.name: tolerance(job.types.get(a.dtype, a.dtype), spec.tolerance) for a in outputs},
            settings=self.session.settings,
            binaries={},  # each request names its variant's binary: they are compiled as the search goes
        )

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
        """Config i pruned, or measured in the worker; its time for the search."""
        job, spec, settings, config = self.job, self.job.spec, self.session.settings, self.configs[i]
        assert self.setup is not None and self.info is not None
        started = time.monotonic()
        result = self.binaries.get(i)
        env = lambda c: {**self.key, **c, **spec.type_env(job.types)}  # noqa: E731
        reason = prune_reason(
            config,
            result.resources if result.ok else None,
            lambda c: math.prod(int(e(env(c))) for e in spec.block),
            lambda c: int(spec.shared(env(c))),
            self.info.limits,
            settings.prune_spills,
        )
        if reason:
            self.seconds += time.monotonic() - started
            return self._record(measured(i, config, "pruned", reason=reason))
        variant, binary = job.variants[i].id, self.binaries.file(i, self.tmp)
        leader = self.best.median_ms if self.best is not None else None
        try:
            if not self.user_reference and self.reference is None:  # the first config that runs becomes the reference
                self.session.prepare([self.setup, Reference(variant, binary)])
                self.reference = i
            asked = time.monotonic()
            reply = self.session.measure(Measure(variant, binary, leader))
        except WorkerDied as exc:
            self.seconds += time.monotonic() - started
            return self._record(measured(i, config, "failed", reason=str(exc)))
        # a replayed device reports its simulated time; a GPU's is the wall clock
        seconds = reply.seconds if not isinstance(reply, Failure) else None
        self.seconds += (asked - started) + (seconds if seconds is not None else time.monotonic() - asked)
        if isinstance(reply, Failure):
            return self._record(measured(i, config, "failed", reason=reply.error or "unknown error"))
        for phase, s in reply.phases.items():
            self.phases[phase] = self.phases.get(phase, 0.0) + s
        m = measured(i, config, reply.status, reply.samples, reply.reason)
        if self.reference == i:
            m = replace(m, reason=REFERENCE_NOTE)
        return self._record(m)

    def _entry(self) -> LockEntry:
        """The lock entry: the winner, every config's measurement (skipped ones too), the
        default's time and where it was measured; TuningError when nothing ran."""
        job, spec, search, configs = self.job, self.job.spec, self.job.spec.search, self.configs
        assert self.info is not None
        default_index, measurements = job.inst.default_index, self.measurements
        skipped = f"not tried by the search ({strategy_text(search)})"
        ordered = [measurements.get(i) or measured(i, configs[i], "skipped", reason=skipped) for i in range(len(configs))]
        winner = choose_winner(ordered, default_index)
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
        )
        return LockEntry(
            checksum=job.point.checksum,
            config=winner.config,
            tuned=True,
            index=winner.index,
            default=dict(spec.default),
            default_ms=round(default_ms, 6) if default_ms else None,
            measurements=tuple(m.as_recorded() for m in ordered),
            provenance=provenance(self.info, self.compiler),
        )


def tune_bucket(
    session: WorkerSession, job: BucketJob, binaries: VariantBinaries, warm: WarmStart, root: Path, tmp: Path, log: Log, compiler: str
) -> LockEntry:
    """One bucket's lock entry, tuned in `session` (BucketTuning): what a local GPU and a Ray
    actor both run."""
    return BucketTuning(session, job, binaries, warm, root, tmp, log, compiler).run()
