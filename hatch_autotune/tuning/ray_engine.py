"""Tuning on a Ray cluster: one actor per GPU, placed by arch, fed by the local engine's scheduler.

Each node advertises how many GPUs of each arch it has as a custom resource
(`hatch-autotune ray-resources` prints them for `ray start --resources`), so one cluster of H100s
and A100s tunes sm_90 and sm_80 in one run (Kernel Tuner's Ray runner refuses a cluster whose GPUs
differ). An actor holds one GPU (`num_gpus=1` and one unit of its arch's resource) and tunes every
target arch that GPU tunes (`tuning_gpus`: an sm_90a target runs on the sm_90 actors, beside
sm_90's buckets, never two buckets at once on one GPU); it renders the project once, and tunes the
buckets it is sent with the code a local GPU runs (`BucketTuning`:
compiling on its node's CPUs while it measures, crashes isolated in its worker process). The
driver keeps the lock: `run_tuning` merges each entry as it arrives and saves it. Only plain data
crosses Ray: the project directory (shipped as the job's working_dir), entry ids, warm starts,
lock entries as JSON and log lines.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..compile.cache import CompileCache
from ..compile.tiers import open_compile_cache
from ..declare.config import Mode, ProjectSpec
from ..declare.settings import RAY_VAR, ray_host_port
from ..lock import LockEntry
from ..plan.devices import Gpu, tunable_targets, tuning_gpus
from ..plan.planner import make_plan, target_archs
from ..runtime import short_repr
from ..text import Log
from .binaries import CompareBinaries, InstanceBinaries, VariantBinaries
from .bucket import BucketJob, BucketTuning
from .decide import check_kernels
from .errors import TuningError
from .protocol import DeviceInfo
from .schedule import Job, SlotLost
from .search import WarmStart
from .session import WorkerSession
from .tuner import TuneSummary, output_dtypes, plan_run, run_tuning
from .worker_client import WorkerClient

RESOURCE_PREFIX = "hatch-autotune:"  # + arch: a node's number of GPUs of that arch
READY_TIMEOUT_S = 120.0  # an actor that has no GPU after this long is given up
PROBE_TIMEOUT_S = 5.0  # the most a wrong HATCH_AUTOTUNE_RAY / --ray costs before its error
GCS_HANDSHAKE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # HTTP/2's preface, an empty SETTINGS
SHIPPED_EXCLUDES = [".git", ".venv", "venv", "dist", "build", "*.whl", "__pycache__", ".pytest_cache"]


def arch_resources(gpus: Sequence[Gpu]) -> dict[str, int]:
    """The custom resources a node advertises for its GPUs: {"hatch-autotune:sm_90": 8}."""
    out: dict[str, int] = {}
    for g in gpus:
        out[RESOURCE_PREFIX + g.arch] = out.get(RESOURCE_PREFIX + g.arch, 0) + 1
    return out


LOOPBACK = ("127.0.0.1", "localhost", "::1")
RAY_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps a loopback address as it is


def _ray(address: str | None = None) -> Any:
    """Ray, imported. For a loopback `address`, before the first import: Ray would otherwise
    rewrite 127.0.0.1 to this machine's outward IP, where a head started with
    --node-ip-address=127.0.0.1 does not listen, and ray.init would retry there for minutes."""
    if address is not None and address.rpartition(":")[0].strip("[]") in LOOPBACK and "ray" not in sys.modules:
        os.environ.setdefault(RAY_LOCAL_ONLY_ENV, "0")
    try:
        import ray
    except ImportError:
        raise TuningError("tuning on a Ray cluster needs Ray on this machine and every node: pip install 'hatch-autotune[ray]'") from None
    return ray


class TuneActor:
    """One GPU of the cluster (Ray sets CUDA_VISIBLE_DEVICES, so its worker opens device 0), for
    the target archs `targets` (those its GPU tunes: sm_90 and sm_90a on a 9.0 GPU).
    `worker`: {"command": [...], "env": {...}} instead of the GPU worker (tests, benchmarks)."""

    def __init__(self, targets: Sequence[str], worker: Mapping[str, Any] | None = None, root: str | None = None):
        from ..declare.project import load_project

        self.targets = tuple(targets)
        self.root = Path(root or os.getcwd())  # the shipped working_dir
        self.project = load_project(self.root)
        self.plan = make_plan(self.project, list(self.targets), log=lambda _: None)
        self.jobs = {p.eid: BucketJob(inst, p) for inst in self.plan.instances for arch in self.targets for p in inst.points[arch]}
        self.cache = open_compile_cache(self.project.settings.cache)  # the node's disk, and the shared Redis if its settings name one
        self.binaries: dict[tuple[int, str], VariantBinaries] = {}
        dtypes = output_dtypes(self.plan.instances)
        self.compare = {arch: CompareBinaries(arch, self.cache, dtypes, log=None) for arch in self.targets}
        worker = worker or {}
        env = {**os.environ, **worker["env"]} if worker.get("env") else None
        self.session = WorkerSession(WorkerClient(worker.get("command"), env=env), 0, self.project.tuning)
        self.tmp = Path(tempfile.mkdtemp(prefix="hatch-autotune-actor-"))
        # Ray runs two calls at once (max_concurrency, below) so that the queued bucket starts the
        # moment this lock is free, not after the finished one's reply has gone out: one GPU,
        # one bucket at a time all the same.
        self._one_at_a_time = threading.Lock()

    def hello(self) -> dict[str, Any]:
        """Where it runs and what it runs with: the driver checks the arch and the versions."""
        import ray

        context = ray.get_runtime_context()
        return {
            "host": socket.gethostname(),
            "node": context.get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "device": self.session.hello().to_json(),
            "hatch_autotune": __version__,
            "compiler": self.plan.compiler,
        }

    def tune(self, eid: str, warm: Mapping[str, Any]) -> dict[str, Any]:
        """One bucket: its lock entry (JSON), the log lines it wrote, and when it began and
        ended on this actor's clock (the driver's idle-time figures)."""
        with self._one_at_a_time:
            began = time.monotonic()
            job = self.jobs.get(eid)
            if job is None:
                raise TuningError(
                    f"{eid}: not a point of the project this node received (is it the same project and hatch-autotune version?)"
                )
            arch = job.point.id.arch
            key = (id(job.inst), arch)
            if key not in self.binaries:
                self.binaries[key] = VariantBinaries(job.inst, arch, self.cache)
            lines: list[str] = []
            entry = BucketTuning(
                self.session,
                job,
                self.binaries[key],
                WarmStart.from_json(warm),
                self.root,
                self.tmp,
                lines.append,
                self.plan.compiler,
                self.compare[arch],
            ).run()
            return {"entry": entry.to_json(), "log": lines, "span": [began, time.monotonic()]}

    def close(self) -> None:
        self.session.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class RaySlot:
    """The scheduler's view of one actor: a GPU of arch `arch` that tunes `targets`; a dead actor
    or node is SlotLost. Its next bucket is queued on the actor while it runs one (`depth`), so
    the GPU does not wait for the round trip."""

    depth = 2

    def __init__(self, actor: Any, arch: str, targets: Sequence[str], hello: Mapping[str, Any], log: Log):
        self.actor, self.arch, self.targets, self.log = actor, arch, tuple(targets), log
        gpus = ",".join(hello["gpus"]) or "?"
        self.name = f"{hello['host']}:{hello['node'][:6]}/gpu{gpus}"
        self.spans: list[tuple[float, float]] = []  # each bucket's begin and end, on the actor's clock

    def start(self, job: Job) -> Callable[[], LockEntry]:
        ray = _ray()
        ref = self.actor.tune.remote(job.eid, job.warm.to_json())
        return lambda: self._result(ray, ref, job)

    def _result(self, ray: Any, ref: Any, job: Job) -> LockEntry:
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError,
        )
        try:
            reply = ray.get(ref)
        except lost as exc:
            raise SlotLost(_first_line(exc)) from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, TuningError):
                raise cause from None
            raise TuningError(f"{job.eid} on {self.name}: {_first_line(cause or exc)}") from None
        for line in reply["log"]:
            self.log(f"[{self.name}] {line}")
        self.spans.append((reply["span"][0], reply["span"][1]))
        return LockEntry.from_json(reply["entry"])

    def idle_s(self) -> float:
        """The actor's time between its buckets (its first excluded): what the engine costs per bucket."""
        spans = sorted(self.spans)
        return sum(max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def tune_on_ray(
    project: ProjectSpec,
    address: str,
    *,
    kernels: list[str] | None = None,
    mode: Mode | str = Mode.TUNE,
    log: Log = print,
    cache: CompileCache | None = None,
    workers: Mapping[str, Mapping[str, Any]] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> TuneSummary:
    """Tune the stale (or, in `retune`, all) entries of `project` on the GPUs of the Ray cluster
    at `address`, every target arch that a GPU of the cluster tunes (`tuning_gpus`: an sm_90a
    target on its sm_90 GPUs), in one run; the lock is written here as each bucket arrives. Mode
    `auto` is `tune`: naming a cluster asks for its GPUs.
    `workers`: per GPU arch, the worker to run instead of the GPU worker.
    The summary's schedule has each actor's idle time between its buckets (`idle_s`)."""
    mode = Mode(mode)
    if mode == Mode.OFFLINE:
        raise TuningError("mode 'offline' never touches a GPU; use mode 'tune' or 'retune' to tune")
    mode = Mode.TUNE if mode == Mode.AUTO else mode
    check_kernels(project, kernels)
    _probe(address, RAY_VAR if address == project.settings.ray_address else "--ray")  # what named it, for its messages
    ray = _ray(address)
    try:
        ray.init(
            address=address,
            runtime_env={"working_dir": str(project.root), "excludes": SHIPPED_EXCLUDES},
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except Exception as exc:  # ConnectionError, a refused runtime_env, a bad address
        raise TuningError(f"cannot join the Ray cluster at {address!r}: {_first_line(exc)}") from None
    actors: list[Any] = []
    try:
        have = {k[len(RESOURCE_PREFIX) :]: int(v) for k, v in ray.cluster_resources().items() if k.startswith(RESOURCE_PREFIX)}
        if not have:
            raise TuningError(
                f"the Ray cluster at {address} advertises no GPU arch: start each GPU node with "
                f'`ray start --address=... --resources="$(hatch-autotune ray-resources)"`'
            )
        targets = target_archs(project, have)
        kinds = [Gpu(n, arch, None) for n, arch in enumerate(have)]  # one of each arch: what tunes what
        archs = tunable_targets(targets, kinds)
        missing = [a for a in targets if a not in archs]
        if missing:
            log(f"warning: the Ray cluster has no GPU of {', '.join(missing)}: those entries are not tuned")
        summary = TuneSummary()
        if not archs:
            return summary
        plan = make_plan(project, targets, log=log, kernels=kernels)
        todo = plan_run(plan, archs, mode, kernels, summary, log)
        if not todo:  # every entry is valid: no actor, no GPU time
            return summary
        wanted: dict[str, int] = {}  # per GPU arch, its actors: no more than its GPUs, nor than its buckets
        served: dict[str, tuple[str, ...]] = {}  # per GPU arch, the target archs its actors tune
        for arch, _, points in todo:
            gpu = tuning_gpus(arch, kinds)[0].arch  # the nearest compute capability: one GPU arch
            wanted[gpu] = min(have[gpu], wanted.get(gpu, 0) + len(points))
            served[gpu] = tuple(dict.fromkeys((*served.get(gpu, ()), arch)))
        log(
            f"tuning on the Ray cluster at {address}: "
            + ", ".join(f"{n} x {a}" + (f" ({', '.join(served[a])})" if served[a] != (a,) else "") for a, n in wanted.items())
            + f" (NVRTC {plan.compiler}), mode {mode}"
        )
        remote = ray.remote(TuneActor)
        for gpu, n in wanted.items():
            for _ in range(n):
                opts = {
                    "num_gpus": 1,
                    "num_cpus": 0,
                    "resources": {RESOURCE_PREFIX + gpu: 1},
                    "max_restarts": 0,
                    "max_concurrency": RaySlot.depth,
                }
                actors.append((gpu, served[gpu], remote.options(**opts).remote(served[gpu], (workers or {}).get(gpu))))
        slots = _ready_slots(ray, actors, plan.compiler, ready_timeout_s, log)
        run_tuning(plan, todo, slots, InstanceBinaries(cache or open_compile_cache()), summary, log)
        for slot, slot_stats in zip(slots, summary.schedule.slots if summary.schedule else []):
            slot_stats.idle_s = slot.idle_s()  # the actor's own clock: the driver sees only round trips
        return summary
    finally:
        for *_, actor in actors:
            try:
                actor.close.remote()
                ray.kill(actor)
            except Exception:  # already dead with its node
                pass
        ray.shutdown()


def _probe(address: str, origin: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One clear error within `timeout_s` unless a Ray head answers at `address`: ray.init
    retries a refused port for minutes, and waits forever on one that accepts and never answers.
    A head's GCS is a gRPC (HTTP/2) server, which answers a connection with its SETTINGS frame;
    any answer will do (a head that speaks only TLS answers with an alert), silence will not.
    `origin` says where the address came from (--ray or HATCH_AUTOTUNE_RAY)."""
    try:
        host, port = ray_host_port(address)
    except ValueError as exc:
        raise TuningError(f"{origin} {short_repr(address)}: {exc}") from None
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(max(deadline - time.monotonic(), 0.01))
            conn.sendall(GCS_HANDSHAKE)
            answer = conn.recv(1)
        why = None if answer else "it closed the connection without answering"
    except TimeoutError:
        why = f"nothing answered within {timeout_s:g} s"
    except (OSError, ValueError) as exc:  # ValueError: a host name that is not one (a NUL, an empty label)
        why = getattr(exc, "strerror", None) or str(exc)
    if why is not None:
        raise TuningError(
            f"cannot reach the Ray cluster at {address}: {why} (the address set by {origin}; is `ray start --head` running there?)"
        )


def _ready_slots(ray: Any, actors: list[tuple[str, tuple[str, ...], Any]], compiler: str, timeout_s: float, log: Log) -> list[RaySlot]:
    """The actors (GPU arch, target archs, actor) that got a GPU in time and run what this
    driver runs: a device that tunes their targets (`Gpu.can_tune`: a node may advertise an
    arch its GPUs are not), this hatch-autotune version, the same NVRTC (lock entries record
    it); the others are dropped with a warning."""
    refs = {actor.hello.remote(): (arch, targets, actor) for arch, targets, actor in actors}
    ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    slots, dropped = [], []
    for ref in waiting:
        arch, _, actor = refs[ref]
        dropped.append(f"a {arch} actor got no GPU within {timeout_s:g} s (are the nodes' GPUs busy?); not using it")
        ray.kill(actor)
    for ref in ready:
        arch, targets, actor = refs[ref]
        try:
            hello = ray.get(ref)
        except Exception as exc:  # the actor's __init__ failed: the project does not load there
            dropped.append(f"a {arch} actor did not start: {_first_line(exc)}")
            continue
        device_arch = DeviceInfo.from_json(hello["device"]).arch
        problem = (
            f"its GPU is {device_arch}" if not all(Gpu(0, device_arch, None).can_tune(t) for t in targets)
            else f"it runs hatch-autotune {hello['hatch_autotune']}, this driver {__version__}" if hello["hatch_autotune"] != __version__
            else f"its NVRTC is {hello['compiler']}, this driver's {compiler}" if hello["compiler"] != compiler
            else None
        )  # fmt: skip
        if problem:
            dropped.append(f"the {arch} actor on {hello['host']} is not used: {problem}")
            ray.kill(actor)
            continue
        slots.append(RaySlot(actor, arch, targets, hello, log))
    for why in dropped:
        log(f"warning: {why}")
    if not slots:
        raise TuningError("no Ray actor could tune:\n" + "\n".join(f"  {why}" for why in dropped))
    return sorted(slots, key=lambda s: (s.arch, s.name))
