"""`auto`, the default (`Portfolio`): the Gaussian process and the Parzen estimator as one search,
the estimator taking turns once the process stalls."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .base import Strategy
from .gp import GaussianProcessSearch
from .space import SearchSpace
from .tpe import ParzenSearch


class Portfolio(Strategy):
    """The default (`auto`): the Gaussian process (`gp`) and the Parzen estimator (`tpe`) as one
    search, both told every measurement. Neither model is best on every space: the GP finds a
    narrow optimum away from a broad second-best region (benchmark_hub's A100 convolution), but
    where its length scales mislead it, it keeps refining a basin that the estimator's density of
    good configs leaves (the MI250X convolution's worst seeds). So the GP proposes while it
    improves on the fastest config; once `stall` configs in a row have not, the estimator takes
    every other turn until one does. Chosen on the development seeds (search_quality.py
    `--half dev`): taking turns from the start (every 2nd, 3rd or 4th proposal the
    estimator's) cost the A100's narrow optimum at 2% (median 0.67-0.78 against the GP's 1.00);
    a stall of 10 cost it too (0.83), a stall of 20 did not, and was at least as good as the
    better model on each convolution file."""

    name = "auto"
    uses_prior = True
    initial = 10  # random configs before the models decide (each would make its own)
    stall = 20  # configs told without a new fastest before the estimator takes turns

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        super().__init__(space, seed, first, prior)
        self.gp = GaussianProcessSearch(space, seed, (), prior)
        self.tpe = ParzenSearch(space, seed, (), ())
        self._best: tuple[float, int] = (math.inf, -1)  # the fastest time told so far, and when (configs told before it)

    def ask(self) -> list[int]:
        batch = super().ask()
        for model in (self.gp, self.tpe):
            model._asked.update(batch)
            model._free[batch] = False
        return batch

    def tell(self, index: int, ms: float | None) -> None:
        super().tell(index, ms)
        if self.times[index] < self._best[0]:
            self._best = (self.times[index], len(self.times) - 1)
        self.gp.tell(index, ms)
        self.tpe.tell(index, ms)

    def _unasked(self) -> Sequence[int]:
        return self.gp._unasked()  # its mask is the portfolio's: every config asked is marked in both models

    def _next_model(self, ahead: int = 0) -> Strategy:
        """The GP while it improves; past `stall` configs without a new fastest, turn about
        (`ahead`: for the proposal after that many more, were none of them a new fastest)."""
        since = len(self.times) + ahead - 1 - self._best[1]
        return self.tpe if since >= self.stall and (since - self.stall) % 2 == 0 else self.gp

    def propose(self) -> Iterable[int]:
        if len(self.times) < self.initial:
            return self._random(self.initial - len(self.times))
        return self._next_model().propose()

    @property
    def priors_used(self) -> list[int]:
        return self.gp.priors_used

    @property
    def agreement(self) -> dict[int, float]:
        return self.gp.agreement

    def upcoming(self, k: int) -> list[int]:
        """The next model's guesses first, then the other's."""
        if len(self.times) < self.initial:
            return self._next_random(k)
        first, second = self._next_model(1), self._next_model(2)  # after the config being measured is told
        guesses = first.upcoming(k) + (second.upcoming(k) if second is not first else [])
        return [i for i in dict.fromkeys(guesses) if i not in self._asked][:k]
