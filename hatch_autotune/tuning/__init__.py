"""Tuning on the build machine's GPU: inputs, verification, timing, isolation, orchestration.

`tune(project, kernels=..., mode=..., log=...)` tunes on this machine's GPUs; engine.run_engine,
the entry point the build hook and the `hatch-autotune tune` command share, calls it or the Ray
engine (ray_engine.tune_on_ray).
"""

from .errors import TuningError
from .tuner import TuneSummary, tune

__all__ = ["TuneSummary", "TuningError", "tune"]
