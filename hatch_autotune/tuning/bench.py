"""Timing: CUDA events around each launch, L2 flushed between repetitions, an adaptive number
of repetitions within a per-variant budget, and early elimination of clear losers.

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


def next_step(samples: Sequence[float], settings: TuningSpec, leader_ms: float | None) -> tuple[bool, bool]:
    """(stop, eliminated) after the samples so far."""
    n = len(samples)
    if n >= settings.max_reps:
        return True, False
    if n < settings.min_reps:
        return False, False
    if leader_ms is not None and min(samples) > leader_ms * (1.0 + settings.eliminate):
        return True, True  # even its fastest run is clearly slower than the leader's median
    if sum(samples) >= settings.budget_ms:
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
    calls go through the runtime's API, so a stand-in driver reaches them too."""

    def __init__(self, device_id: int, flush_l2: bool):
        cuda = cuda_api()
        self.device = cuda.Device(device_id)
        self.device.set_current()
        self.stream = self.device.create_stream()
        self._event_options = cuda.EventOptions(timing_enabled=True)
        self._driver = cuda.driver
        self._flush_ptr = None
        self._flush_bytes = 0
        if flush_l2:
            l2 = int(self.device.properties.l2_cache_size)
            self._flush_bytes = max(2 * l2, 1 << 20)
            self._flush_ptr = check_cuda(self._driver.cuMemAlloc(self._flush_bytes), "cuMemAlloc (L2 flush buffer)")

    def flush(self) -> None:
        if self._flush_ptr is not None:
            result = self._driver.cuMemsetD8Async(self._flush_ptr, 0, self._flush_bytes, self.stream.handle)
            check_cuda(result, "cuMemsetD8Async (L2 flush)")

    def time(self, launch: Callable[[Any], None], settings: TuningSpec, leader_ms: float | None) -> Timing:
        for _ in range(settings.warmup):
            launch(self.stream)
        self.stream.sync()
        samples: list[float] = []
        while True:
            pairs = []
            for _ in range(min(BATCH, settings.max_reps - len(samples))):
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
