"""The lock's error: a lock file or entry that a strict reader refuses."""

from __future__ import annotations

from ..errors import BuildError


class LockFormatError(BuildError):
    """A lock file or entry that a strict reader refuses; the message names the file and why."""
