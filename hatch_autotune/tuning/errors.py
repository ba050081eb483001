"""The tuner's error: what stops a tuning run, with a message that says why."""

from __future__ import annotations

from ..errors import BuildError


class TuningError(BuildError):
    """Tuning cannot go on (no GPU, every variant of a bucket failed); the message says why."""
