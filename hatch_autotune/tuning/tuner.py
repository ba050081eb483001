"""Orchestration: which entries to tune, which variants to measure, and which one wins.

The core loop (after Triton's autotuner): prune -> measure (verify, then time, in the worker)
-> choose -> write the lock entry. Compilation runs ahead in a producer thread so that the
GPU is measuring one kernel while the next compiles. The decisions (pruning, search order,
the winner among near-ties, which entries are stale) are plain functions, tested on the CPU.
"""

from __future__ import annotations

import datetime
import json
import math
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import __version__
from ..compile import nvrtc as compile_mod
from ..compile.cache import CompileCache
from ..compile.tiers import open_compile_cache
from ..plan.devices import Gpu, detect_gpus
from ..lock import TIMED, EntryId, LockEntry, LockFile, LockFormatError
from ..text import instance_text, log_excerpt
from ..plan.planner import Instance, Plan, Point, make_plan, resolve_archs, target_archs
from ..declare.kernel_json import kernel_json
from ..errors import BuildError
from ..declare.config import ProjectSpec, SearchSpec, TuningSpec
from .bench import median, spread
from .inputs import bucket_inputs, input_bytes, reference_outputs
from .schedule import Job, ScheduleResult, Slot, run_schedule, text_table
from .search import MAX_PRIORS, Budget, SearchSpace, WarmStart, make_strategy, run_search, uses_prior
from .verify import tolerance
from .worker import WorkerClient, WorkerDied

Log = Callable[[str], None]
TIE_FLOOR = 0.005  # timings closer than 0.5% are a tie whatever the measured spread
PROGRESS_EVERY = 16  # configs between progress lines within a bucket
# Scheduling: a bucket's inputs are made on the host (drawn, written, loaded and uploaded by the
# worker) before anything is measured, seconds per GiB; counting 8 MiB as one more config puts a
# bucket of 1 GiB (128 configs more) early rather than last, where it would stretch the run's
# tail. A rough figure that only orders the jobs; erring high costs little, since the biggest
# inputs also make the longest measurements.
HOST_BYTES_PER_CONFIG = 8 << 20


class TuningError(BuildError):
    """Tuning cannot go on (no GPU, every variant of a bucket failed); the message says why."""


@dataclass
class Measurement:
    """What happened to one config in one bucket."""

    index: int
    config: dict[str, Any]
    status: str  # ok | eliminated | rejected | failed | pruned | skipped
    samples: tuple[float, ...] = ()
    reason: str = ""

    @property
    def median_ms(self) -> float | None:
        return median(self.samples) if self.samples else None

    @property
    def spread_ms(self) -> float | None:
        return spread(self.samples) if self.samples else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "config": self.config, "status": self.status, "samples": len(self.samples)}
        if self.samples:
            out["median_ms"] = round(self.median_ms, 6)
            out["spread_ms"] = round(self.spread_ms, 6)
        if self.reason:
            out["reason"] = self.reason
        return out


# ---- decisions ---------------------------------------------------------------------------


def prune_reason(
    config: Mapping[str, Any],
    res: Any,
    block_threads: Callable[[Mapping[str, Any]], int],
    shared_dynamic: Callable[[Mapping[str, Any]], int],
    limits: Mapping[str, int],
    prune_spills: bool,
) -> str | None:
    """Why a compiled config cannot run on the device, from its compile-time resource usage
    (None: it can); `res` None means it did not compile."""
    if res is None:
        return "did not compile"
    threads = block_threads(config)
    if threads > limits["max_threads_per_block"]:
        return f"{threads} threads per block > {limits['max_threads_per_block']}"
    if res.registers * threads > limits["max_registers_per_block"]:
        return f"{res.registers} registers x {threads} threads > {limits['max_registers_per_block']} per block"
    if res.shared_bytes + shared_dynamic(config) > limits["max_shared_memory_per_block"]:
        # the opt-in limit would need cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE), which the
        # launcher does not set: a larger block would fail to launch
        return f"{res.shared_bytes + shared_dynamic(config)} bytes of shared memory > {limits['max_shared_memory_per_block']}"
    if prune_spills and (res.spill_stores or res.spill_loads):
        return f"spills registers ({res.spill_stores} B stores, {res.spill_loads} B loads)"
    return None


MAX_WARM = 8  # warm-start configs measured first, at most


def _related(lock: LockFile, point: Point) -> list[LockEntry]:
    """The tuned entries of the point's instance, likeliest to resemble it first: its own
    previous result, the same bucket on other archs, then the nearest buckets (log2 distance)."""
    me = point.id

    def distance(eid: EntryId) -> tuple:
        log_gap = sum(abs(math.log2(max(v, 1)) - math.log2(max(me.bucket.get(k, v), 1))) for k, v in eid.point)
        return (eid != me, log_gap, eid.arch != me.arch, str(eid))

    found = []
    for text, entry in lock.entries.items():
        try:
            eid = EntryId.parse(text)
        except LockFormatError:
            continue
        if entry.tuned and eid.kernel == me.kernel and eid.types == me.types:
            found.append((distance(eid), entry))
    return [entry for _, entry in sorted(found, key=lambda f: f[0])]


def warm_start(lock: LockFile, point: Point, configs: Sequence[Mapping[str, Any]], strategy: str = "auto") -> WarmStart:
    """What the lock, as it is when the run starts, tells this point's search: the winners of
    the related entries to measure first (`_related`'s order, at most MAX_WARM; a lock tuned on
    one GPU warm-starts the next), and to a strategy that uses one (`auto`), their times as its
    prior (`_speeds`)."""
    related = _related(lock, point)
    index = {_config_key(c): i for i, c in enumerate(configs)}
    picks = (index.get(_config_key(entry.config)) for entry in related)
    first = list(dict.fromkeys(i for i in picks if i is not None))[:MAX_WARM]
    prior = _speeds(related, index, len(configs)) if uses_prior(strategy) else []
    return WarmStart(tuple(first), tuple(tuple(s) for s in prior))


def _speeds(related: Sequence[LockEntry], index: Mapping[str, int], n_configs: int) -> list[list[float | None]]:
    """The measurements of the first related entries that measured more than one config (at
    most search.MAX_PRIORS), as each config's speed there relative to its fastest (0: failed,
    rejected or pruned there; None: not measured there). How much they help is measured by
    benchmarks/search_quality.py (`warm`)."""
    out = []
    for entry in related:
        times: dict[int, float] = {}  # config index -> median ms; inf where it did not run
        for m in entry.measurements:
            i = index.get(_config_key(m["config"]))
            ms = m.get("median_ms")
            if i is None or m.get("status") == "skipped":
                continue
            timed = m.get("status") in TIMED and isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 < ms < math.inf
            times[i] = min(times.get(i, math.inf), ms if timed else math.inf)
        fastest = min(times.values(), default=math.inf)
        if len(times) < 2 or math.isinf(fastest):
            continue
        speeds: list[float | None] = [None] * n_configs
        for i, t in times.items():
            speeds[i] = fastest / t
        out.append(speeds)
        if len(out) == MAX_PRIORS:
            break
    return out


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def choose_winner(measurements: Sequence[Measurement], default_index: int) -> Measurement | None:
    """The fastest by median; among near-ties (within the measured spread, or 0.5%), the
    canonical one: the default if it is tied, else the lowest config index. None if none ran."""
    ok = [m for m in measurements if m.status == "ok" and m.samples]
    if not ok:
        return None
    best = min(ok, key=lambda m: (m.median_ms, m.index))
    tied = [
        m
        for m in ok
        if m.median_ms - best.median_ms <= max(best.spread_ms, m.spread_ms, TIE_FLOOR * best.median_ms)
    ]
    for m in tied:
        if m.index == default_index:
            return m
    return min(tied, key=lambda m: m.index)


@dataclass(frozen=True)
class TuningPlan:
    """The target archs this machine tunes (each has a device here), all the target archs, and
    what it warns about."""

    archs: tuple[str, ...]
    targets: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what it decided, for the build log: not warnings


def _device(g: Gpu) -> str:
    return f"{g.ordinal} ({g.name or 'unnamed'}, {g.arch})"


def plan_tuning(project: ProjectSpec, gpus: Sequence[Gpu], mode: str) -> TuningPlan:
    """Every target arch that has a device here is tuned, on those devices only. `offline`
    tunes nothing; `tune` and `retune` need a device of a target arch (TuningError otherwise);
    `auto` without one builds from the lock, and says so in a note. One warning for target archs
    without a device, one for devices of other archs."""
    if mode == "offline":
        return TuningPlan(())
    if not gpus:
        if mode == "auto":
            lock = project.lock_file.name
            return TuningPlan((), notes=(f"mode auto: no GPU found on this machine, so nothing is tuned; the build takes the valid winners of {lock} and the default configs elsewhere",))
        raise TuningError(f"tuning (mode {mode!r}) needs a CUDA GPU on this machine and none was found")
    targets = resolve_archs(project, gpus)
    here = {g.arch for g in gpus}
    archs = tuple(a for a in targets if a in here)
    if not archs:
        why = f"no GPU here is of a target arch ({', '.join(targets)}); devices: {', '.join(map(_device, gpus))}"
        if mode == "auto":
            return TuningPlan((), targets, (f"{why}; not tuning",))
        raise TuningError(f"{why}; add their arch to `archs` or tune on a builder with such a GPU")
    warnings = []
    missing = [a for a in targets if a not in here]
    if missing:
        their = "its" if len(missing) == 1 else "their"
        warnings.append(f"no GPU here is {', '.join(missing)}: {their} entries are not tuned on this machine")
    others = [g for g in gpus if g.arch not in targets]
    if others:
        one = len(others) == 1
        warnings.append(
            f"device{'' if one else 's'} {', '.join(map(_device, others))} {'is' if one else 'are'} not of a target arch "
            f"({', '.join(targets)}): not tuning on {'it' if one else 'them'}"
        )
    return TuningPlan(archs, targets, tuple(warnings))


# ---- the engine --------------------------------------------------------------------------


@dataclass
class BucketJob:
    """One point to tune, with its type instance and (once compiled) every candidate's binary."""

    inst: Instance
    point: Point
    results: list[compile_mod.CompileResult] = field(default_factory=list)

    @property
    def spec(self) -> Any:  # KernelSpec
        return self.inst.spec

    @property
    def variants(self) -> list[Any]:  # list[Variant]
        return self.inst.variants

    @property
    def types(self) -> dict[str, str]:
        return self.inst.types

    @property
    def eid(self) -> str:
        return self.point.eid

    @property
    def key(self) -> dict[str, int]:
        return self.point.id.bucket


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
                    str(sum(m["status"] in ("ok", "eliminated") for m in ms)),
                    str(sum(m["status"] in ("rejected", "failed") for m in ms)),
                )
            )
        return text_table(rows)


def provenance(device: Mapping[str, Any], compiler: str) -> dict[str, Any]:
    """Where and with what an entry was tuned. `nvrtc` (major.minor) is what NvrtcPolicy
    compares; `nvrtc_build` (the wheel's full version) says which binaries were measured."""
    try:
        from importlib.metadata import version

        cuda_python = version("cuda-bindings")
    except Exception:
        cuda_python = "unknown"
    return {
        "gpu": device["name"],
        "cc": ".".join(str(c) for c in device["cc"]),
        "driver": device["driver"],
        "nvrtc": compiler,
        "nvrtc_build": compile_mod.nvrtc_build(),
        "cuda_bindings": cuda_python,
        "hatch_autotune": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
    }


class _Session:
    """A worker plus what it must be told again after a restart (hello, then the bucket setup)."""

    def __init__(self, client: WorkerClient, device: int, settings: TuningSpec):
        self.client, self.device, self.settings = client, device, settings
        self.info: dict[str, Any] | None = None
        self._setup: list[dict[str, Any]] = []
        self._greeted = False

    def hello(self) -> dict[str, Any]:
        if self._greeted and self.client.alive:
            assert self.info is not None
            return self.info
        reply = self.client.request({"op": "hello", "device": self.device, "flush_l2": self.settings.flush_l2}, self.settings.timeout_s * 4)
        if not reply.get("ok"):
            raise TuningError(f"the tuning worker could not open device {self.device}: {reply.get('error')}")
        self.info, self._greeted = reply["device"], True
        return self.info

    def _send(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            reply = self.client.request(m, self.settings.timeout_s * 4)
            if not reply.get("ok"):
                raise WorkerDied(reply.get("error", f"{m['op']} failed"))

    def prepare(self, messages: list[dict[str, Any]]) -> None:
        """Send a bucket's setup; remembered so that a restarted worker gets it again."""
        self.hello()
        self._send(messages)
        self._setup = list(messages)

    def measure(self, message: dict[str, Any]) -> dict[str, Any]:
        if not self.client.alive:  # the last variant killed it: a fresh worker, set up again
            self._greeted = False
            self.hello()
            self._send(self._setup)
        return self.client.request(message, self.settings.timeout_s)


class _Binaries:
    """One instance's variants compiled for one arch on demand, in a background thread: what the
    search asks for first (`request`), then its likely next configs (`prefetch`), so that the
    next binary is usually ready when the current one has been measured. Shared by the
    instance's buckets; compile errors reach `get`."""

    def __init__(self, inst: Instance, arch: str, cache: CompileCache):
        self.inst, self.arch, self.cache = inst, arch, cache
        self.workers = compile_mod.default_workers()
        self.chunk = 2 * self.workers
        self._results: dict[int, compile_mod.CompileResult | BaseException] = {}
        self._queued: set[int] = set()  # asked for or compiling or compiled: never compiled twice
        self._todo: list[int] = []  # asked for: compiled first
        self._guesses: list[int] = []  # the latest prefetch, not asked for yet
        self._running = False
        self._cond = threading.Condition()

    def request(self, indices: Sequence[int]) -> None:
        with self._cond:
            new = [i for i in indices if i not in self._queued]
            self._queued.update(new)
            self._todo.extend(new)
            self._guesses = [i for i in self._guesses if i not in self._queued]  # asked for now: not twice
            self._start()

    def prefetch(self, indices: Sequence[int]) -> None:
        """Compile these when nothing asked for waits; they replace the previous guesses."""
        with self._cond:
            self._guesses = [i for i in indices if i not in self._queued]
            self._start()

    def _start(self) -> None:  # with self._cond held
        if (self._todo or self._guesses) and not self._running:
            self._running = True
            threading.Thread(target=self._work, daemon=True, name="hatch-autotune-compile").start()

    def get(self, index: int) -> compile_mod.CompileResult:
        self.request([index])
        with self._cond:
            self._cond.wait_for(lambda: index in self._results)
            result = self._results[index]
        if isinstance(result, BaseException):
            raise result
        return result

    def _work(self) -> None:
        while True:
            with self._cond:
                if self._todo:
                    chunk, self._todo = self._todo[: self.chunk], self._todo[self.chunk :]
                elif self._guesses:  # one round of the pool, so that a request soon gets its turn
                    chunk, self._guesses = self._guesses[: self.workers], self._guesses[self.workers :]
                    self._queued.update(chunk)
                else:
                    self._running = False
                    return
            try:
                results: list[Any] = compile_mod.compile_all([self.inst.compile_job(i, self.arch) for i in chunk], self.cache, self.workers)
            except BaseException as exc:  # noqa: BLE001 - raised by get(), in the measuring thread
                results = [exc] * len(chunk)
            with self._cond:
                self._results.update(zip(chunk, results))
                self._cond.notify_all()


def _kernel_json(job: BucketJob) -> dict[str, Any]:
    """The runtime's view of the kernel, with every candidate variant of the bucket."""
    return {**kernel_json(job.spec), "variants": {v.id: {"config": v.config_dict} for v in job.variants}}


def _strategy_text(search: SearchSpec) -> str:
    limits = [f"{search.budget} configs" if isinstance(search.budget, int) else f"{search.budget} of the space"] if search.budget else []
    limits += [f"{search.seconds:g} s"] if search.seconds else []
    return f"strategy {search.strategy}" + (f", budget {' or '.join(limits)}" if limits else "")


def tune_bucket(
    session: _Session,
    job: BucketJob,
    binaries: _Binaries,
    warm: WarmStart,
    root: Path,
    tmp: Path,
    log: Log,
    compiler: str,
) -> LockEntry:
    """Search one bucket's configs (the default and the warm starts first) within the kernel's
    search budget, measuring each in the worker, and return its lock entry."""
    import numpy as np

    spec, settings = job.spec, session.settings
    configs = job.inst.configs
    default_index = job.inst.default_index
    inputs = bucket_inputs(spec, job.types, job.key, root, seed=zlib.crc32(job.eid.encode()))
    arrays = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
    scalars = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in inputs.items() if not isinstance(v, np.ndarray)}
    inputs_file = tmp / "inputs.npz"
    np.savez(inputs_file, **arrays)
    reference = reference_outputs(spec, inputs, root, job.types)
    reference_file = None
    if reference is not None:
        reference_file = tmp / "reference.npz"
        np.savez(reference_file, **reference)
    outputs = [a for a in spec.args if a.is_array and a.intent != "in"]
    tolerances = {a.name: list(tolerance(job.types.get(a.dtype, a.dtype), spec.tolerance)) for a in outputs}
    setup = {
        "op": "setup",
        "name": spec.name,
        "kernel": _kernel_json(job),
        "binaries": {},  # each request names its variant's binary: they are compiled as the search goes
        "types": job.types,
        "key": job.key,
        "inputs": str(inputs_file),
        "scalars": scalars,
        "reference": str(reference_file) if reference_file else None,
        "tolerances": tolerances,
        "settings": settings.__dict__,
    }
    info = session.info or session.hello()
    block_env = lambda c: {**job.key, **c, **spec.type_env(job.types)}  # noqa: E731
    if reference is not None:
        session.prepare([setup])
    search = spec.search
    budget = Budget(search.configs_budget(len(configs)), search.seconds)
    total = min(budget.configs or len(configs), len(configs))
    strategy = make_strategy(search.strategy, SearchSpace(spec.space, configs), zlib.crc32(f"{search.seed}:{job.eid}".encode()), [default_index, *warm.first], warm.prior)
    measurements: dict[int, Measurement] = {}
    # reference: the index of the config whose outputs are the reference (None: a user reference)
    state: dict[str, Any] = {"leader": None, "best": None, "reference": None, "seconds": 0.0}
    phases: dict[str, float] = {}  # the worker's seconds per phase, summed over the bucket

    def record(m: Measurement) -> float | None:
        measurements[m.index] = m
        if m.status == "ok" and (state["leader"] is None or m.median_ms < state["leader"]):
            state["leader"], state["best"] = m.median_ms, m
        done = len(measurements)
        if done % PROGRESS_EVERY == 0 and done < total:
            rejected = sum(x.status in ("rejected", "failed") for x in measurements.values())
            best = state["best"]
            lead = f"best so far {best.config} {best.median_ms:.4f} ms" if best else "none timed yet"
            log(f"  {job.eid}: {done}/{total} configs done, {rejected} rejected or failed; {lead}")
        return m.median_ms if m.status in TIMED else None

    def measure(i: int) -> float | None:
        started = time.monotonic()
        result = binaries.get(i)
        reason = prune_reason(
            configs[i],
            result.resources if result.ok else None,
            lambda c: math.prod(int(e(block_env(c))) for e in spec.block),
            lambda c: int(spec.shared(block_env(c))),
            info["limits"],
            settings.prune_spills,
        )
        if reason:
            state["seconds"] += time.monotonic() - started
            return record(Measurement(i, configs[i], "pruned", reason=reason))
        variant = {"variant": job.variants[i].id, "binary": _binary_file(job, i, result, tmp)}
        try:
            if reference is None and state["reference"] is None:  # the first config that runs becomes the reference
                session.prepare([setup, {"op": "reference", **variant}])
                state["reference"] = i
            asked = time.monotonic()
            reply = session.measure({"op": "measure", **variant, "leader_ms": state["leader"]})
        except WorkerDied as exc:
            state["seconds"] += time.monotonic() - started
            return record(Measurement(i, configs[i], "failed", reason=str(exc)))
        # a replayed device reports its simulated time; a GPU's is the wall clock
        state["seconds"] += (asked - started) + reply.get("seconds", time.monotonic() - asked)
        for phase, seconds in reply.get("phases", {}).items():
            phases[phase] = phases.get(phase, 0.0) + float(seconds)
        if not reply.get("ok"):
            return record(Measurement(i, configs[i], "failed", reason=reply.get("error", "unknown error")))
        m = Measurement(i, configs[i], reply["status"], tuple(reply.get("samples", ())), reply.get("reason", ""))
        if state["reference"] == i:
            m.reason = "reference (no user reference configured)"
        return record(m)

    run_search(strategy, measure, budget, clock=lambda: state["seconds"], prepare=binaries.request, prefetch=binaries.prefetch, ahead=binaries.workers)
    skipped = f"not tried by the search ({_strategy_text(search)})"
    ordered = [measurements.get(i) or Measurement(i, configs[i], "skipped", reason=skipped) for i in range(len(configs))]
    winner = choose_winner(ordered, default_index)
    if winner is None:
        first = next((m for m in ordered if m.status in ("failed", "rejected", "pruned")), ordered[0])
        detail = f":\n{log_excerpt(binaries.get(first.index).log)}" if first.reason == "did not compile" else ""
        tried = "tried " if len(measurements) < len(configs) else ""
        raise TuningError(f"{job.eid}: every variant {tried}failed or was rejected; the first ({first.config}): {first.reason}{detail}")
    default_ms = measurements[default_index].median_ms if default_index in measurements and measurements[default_index].status == "ok" else None
    counts = {s: sum(m.status == s for m in ordered) for s in ("ok", "eliminated", "rejected", "failed", "pruned")}
    searched = f", {len(measurements)} tried ({_strategy_text(search)}, {state['seconds']:.1f} s)" if len(measurements) < len(configs) else ""
    log(
        f"tuned {job.eid}: {len(configs)} configs{searched}, {counts['ok'] + counts['eliminated']} measured "
        f"({counts['eliminated']} eliminated early), {counts['rejected']} rejected, {counts['failed']} failed, "
        f"{counts['pruned']} pruned; best {winner.config} {winner.median_ms:.4f} ms"
        + (f" ({default_ms / winner.median_ms:.2f}x the default)" if default_ms else "")
        + (f"; prior: the times of {len(warm.prior)} earlier result(s)" if warm.prior else "")
        + (f"; worker {', '.join(f'{k} {v:.1f} s' for k, v in phases.items())}" if phases else "")
    )
    return LockEntry(
        checksum=job.point.checksum,
        config=winner.config,
        tuned=True,
        index=winner.index,
        default=dict(spec.default),
        default_ms=round(default_ms, 6) if default_ms else None,
        measurements=tuple(m.to_json() for m in ordered),
        provenance=provenance(info, compiler),
    )


def _binary_file(job: BucketJob, index: int, result: compile_mod.CompileResult, tmp: Path) -> str:
    """Write a compiled variant's cubin where the worker can read it (once per source)."""
    path = tmp / f"{job.variants[index].source_hash[:16]}.cubin"
    if not path.exists():
        assert result.binary is not None
        path.write_bytes(result.binary)
    return str(path)


def tune(
    project: ProjectSpec,
    *,
    kernels: list[str] | None = None,
    mode: str = "tune",
    log: Log = print,
    gpu_arch: str | None = None,
    client_factory: Callable[[int], WorkerClient] | None = None,
    cache: CompileCache | None = None,
    gpus: Sequence[Gpu] | None = None,
) -> TuneSummary:
    """Tune the stale (or, in `retune`, all) entries of `project` for every target arch that has
    a device here (plan_tuning; in `auto`, none is not an error), or only for `gpu_arch`, and
    write them into its lock file as each bucket finishes. `gpus`: this machine's devices when
    the caller has detected them already (the build hook), else detected here. Every device of a
    tuned arch gets a worker, and the buckets are spread over them (schedule.py, the loop the
    Ray engine shares). The summary carries the plan it tuned (all kernels only), whose lock
    holds the new entries: the build that follows uses it, rendering and reading nothing again."""
    if mode == "offline":
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
        if gpu_arch not in targets:
            raise TuningError(f"the GPU here is {gpu_arch} but the project's archs are {', '.join(targets)}; add {gpu_arch} to `archs`")
        tuning = TuningPlan((gpu_arch,), targets)
    summary = TuneSummary()
    if not tuning.archs:
        return summary
    cache = cache or open_compile_cache()
    plan = make_plan(project, targets, log=log, kernels=kernels)
    todo = stale_points(plan, tuning.archs, mode, kernels, summary, log)
    factory = client_factory or (lambda device: WorkerClient())
    sessions: list[_Session] = []
    try:
        slots: list[LocalSlot] = []
        binaries = InstanceBinaries(cache)
        with tempfile.TemporaryDirectory(prefix="hatch-autotune-tune-") as tmpdir:
            for arch in dict.fromkeys(a for a, _, _ in todo):
                # none detected (a stand-in worker, or a driver that would not say): device 0, whose worker says what it is
                devices = [g.ordinal for g in gpus if g.arch == arch] or [0]
                log(f"tuning {arch} on device{'s' if len(devices) > 1 else ''} {', '.join(map(str, devices))} (NVRTC {plan.compiler}), mode {mode}")
                arch_sessions = [_Session(factory(d), d, project.tuning) for d in devices]
                sessions += arch_sessions
                slots += [LocalSlot(s, arch, binaries, plan, Path(tmpdir), log) for s in _matching_sessions(arch_sessions, arch, log)]
            run_tuning(plan, todo, slots, binaries, summary, log)
    finally:
        for s in sessions:
            s.client.close()
    return summary


def check_kernels(project: ProjectSpec, kernels: Sequence[str] | None) -> None:
    unknown = sorted(set(kernels or []) - set(project.kernels))
    if unknown:
        raise TuningError(f"no kernel named {', '.join(unknown)}; kernels: {', '.join(project.kernels)}")


Todo = list[tuple[str, Instance, list[Point]]]


def stale_points(plan: Plan, archs: Sequence[str], mode: str, kernels: Sequence[str] | None, summary: TuneSummary, log: Log) -> Todo:
    """What to tune (plan.to_tune), said in the log; the summary keeps the plan (all kernels only)."""
    if not kernels:
        summary.plan = plan
    todo, summary.skipped = plan.to_tune(archs, mode)
    if summary.skipped:
        log(f"tuning: {summary.skipped} entr(y/ies) still valid in {plan.project.lock_file.name}; not re-tuned")
    return todo


class InstanceBinaries:
    """Each (instance, arch)'s `_Binaries`, made once and shared by every slot of this machine."""

    def __init__(self, cache: CompileCache):
        self.cache = cache
        self._made: dict[tuple[int, str], _Binaries] = {}
        self._lock = threading.Lock()

    def __call__(self, inst: Instance, arch: str) -> _Binaries:
        with self._lock:
            key = (id(inst), arch)
            if key not in self._made:
                self._made[key] = _Binaries(inst, arch, self.cache)
            return self._made[key]


class LocalSlot:
    """One GPU of this machine: its worker session tunes one bucket at a time."""

    depth = 1  # it runs in the scheduler's thread: one bucket at a time

    def __init__(self, session: _Session, arch: str, binaries: InstanceBinaries, plan: Plan, tmp: Path, log: Log):
        self.session, self.arch, self.binaries, self.plan, self.log = session, arch, binaries, plan, log
        self.name = f"gpu{session.device}"
        self.workdir = tmp / self.name
        self.workdir.mkdir(exist_ok=True)

    def start(self, job: Job) -> Callable[[], LockEntry]:
        bucket: BucketJob = job.payload
        root, compiler = self.plan.project.root, self.plan.compiler
        return lambda: tune_bucket(self.session, bucket, self.binaries(bucket.inst, self.arch), job.warm, root, self.workdir, self.log, compiler)


class LockSaver:
    """Saves the lock as results arrive without holding up the GPUs: the slot that finished a
    bucket goes on at once, and this thread writes the newest state (results that arrive during
    a write go into the next one, so it never falls behind by more than one write). `close`
    waits for the last write; a write that failed is raised there, and `put` raises it too, so
    that the run stops rather than tune what it cannot keep."""

    def __init__(self, lock: LockFile, path: Path):
        self.lock, self.path = lock, path
        self._cond = threading.Condition()
        self._changes = self._saved = 0
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="hatch-autotune-lock", daemon=True)
        self._thread.start()

    def put(self, eid: str, entry: LockEntry) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            self.lock.entries[eid] = entry
            self._changes += 1
            self._cond.notify_all()

    def _write(self) -> None:
        while True:
            with self._cond:
                while self._changes == self._saved and not self._closing:
                    self._cond.wait()
                if self._changes == self._saved:
                    return
                changes, snapshot = self._changes, LockFile(entries=dict(self.lock.entries))
            try:
                snapshot.save(self.path)
            except BaseException as exc:  # noqa: BLE001 - raised by put and close, in the run's threads
                with self._cond:
                    self._error = TuningError(f"cannot save {self.path}: {exc}")
                return
            with self._cond:
                self._saved = changes

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error


def run_tuning(plan: Plan, todo: Todo, slots: Sequence[Slot], binaries: InstanceBinaries, summary: TuneSummary, log: Log) -> None:
    """The engine-independent part of a tuning run (this machine's GPUs, or a Ray cluster's):
    check each instance's default compiles (a build would stop: no GPU time for it), fix every
    job's warm starts from the lock as it is now (the same search whoever runs it, and when),
    schedule the jobs over the slots, and merge each result into the lock and save it as it
    arrives, so an interrupted run resumes where it stopped. Lost jobs are a TuningError that
    names them, raised after everything else is saved."""
    jobs = []
    per_arch = {}
    for s in slots:
        per_arch[s.arch] = per_arch.get(s.arch, 0) + 1
    for arch, inst, points in todo:
        named = f"{inst.spec.name} ({instance_text(inst.types_key)})"
        default = binaries(inst, arch).get(inst.default_index)
        if not default.ok:
            if not plan.project.default_may_fail:
                raise TuningError(plan.default_failure([(inst, arch, default.log)]))
            log(f"warning: the default config of {named} does not compile for {arch}; measuring the others (default-may-fail = true)")
        log(f"tuning {named} on {arch}: {len(points)} bucket(s) x {len(inst.variants)} configs on {per_arch.get(arch, 0)} GPU(s), {_strategy_text(inst.spec.search)}")
        measured = min(inst.spec.search.configs_budget(len(inst.configs)) or len(inst.configs), len(inst.configs))
        for p in points:
            bucket = BucketJob(inst, p)
            warm = warm_start(plan.lock, p, inst.configs, inst.spec.search.strategy) if inst.spec.search.warm_start else WarmStart()
            cost = measured + input_bytes(inst.spec, p.id.bucket, inst.types) / HOST_BYTES_PER_CONFIG
            jobs.append(Job(p.eid, arch, warm, bucket, cost=cost))

    saver = LockSaver(plan.lock, plan.project.lock_file)

    def done(job: Job, entry: LockEntry, slot: Slot) -> None:
        saver.put(job.eid, entry)
        summary.tuned.append((job.eid, entry))

    try:
        result = summary.schedule = run_schedule(jobs, slots, done, log)
    finally:
        saver.close()  # every result that arrived is on disk, whatever stopped the run
    if len(slots) > 1:
        log("tuning: buckets per GPU\n" + result.table())
    if todo:
        log("tuning summary:\n" + summary.table())
    if result.lost:
        listed = "\n".join(f"  {eid}: {why}" for eid, why in sorted(result.lost.items()))
        raise TuningError(
            f"{len(result.lost)} of {len(jobs)} bucket(s) were not tuned because their GPUs were lost; the other "
            f"{len(jobs) - len(result.lost)} are saved in {plan.project.lock_file.name}, and running again tunes only these:\n{listed}"
        )


def _matching_sessions(sessions: list[_Session], gpu_arch: str, log: Log) -> list[_Session]:
    """Only devices of the arch being tuned measure it (a builder may hold several kinds)."""
    keep = []
    for s in sessions:
        info = s.hello()
        arch = "sm_" + "".join(str(c) for c in info["cc"])
        if arch == gpu_arch:
            keep.append(s)
        else:
            log(f"tuning: device {s.device} ({info['name']}, {arch}) is not {gpu_arch}; not using it")
            s.client.close()
    if not keep:
        raise TuningError(f"no device of arch {gpu_arch} answered")
    return keep
