"""The base of every strategy (`Strategy`): configs to measure first, then what it proposes,
none asked twice; what it was told; seeded draws of unasked configs and their neighbours."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from .space import SearchSpace


class Strategy:
    """Proposes configs; `first` (the default, warm starts) are measured before anything else.
    `prior`: per related tuning result (the same bucket on another arch, ...), each config's
    speed there relative to its fastest (0: failed there, None: not measured there); used only
    by a strategy with `uses_prior` (`auto`, as its model's prior mean)."""

    name = ""
    uses_prior = False  # whether `prior` changes what it proposes: the tuner builds one only then

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        self.space = space
        self.rng = random.Random(f"{self.name}:{seed}")
        self.times: dict[int, float] = {}  # told so far; math.inf for a failed config
        self._first = list(dict.fromkeys(first))
        self._asked: set[int] = set()

    def ask(self) -> list[int]:
        """The next configs to measure (none asked before); [] when the strategy is done."""
        batch = [i for i in self._first if i not in self._asked] if self._first else []
        self._first = []
        if not batch:
            batch = [i for i in dict.fromkeys(self.propose()) if i not in self._asked]
        self._asked.update(batch)
        return batch

    def tell(self, index: int, ms: float | None) -> None:
        self.times[index] = math.inf if ms is None else ms

    def propose(self) -> Iterable[int]:
        raise NotImplementedError

    def upcoming(self, k: int) -> list[int]:
        """Up to k configs this strategy is likely to ask for next, likeliest first, so that they
        can be compiled while the current batch is measured. A guess that changes nothing: the
        search is the same whether or not it is called. Strategies that ask for everything at
        once (exhaustive, random) have nothing to add."""
        return []

    def _fastest(self) -> list[int]:
        """The configs told so far that ran, fastest first (ties: canonical order)."""
        return [i for _, i in sorted((ms, i) for i, ms in self.times.items() if not math.isinf(ms))]

    def _unasked(self) -> Sequence[int]:
        """The configs not asked yet, in canonical order (a model strategy keeps them as a mask)."""
        return [i for i in range(len(self.space)) if i not in self._asked]

    def _random(self, k: int) -> list[int]:
        return self._draw(self.rng, k)

    def _next_random(self, k: int) -> list[int]:
        """What `_random(k)` would draw now, without drawing: a copy of the generator draws it."""
        copy = random.Random()
        copy.setstate(self.rng.getstate())
        return self._draw(copy, k)

    def _draw(self, rng: random.Random, k: int) -> list[int]:
        """k unasked configs drawn uniformly: positions among them, so that a million of them
        are not made into a list first (the same draw as sampling the list itself)."""
        rest = self._unasked()
        return [int(rest[j]) for j in rng.sample(range(len(rest)), min(k, len(rest)))]

    def _fresh_neighbours(self, bases: Iterable[int]) -> list[int]:
        """The unasked neighbours of the first of `bases` that has any."""
        for i in bases:
            fresh = [j for j in self.space.neighbours(i) if j not in self._asked]
            if fresh:
                return fresh
        return []
