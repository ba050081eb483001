"""Search strategies: which configs of a space to measure, in what order, within a budget.

A strategy proposes batches of config indices (`ask`) and learns each one's time (`tell`);
the loop that measures, counts the budget and stops is `run_search`, shared by the GPU tuner
and the replay benchmark, so a strategy is proven on recorded data with the same code that
runs on a GPU (after Kernel Tuner's strategy/runner split). A batch is what can be compiled in
parallel before any of it is measured. Every strategy is deterministic for its seed and never
proposes a config twice; a time of None means the config failed (did not compile, was pruned,
crashed, gave a wrong answer): the strategy treats it as infinitely slow.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..spec.config import SEARCH_STRATEGIES as STRATEGIES  # the names a project may configure


@dataclass
class SearchSpace:
    """The configs of one instance with the structure strategies use: each axis's values and,
    per config, the rank of its value on each axis (values sorted where they are numbers)."""

    axes: Mapping[str, Sequence[Any]]
    configs: Sequence[Mapping[str, Any]]
    ranks: list[tuple[int, ...]] = field(init=False)
    sizes: tuple[int, ...] = field(init=False)
    _index: dict[tuple[int, ...], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        orders = {}
        for axis, values in self.axes.items():
            numeric = all(isinstance(v, (int, float)) for v in values)
            ordered = sorted(values) if numeric else list(values)
            orders[axis] = {v: r for r, v in enumerate(ordered)}
        self.sizes = tuple(len(v) for v in self.axes.values())
        self.ranks = [tuple(orders[a][c[a]] for a in self.axes) for c in self.configs]
        self._index = {r: i for i, r in enumerate(self.ranks)}

    def __len__(self) -> int:
        return len(self.configs)

    def features(self) -> list[list[float]]:
        """Each config as a point of the unit cube (rank / (values - 1) per axis with values)."""
        live = [d for d, n in enumerate(self.sizes) if n > 1]
        return [[r[d] / (self.sizes[d] - 1) for d in live] for r in self.ranks]

    def neighbours(self, index: int) -> list[int]:
        """Configs one step away: one axis moved to the next or previous value (any other value
        for a two-valued axis), the others unchanged; in canonical order."""
        here = self.ranks[index]
        out = []
        for d, n in enumerate(self.sizes):
            for r in (here[d] - 1, here[d] + 1):
                if 0 <= r < n:
                    j = self._index.get(here[:d] + (r,) + here[d + 1 :])
                    if j is not None:
                        out.append(j)
        return sorted(out)


class Strategy:
    """Proposes configs; `first` (the default, warm starts) are measured before anything else."""

    name = ""

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = ()):
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

    def _unasked(self) -> list[int]:
        return [i for i in range(len(self.space)) if i not in self._asked]

    def _random(self, k: int) -> list[int]:
        rest = self._unasked()
        return self.rng.sample(rest, min(k, len(rest)))

    def _next_random(self, k: int) -> list[int]:
        """What `_random(k)` would draw now, without drawing: a copy of the generator draws it."""
        copy = random.Random()
        copy.setstate(self.rng.getstate())
        rest = self._unasked()
        return copy.sample(rest, min(k, len(rest)))

    def _fresh_neighbours(self, bases: Iterable[int]) -> list[int]:
        """The unasked neighbours of the first of `bases` that has any."""
        for i in bases:
            fresh = [j for j in self.space.neighbours(i) if j not in self._asked]
            if fresh:
                return fresh
        return []


class Exhaustive(Strategy):
    """Every config, in canonical order."""

    name = "exhaustive"

    def propose(self) -> Iterable[int]:
        return self._unasked()


class RandomSample(Strategy):
    """Every config, in a seeded random order: a budget makes it a uniform sample."""

    name = "random"

    def propose(self) -> Iterable[int]:
        return self._random(len(self.space))


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


class ParzenSearch(Strategy):
    """Model-based: a tree-structured Parzen estimator over the finite space. After a small
    random sample, the measured configs split into the fastest few ("good") and the rest; each
    set's density is a sum of product kernels, one per measured config (per axis: most weight
    on the same value, some on nearby values, a little everywhere), so combinations of values
    count, not only each axis alone. The unmeasured config most likely under the good and least
    under the rest is measured next. Scoring every config of the enumerated space keeps the
    constraints exact (a library's TPE, optuna's included, samples each axis and proposes
    invalid configs). Settings were tuned on benchmark_hub's convolution and dedispersion."""

    name = "tpe"
    initial = 10  # random configs before the model decides
    good_share, good_max = 0.15, 8  # the good set: the fastest min(8, 15%) measured
    same, near, decay, floor = 3.0, 0.05, 0.5, 0.05  # per-axis kernel: same value, nearby, anywhere
    prior = 1.0  # weight of a uniform component in both densities: unexplored configs keep a chance

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = ()):
        import numpy as np

        super().__init__(space, seed, first)
        self._np = np
        ranks = np.array(space.ranks, dtype=np.int64).reshape(len(space), len(space.sizes))
        self._columns = []  # per axis with more than one value: (each config's rank, kernel table)
        for d, n in enumerate(space.sizes):
            if n > 1:
                gap = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
                table = self.same * (gap == 0) + self.near * self.decay**gap + self.floor
                self._columns.append((ranks[:, d], table / table.sum(axis=0)))
        self._free = np.ones(len(space), dtype=bool)
        self._sum_all = np.zeros(len(space))  # kernel sum over every config told
        self._score: Any = None  # the last proposal's scores: the next ones are likely near its top
        self._good_kernels: dict[int, Any] = {}  # the good set's kernels, kept while they stay good

    def _kernel(self, index: int) -> Any:
        """Every config's kernel weight around config `index`."""
        out = self._np.ones(len(self.space))
        for rank, table in self._columns:
            out *= table[rank, rank[index]]
        return out

    def ask(self) -> list[int]:
        batch = super().ask()
        self._free[batch] = False
        return batch

    def tell(self, index: int, ms: float | None) -> None:
        super().tell(index, ms)
        self._sum_all += self._kernel(index)

    def propose(self) -> Iterable[int]:
        np = self._np
        if not self._free.any():
            return []
        if len(self.times) < self.initial:
            return self._random(self.initial - len(self.times))
        ranked = self._fastest()
        n_good = min(self.good_max, math.ceil(self.good_share * len(self.times)), len(ranked))
        if n_good == 0:
            return self._random(1)
        chosen = ranked[:n_good]
        self._good_kernels = {i: self._good_kernels[i] if i in self._good_kernels else self._kernel(i) for i in chosen}
        good = sum(self._good_kernels[i] for i in chosen)
        n_rest = len(self.times) - n_good
        uniform = self.prior / math.prod(n for n in self.space.sizes)
        with np.errstate(divide="ignore"):
            score = np.log((good + uniform) / (n_good + self.prior)) - np.log(np.maximum((self._sum_all - good + uniform) / (n_rest + self.prior), 1e-300))
        score[~self._free] = -np.inf
        self._score = score
        return [int(np.argmax(score))]

    def upcoming(self, k: int) -> list[int]:
        np = self._np
        if len(self.times) < self.initial or self._score is None:
            return self._next_random(k)
        score = np.where(self._free, self._score, -np.inf)
        k = min(k, int(self._free.sum()))
        if k <= 0:
            return []
        top = np.argpartition(-score, k - 1)[:k]
        return [int(i) for i in top[np.argsort(-score[top], kind="stable")] if np.isfinite(score[i])]


class ParzenLocalSearch(ParzenSearch):
    """The default (`auto`): the Parzen model's proposals, with every few a local step (an
    unmeasured neighbour of one of the fastest configs). The model finds the promising region;
    the local step searches next to its best configs, where the model's view is coarse, which
    makes the search steadier across seeds (benchmarks/search_quality.py measures both)."""

    name = "auto"
    local_every = 4  # every 4th proposal after the random start is a local step
    local_from = 8  # a local step looks at the neighbours of the fastest 8 configs
    random_every = 3  # every 3rd a random config: a way out of a basin the model settled in

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = ()):
        super().__init__(space, seed, first)
        self._steps = 0

    def _step(self, n: int) -> str:
        """What the n-th proposal after the random start is: random, local or the model's."""
        if self.random_every and n % self.random_every == 0:
            return "random"
        return "local" if n % self.local_every == 0 else "model"

    def propose(self) -> Iterable[int]:
        if len(self.times) >= self.initial:
            self._steps += 1
            step = self._step(self._steps)
            if step == "random":
                return self._random(1)
            if step == "local":
                fresh = self._fresh_neighbours(self._fastest()[: self.local_from])
                if fresh:
                    return [self.rng.choice(fresh)]
        return super().propose()

    def upcoming(self, k: int) -> list[int]:
        if len(self.times) < self.initial:
            return super().upcoming(k)
        step = self._step(self._steps + 1)
        guess = self._next_random(1) if step == "random" else self._fresh_neighbours(self._fastest()[: self.local_from]) if step == "local" else []
        return list(dict.fromkeys(guess + super().upcoming(k)))[:k]


def make_strategy(name: str, space: SearchSpace, seed: int = 0, first: Sequence[int] = ()) -> Strategy:
    """The strategy called `name` (config.py's SEARCH_STRATEGIES); `auto` is the recommended one."""
    classes = {c.name: c for c in (Exhaustive, RandomSample, LocalSearch, ParzenSearch, ParzenLocalSearch)}
    if name not in STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}: expected one of {', '.join(STRATEGIES)}")
    return classes[name](space, seed, first)


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: configs tried (each proposed config counts, a failed one
    too) and/or seconds on its clock (compiling and measuring). None: no limit."""

    configs: int | None = None
    seconds: float | None = None

    def spent(self, tried: int, seconds: float) -> bool:
        return (self.configs is not None and tried >= self.configs) or (self.seconds is not None and seconds >= self.seconds)


def run_search(
    strategy: Strategy,
    measure: Callable[[int], float | None],
    budget: Budget,
    clock: Callable[[], float],
    prepare: Callable[[list[int]], None] = lambda batch: None,
    prefetch: Callable[[list[int]], None] | None = None,
    ahead: int = 0,
) -> list[int]:
    """Ask, (prepare: compile the batch), measure and tell until the budget is spent or the
    strategy is done; returns the configs tried, in order. `measure` returns a config's time in
    ms or None if it failed; `clock` is seconds (wall, or a replay's simulated clock). While a
    batch is measured, `prefetch` gets the strategy's `ahead` likeliest next configs, to compile
    them in the meantime: a strategy that asks for one config at a time would otherwise wait
    for each compile in turn."""
    tried: list[int] = []
    start = clock()
    while not budget.spent(len(tried), clock() - start):
        batch = strategy.ask()
        if not batch:
            break
        if budget.configs is not None:
            batch = batch[: budget.configs - len(tried)]
        prepare(batch)
        if prefetch is not None and ahead > 0:
            prefetch(strategy.upcoming(ahead))
        for i in batch:
            strategy.tell(i, measure(i))
            tried.append(i)
            if budget.spent(len(tried), clock() - start):
                break
    return tried
