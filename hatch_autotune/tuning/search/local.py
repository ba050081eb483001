"""`local`: best-first neighbourhood search from a small random sample (iterated local search)."""

from __future__ import annotations

from collections.abc import Iterable

from .base import Strategy


class LocalSearch(Strategy):
    """Best-first neighbourhood search: a small random sample, then, again and again, every
    unmeasured neighbour of the fastest config whose neighbours are not all measured yet. It
    climbs from the best point it knows and falls back to the next best at a local optimum
    (iterated local search, as Inductor's coordinate descent and Kernel Tuner's greedy_ils)."""

    name = "local"
    initial = 8

    def propose(self) -> Iterable[int]:
        if len(self.times) < self.initial:
            return self._random(self.initial - len(self.times))
        return self._fresh_neighbours(self._fastest()) or self._random(self.initial)

    def upcoming(self, k: int) -> list[int]:
        return self._fresh_neighbours(self._fastest())[:k] if len(self.times) >= self.initial else self._next_random(k)
