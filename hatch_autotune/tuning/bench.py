"""Timing: CUDA events around each launch (or around a CUDA graph of launches), the L2 flushed
between repetitions or not, as the kernel declares it runs; an adaptive number of repetitions
within a per-variant budget, and early elimination of clear losers.

The statistics and stopping rules are plain functions (tested on the CPU); `GpuTimer` is the
part that needs a GPU and runs inside the worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..declare.config import TuningSpec
from ..runtime import check_cuda, cuda_api

BATCH = 5  # repetitions between host synchronisations
STABLE_REPS = 20  # with this many samples, a spread under STABLE_SPREAD ends timing early
STABLE_SPREAD = 0.005


def median(samples: Sequence[float]) -> float:
    s = sorted(samples)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def spread(samples: Sequence[float]) -> float:
    """Half the interquartile range: the noise band that near-ties are judged against."""
    s = sorted(samples)
    if len(s) < 4:
        return (s[-1] - s[0]) / 2 if s else 0.0
    q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
    return (q3 - q1) / 2


def next_step(samples: Sequence[float], settings: TuningSpec, leader_ms: float | None, launches_per_sample: int = 1) -> tuple[bool, bool]:
    """(stop, eliminated) after the samples so far; a sample of a CUDA graph is one launch's
    share of `launches_per_sample`, all of which the GPU time budget counts."""
    n = len(samples)
    if n >= settings.max_reps:
        return True, False
    if n < settings.min_reps:
        return False, False
    if leader_ms is not None and min(samples) > leader_ms * (1.0 + settings.eliminate):
        return True, True  # even its fastest run is clearly slower than the leader's median
    if sum(samples) * launches_per_sample >= settings.budget_ms:
        return True, False
    if n >= STABLE_REPS and spread(samples) <= STABLE_SPREAD * median(samples):
        return True, False
    return False, False


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]
    eliminated: bool


class GpuTimer:
    """Times launches on one device with CUDA events (GPU only; used by the worker). Its CUDA
    calls go through the runtime's API, so a stand-in driver reaches them too.

    How a variant is timed follows its settings (a kernel's `timing`, declare/search.py
    TimingSpec): eager, each launch between its own pair of events, the L2 flushed before each
    (cold) or not (hot); or graph, `graph_launches` launches captured once into a CUDA graph
    (cuStreamBeginCapture ... cuGraphInstantiate) whose replay is timed as a whole, a sample
    being one launch's share. Cold in a graph: a flush (a memset node) before each launch in
    the graph, and a graph of the same flushes alone replayed just before it, whose time each
    sample subtracts, so that only the launches are counted."""

    FLOOR_MS = 1e-6  # a graph sample is never below a nanosecond: a difference of two timings may be

    def __init__(self, device_id: int, flush_l2: bool):
        cuda = cuda_api()
        self.device = cuda.Device(device_id)
        self.device.set_current()
        self.stream = self.device.create_stream()
        self._event_options = cuda.EventOptions(timing_enabled=True)
        self._driver = cuda.driver
        self._flush_ptr: Any = None
        self._flush_bytes = 0
        self._graphs: dict[int, tuple[Callable[[Any], None], Any, Any]] = {}  # id(launch) -> (launch, graph, executable)
        self._flush_graphs: dict[int, tuple[Any, Any]] = {}  # launches -> (graph, executable) of the flushes alone
        if flush_l2:  # claimed before the buckets' inputs; a kernel timed cold in a project that is not claims it then
            self._claim_flush()

    def _claim_flush(self) -> None:
        if self._flush_ptr is None:
            l2 = int(self.device.properties.l2_cache_size)
            self._flush_bytes = max(2 * l2, 1 << 20)
            self._flush_ptr = check_cuda(self._driver.cuMemAlloc(self._flush_bytes), "cuMemAlloc (L2 flush buffer)")

    def flush(self) -> None:
        self._claim_flush()
        result = self._driver.cuMemsetD8Async(self._flush_ptr, 0, self._flush_bytes, self.stream.handle)
        check_cuda(result, "cuMemsetD8Async (L2 flush)")

    def time(self, launch: Callable[[Any], None], settings: TuningSpec, leader_ms: float | None) -> Timing:
        if settings.launches == "graph":
            return self._time_graph(launch, settings, leader_ms)
        for _ in range(settings.warmup):
            launch(self.stream)
        self.stream.sync()
        samples: list[float] = []
        while True:
            pairs = []
            for _ in range(min(BATCH, settings.max_reps - len(samples))):
                if settings.flush_l2:
                    self.flush()
                start = self.stream.record(options=self._event_options)
                launch(self.stream)
                end = self.stream.record(options=self._event_options)
                pairs.append((start, end))
            pairs[-1][1].sync()
            samples.extend(float(end - start) for start, end in pairs)
            stop, eliminated = next_step(samples, settings, leader_ms)
            if stop:
                return Timing(tuple(samples), eliminated)

    def _time_graph(self, launch: Callable[[Any], None], settings: TuningSpec, leader_ms: float | None) -> Timing:
        count, cold, drv, stream = settings.graph_launches, settings.flush_l2, self._driver, self.stream.handle
        if cold:
            self._claim_flush()  # before a capture: an allocation is no stream work to capture
        key = id(launch)
        if key not in self._graphs or self._graphs[key][0] is not launch:
            self._graphs[key] = (launch, *self._capture(lambda: self._launches(launch, count, cold)))
        executable = self._graphs[key][2]
        flushes = None
        if cold:
            if count not in self._flush_graphs:
                self._flush_graphs[count] = self._capture(lambda: self._launches(None, count, True))
            flushes = self._flush_graphs[count][1]
        for _ in range(max(settings.warmup, 1)):  # at least once: a graph's first replay uploads it
            check_cuda(drv.cuGraphLaunch(executable, stream), "cuGraphLaunch (warm-up)")
        self.stream.sync()
        samples: list[float] = []
        while True:
            events = []
            for _ in range(min(BATCH, settings.max_reps - len(samples))):
                marks = []
                for graph in (flushes, executable) if flushes is not None else (executable,):
                    marks.append(self.stream.record(options=self._event_options))
                    check_cuda(drv.cuGraphLaunch(graph, stream), "cuGraphLaunch")
                marks.append(self.stream.record(options=self._event_options))
                events.append(marks)
            events[-1][-1].sync()
            for marks in events:
                total = float(marks[-1] - marks[-2]) - (float(marks[1] - marks[0]) if flushes is not None else 0.0)
                samples.append(max(total / count, self.FLOOR_MS))
            stop, eliminated = next_step(samples, settings, leader_ms, count)
            if stop:
                return Timing(tuple(samples), eliminated)

    def _launches(self, launch: Callable[[Any], None] | None, count: int, cold: bool) -> None:
        """What a graph holds: `count` launches, each after a flush when `cold` (None: the flushes alone)."""
        for _ in range(count):
            if cold:
                self.flush()
            if launch is not None:
                launch(self.stream)

    def _capture(self, record: Callable[[], Any]) -> tuple[Any, Any]:
        """(graph, executable) of what `record` puts on the timer's stream, captured (relaxed:
        the worker's thread makes no other CUDA calls meanwhile). The capture always ends: a
        launch that fails leaves the stream usable, and the failure is raised."""
        drv, stream = self._driver, self.stream.handle
        check_cuda(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
        try:
            record()
        except BaseException:
            result = drv.cuStreamEndCapture(stream)
            if int(result[0]) == 0 and result[1] is not None:
                drv.cuGraphDestroy(result[1])
            raise
        graph = check_cuda(drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
        try:
            executable = check_cuda(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            drv.cuGraphDestroy(graph)
            raise
        return graph, executable

    def release_graphs(self) -> None:
        """Destroy the variants' graphs (a bucket ends: its launches go); the flushes' stay."""
        for _, graph, executable in self._graphs.values():
            self._destroy(graph, executable)
        self._graphs.clear()

    def _destroy(self, graph: Any, executable: Any) -> None:
        check_cuda(self._driver.cuGraphExecDestroy(executable), "cuGraphExecDestroy")
        check_cuda(self._driver.cuGraphDestroy(graph), "cuGraphDestroy")
