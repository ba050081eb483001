"""Tuning on the build machine's GPU: inputs, verification, timing, isolation, orchestration.

`tune(project, kernels=..., mode=..., log=...)` is the entry point the build hook and the
`hatch-autotune tune` command share.
"""

from .tuner import TuneSummary, TuningError, tune

__all__ = ["tune", "TuneSummary", "TuningError"]
