"""`exhaustive`: every config, in canonical order."""

from __future__ import annotations

from collections.abc import Iterable

from .base import Strategy


class Exhaustive(Strategy):
    """Every config, in canonical order."""

    name = "exhaustive"

    def propose(self) -> Iterable[int]:
        return self._unasked()
