"""Tuning on the build machine's GPU: inputs, verification, timing, isolation, orchestration.

`tune(project, kernels=..., mode=..., log=...)` tunes on this machine's GPUs; engine.run_engine,
the entry point the build hook and the `hatch-autotune tune` command share, calls it or the Ray
engine (ray_engine.tune_on_ray).
"""

from .tuner import TuneSummary, TuningError, tune

__all__ = ["tune", "TuneSummary", "TuningError"]
