"""`random`: every config in a seeded random order, so that a budget makes it a uniform sample."""

from __future__ import annotations

from collections.abc import Iterable

from .base import Strategy


class RandomSample(Strategy):
    """Every config, in a seeded random order: a budget makes it a uniform sample."""

    name = "random"

    def propose(self) -> Iterable[int]:
        return self._random(len(self.space))
