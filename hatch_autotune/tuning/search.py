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

import functools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..declare.search import SEARCH_STRATEGIES as STRATEGIES  # the names a project may configure
from ..declare.search import Budget  # what a search may spend: the kernel's SearchSpec.budget_for

MAX_PRIORS = 3  # related results a model uses as its prior mean, at most
MAX_RELATED = 8  # related results a model chooses its priors from, at most
MIN_SHARED = 8  # configs measured both here and in a related result before their agreement counts
MIN_AGREEMENT = 0.3  # the rank correlation a related result needs with what is measured here to be a prior...
CHANCE_Z = 3.0  # ...and above what chance gives 1 time in 700 on that many configs: 3 / sqrt(n - 1)


@dataclass
class SearchSpace:
    """The configs of one instance with the structure strategies use: each axis's values and,
    per config, the rank of its value on each axis (values sorted where they are numbers)."""

    axes: Mapping[str, Sequence[Any]]
    configs: Sequence[Mapping[str, Any]]
    ranks: list[tuple[int, ...]] = field(init=False)
    sizes: tuple[int, ...] = field(init=False)
    ordered: tuple[tuple[Any, ...], ...] = field(init=False)  # per axis, its values in rank order
    _index: dict[tuple[int, ...], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ordered = []
        for values in self.axes.values():
            numeric = all(isinstance(v, (int, float)) for v in values)
            ordered.append(tuple(sorted(values) if numeric else values))
        self.ordered = tuple(ordered)
        orders = {axis: {v: r for r, v in enumerate(values)} for axis, values in zip(self.axes, self.ordered)}
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


class _ModelSearch(Strategy):
    """A model-based strategy: scores every unasked config of the space with numpy, so it keeps
    which are unasked as a mask, and each config's ranks as an array over the axes that have
    more than one value (the others tell configs nothing apart)."""

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        import numpy as np

        super().__init__(space, seed, first, prior)
        self._np = np
        self._free = np.ones(len(space), dtype=bool)
        self._live = [d for d, n in enumerate(space.sizes) if n > 1]  # the space's axes that are live
        self._sizes = [space.sizes[d] for d in self._live]  # values per live axis
        self._ranks = np.array(space.ranks, dtype=np.int64).reshape(len(space), len(space.sizes))[:, self._live]  # (configs, live axes)

    def ask(self) -> list[int]:
        batch = super().ask()
        self._free[batch] = False
        return batch

    def _unasked(self) -> Sequence[int]:
        return self._np.flatnonzero(self._free)  # type: ignore[return-value]


class ParzenSearch(_ModelSearch):
    """Model-based: a tree-structured Parzen estimator over the finite space. After a small
    random sample, the measured configs split into the fastest few ("good") and the rest; each
    set's density is a sum of product kernels, one per measured config (per axis: most weight
    on the same value, some on nearby values, a little everywhere), so combinations of values
    count, not only each axis alone. The unmeasured config most likely under the good and least
    under the rest is measured next. Scoring every config of the enumerated space keeps the
    constraints exact (a library's TPE, optuna's included, samples each axis and proposes
    invalid configs); beyond `max_candidates` configs, a sample of them. Settings were tuned
    on benchmark_hub's convolution and dedispersion."""

    name = "tpe"
    initial = 10  # random configs before the model decides
    good_share, good_max = 0.15, 8  # the good set: the fastest min(8, 15%) measured
    same, near, decay, floor = 3.0, 0.05, 0.5, 0.05  # per-axis kernel: same value, nearby, anywhere
    prior = 1.0  # weight of a uniform component in both densities: unexplored configs keep a chance

    max_candidates = 65536  # configs scored, beyond which a seeded sample of them (drawn again once all are asked)

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        super().__init__(space, seed, first, prior)
        np = self._np
        self._columns = []  # per live axis: (each config's rank, the kernel table transposed: row r is the weights around value r)
        for d, n in enumerate(self._sizes):
            gap = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
            table = self.same * (gap == 0) + self.near * self.decay**gap + self.floor
            self._columns.append((np.ascontiguousarray(self._ranks[:, d]), np.ascontiguousarray((table / table.sum(axis=0)).T)))
        self._score: Any = None  # the last proposal's scores: the next ones are likely near its top
        self._draw_candidates()

    def _draw_candidates(self) -> None:
        """The configs scored: all of them, or on a space of more than `max_candidates` a seeded
        sample of the unasked ones (so that a million configs cost what 65,536 do), with the
        kernel sum over every config told, computed again for the new sample."""
        np = self._np
        free = np.flatnonzero(self._free)
        if len(self.space) <= self.max_candidates:
            self._cand: Any = None
            self._cand_ranks = [rank for rank, _ in self._columns]
        else:
            self._cand = free[np.sort(np.array(self.rng.sample(range(len(free)), min(self.max_candidates, len(free)))))]
            self._cand_ranks = [rank[self._cand] for rank, _ in self._columns]
        self._sum_all = sum(
            (self._kernel(i) for i in self.times), np.zeros(len(self._cand_ranks[0]) if self._cand_ranks else len(self.space))
        )
        self._good_kernels: dict[int, Any] = {}  # the good set's kernels, kept while they stay good

    def _kernel(self, index: int) -> Any:
        """Each candidate's kernel weight around config `index`."""
        out = self._np.ones(len(self.space) if self._cand is None else len(self._cand))
        for (rank, around), ranks in zip(self._columns, self._cand_ranks):
            out *= around[rank[index]][ranks]  # contiguous gathers: 65,536 configs in a fraction of a ms
        return out

    def _candidates_free(self) -> Any:
        return self._free if self._cand is None else self._free[self._cand]

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
        if self._cand is not None and not self._candidates_free().any():
            self._draw_candidates()
        chosen = ranked[:n_good]
        self._good_kernels = {i: self._good_kernels[i] if i in self._good_kernels else self._kernel(i) for i in chosen}
        good = sum(self._good_kernels[i] for i in chosen)
        n_rest = len(self.times) - n_good
        uniform = self.prior / math.prod(n for n in self.space.sizes)
        with np.errstate(divide="ignore"):
            score = np.log((good + uniform) / (n_good + self.prior)) - np.log(
                np.maximum((self._sum_all - good + uniform) / (n_rest + self.prior), 1e-300)
            )
        score[~self._candidates_free()] = -np.inf
        self._score = score
        best = int(np.argmax(score))
        return [best if self._cand is None else int(self._cand[best])]

    def upcoming(self, k: int) -> list[int]:
        np = self._np
        if len(self.times) < self.initial or self._score is None:
            return self._next_random(k)
        free = self._candidates_free()
        score = np.where(free, self._score, -np.inf)
        k = min(k, int(free.sum()))
        if k <= 0:
            return []
        top = np.argpartition(-score, k - 1)[:k]
        picks = [int(i) for i in top[np.argsort(-score[top], kind="stable")] if np.isfinite(score[i])]
        return picks if self._cand is None else [int(self._cand[i]) for i in picks]


class GaussianProcessSearch(_ModelSearch):
    """`gp`, the model of the default (`auto`): Bayesian optimisation with a Gaussian process over the enumerated
    space. After a small random sample, a GP models each config's speed relative to the fastest
    so far (failed configs count as speed 0); the next config measured is, turn about, the one
    with the highest optimistic bound and the one with the largest expected improvement over
    the fastest (`_acquisition`). Two configs are alike by how many axes they differ on, by how
    far apart their values lie and, on an integer axis that mixes powers of two with other
    values, by whether one is a power of two and the other not; each distance has its own weight
    per axis, fitted to the measurements (maximum likelihood): the model learns which axes matter,
    whether an axis is smooth (block sizes on one GPU) or jumpy (a value that is 100x slower
    than its neighbours on another), and whether a block size that is not a power of two is
    slow wherever it lies (three of benchmark_hub's four GPUs). This is what finds a narrow
    optimum away from a broad second-best region (benchmarks/search_quality.py measures it
    against tpe and Kernel Tuner's strategies). With a warm start, what earlier results
    measured is the model's prior mean (`_prior_mean`), while it predicts better than none.

    The cost stays bounded on big spaces and budgets: a refit keeps `max_train` measurements
    (the fastest half of them and the latest) and the next `max_train` + 1 are added without
    one, each in O(measurements x candidates); at most `max_candidates` unmeasured configs are
    scored (a seeded sample, drawn again at every refit)."""

    name = "gp"
    uses_prior = True
    initial = 10  # random configs before the model decides
    max_train = 300  # measurements a refit keeps: the fastest half and the latest
    max_candidates = 16384  # unmeasured configs scored per proposal, beyond which a sample
    fit_steps = 50  # Adam steps on the log-likelihood per refit
    explore = 3.0  # standard deviations above the mean of every other proposal's bound
    noise_floor = 1e-6

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        from scipy.linalg import solve_triangular  # here: scipy takes longer to import than the tuner

        super().__init__(space, seed, first, prior)
        np = self._np
        # L x = b for one vector b, O(n^2). The matrix work (the fit's inverse, L^-1 K for every
        # candidate at a refit) stays in numpy.linalg: numpy and scipy each bring an OpenBLAS with
        # its own threads, and alternating big calls between the two made searches ~30% slower
        # (2 cores; their threads spin after each call and take the cores from the other's).
        self._lower_solve = functools.partial(solve_triangular, lower=True, check_finite=False)
        self._related, self._related_known = self._prior_columns(prior)  # (configs, related results) standardised, or None
        self._prior: Any = None  # the related results that agree with the measurements (chosen at each refit), or None
        self.agreement: dict[int, float] = {}  # per related result (its position in `prior`), its rank correlation with the measurements
        self._chosen: list[int] = []  # the columns of the related results in the prior, the most alike first
        self._prior_on = False  # whether the chosen prior predicts the measurements (decided at each refit)
        self._terms = []  # (live axis, distance between any two of its values), one weight each
        for d, (n, values) in enumerate(zip(self._sizes, (space.ordered[a] for a in self._live))):
            ranks = np.arange(n)
            self._terms.append((d, (ranks[:, None] != ranks[None, :]).astype(float)))  # differ
            self._terms.append((d, np.abs(ranks[:, None] - ranks[None, :]) / (n - 1)))  # how far apart
            if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
                pow2 = np.array([v & (v - 1) == 0 for v in values])
                if 0 < pow2.sum() < n:  # one a power of two, the other not
                    self._terms.append((d, (pow2[:, None] != pow2[None, :]).astype(float)))
        self._log_weights = np.zeros(len(self._terms))
        self._log_noise = math.log(1e-2)
        self._noise = 0.0  # the noise variance the model's factor was built with
        self._fitted_at = 0  # configs told at the last refit
        self._modelled = 0  # configs told that the model's state has seen
        self._train: list[int] = []
        self._score: Any = None  # the last proposal's score per candidate...
        self._mean: Any = None  # ...the model's mean and the best target it improves on
        self._best = 0.0
        self._proposed = 0  # ...and the candidate it proposed

    # ---- the kernel ---------------------------------------------------------------------

    def _tables(self, log_weights: Any) -> list[Any]:
        """Per live axis, the log kernel factor between any two of its values."""
        tables = [self._np.zeros((n, n)) for n in self._sizes]
        for (d, distance), w in zip(self._terms, self._np.exp(log_weights)):
            tables[d] = tables[d] - w * distance
        return tables

    def _kernel(self, a: Any, b: Any, tables: list[Any]) -> Any:
        """The kernel matrix between configs `a` and `b` (index arrays): a product over axes."""
        log_k = self._np.zeros((len(a), len(b)))
        for d, table in enumerate(tables):
            log_k += table[self._ranks[a, d][:, None], self._ranks[b, d][None, :]]
        return self._np.exp(log_k)

    # ---- fitting --------------------------------------------------------------------------

    def _targets(self, told: Sequence[int]) -> Any:
        """Speed relative to the fastest told (failed: 0), standardised. A time of 0 (a broken
        timer, a replay file) counts as the shortest a GPU can tell, not as a division by zero."""
        np = self._np
        t = np.maximum(np.array([self.times[i] for i in told]), 1e-9)
        finite = np.isfinite(t)
        y = np.zeros(len(t))
        if finite.any():
            y[finite] = t[finite].min() / t[finite]
        spread = y.std()
        return (y - y.mean()) / (spread if spread > 0 else 1.0)

    def _prior_columns(self, prior: Sequence[Sequence[float | None]]) -> tuple[Any, Any]:
        """The related results as model inputs (the first MAX_RELATED): each standardised over
        the configs measured there, 0 (its mean) where a config was not, with a mask of where
        it was; (None, None) without any that tells configs apart."""
        np = self._np
        columns, masks = [], []
        self._related_given: list[int] = []  # each column's position in `prior`
        for position, speeds in enumerate(prior[:MAX_RELATED]):
            if len(speeds) != len(self.space):
                raise ValueError(f"a prior has {len(speeds)} speeds for a space of {len(self.space)} configs")
            known = np.array([s is not None for s in speeds])
            x = np.array([s if s is not None else 0.0 for s in speeds], dtype=float)
            if known.sum() < 2 or x[known].std() == 0:
                continue
            columns.append(np.where(known, (x - x[known].mean()) / x[known].std(), 0.0))
            masks.append(known)
            self._related_given.append(position)
        if not columns:
            return None, None
        return np.column_stack(columns), np.column_stack(masks)

    def _choose_priors(self, told: Sequence[int], y: Any) -> Any:
        """The related results that agree with what has been measured here, by rank
        correlation (Spearman) over the configs measured in both, at least MIN_SHARED of them:
        those of at least MIN_AGREEMENT and above chance (CHANCE_Z), the most alike first, at
        most MAX_PRIORS; None when none agrees. By similarity, not by name: a GPU's closest relative informs its search
        whatever it is called, and one that ranks configs differently is left out."""
        np = self._np
        from scipy.stats import rankdata

        self.agreement, self._chosen = {}, []
        if self._related is None:
            return None
        idx = np.array(told)
        rho, agree = {}, []
        for c in range(self._related.shape[1]):
            shared = self._related_known[idx, c]
            if shared.sum() < MIN_SHARED:
                continue
            a, b = rankdata(self._related[idx[shared], c]), rankdata(y[shared])
            if a.std() > 0 and b.std() > 0:
                rho[c] = float(np.corrcoef(a, b)[0, 1])
                if rho[c] >= max(MIN_AGREEMENT, CHANCE_Z / math.sqrt(shared.sum() - 1)):
                    agree.append(c)
        self.agreement = {self._related_given[c]: r for c, r in rho.items()}
        self._chosen = sorted(agree, key=lambda c: (-rho[c], c))[:MAX_PRIORS]
        return self._related[:, self._chosen] if self._chosen else None

    @property
    def priors_agreeing(self) -> list[int]:
        """Which related results (their positions in `prior`, as given) agreed with the
        measurements at the last refit, the most alike first (`agreement` has every one's rank
        correlation)."""
        return [self._related_given[c] for c in self._chosen]

    @property
    def priors_used(self) -> list[int]:
        """The agreeing results, if the model's prior mean draws on them now: none when they
        predict the measurements worse than no prior (leave-one-out, at the last refit)."""
        return self.priors_agreeing if self._prior_on and self._prior is not None else []

    def _prior_mean(self, told: Sequence[int], y: Any) -> Callable[[Any], Any]:
        """The model's prior mean for any configs: the mix of related results that best predicts
        the targets `y` of the configs `told` (non-negative weights and a constant, least squares;
        transfer between GPUs is partial, between buckets strong). A result that does not predict
        this one gets weight 0; with none that does, the prior mean is 0, as without a prior.
        Used while it predicts the measurements better than no prior, by the model's
        leave-one-out error at each refit (`_rebuild`): a GPU whose optimum lies where the others
        are slow (benchmark_hub's A100 convolution) is searched as without the others' results
        once its own measurements say so."""
        np = self._np
        if self._prior is None:
            return _no_prior
        weights, constant = nonnegative_fit(self._prior[np.array(told)], y)
        if not weights.any():
            return _no_prior
        return lambda idx: constant + self._prior[idx] @ weights

    def _choose_train(self) -> list[int]:
        """At most `max_train` told configs: all of them, or the fastest half and the latest."""
        told = list(self.times)  # in the order told
        if len(told) <= self.max_train:
            return told
        half = self.max_train // 2
        fastest = sorted(told, key=lambda i: (self.times[i], i))[:half]
        chosen = set(fastest)
        latest = [i for i in reversed(told) if i not in chosen][: self.max_train - half]
        return fastest + latest[::-1]

    def _fit(self, train: list[int], y: Any) -> None:
        """Maximum-likelihood weights and noise: `fit_steps` Adam steps on their logs from the
        last fit, the best kept. Not an optimiser run to convergence: L-BFGS-B (scipy) in its
        place found the optimum less often on benchmark_hub (median at 1% of the space 0.84
        against 0.98, 45 searches)."""
        np = self._np
        idx = np.array(train)
        pairs = [distance[self._ranks[idx, d][:, None], self._ranks[idx, d][None, :]] for d, distance in self._terms]
        dists = np.stack(pairs) if pairs else np.zeros((0, len(idx), len(idx)))
        params = np.append(self._log_weights, self._log_noise)
        best, best_params = math.inf, params.copy()
        m, v = np.zeros_like(params), np.zeros_like(params)
        eye = np.eye(len(idx))
        for step in range(1, self.fit_steps + 1):
            w, noise = np.exp(params[:-1]), math.exp(params[-1]) + self.noise_floor
            signal = np.exp(-np.tensordot(w, dists, 1)) if len(w) else np.ones((len(idx), len(idx)))
            try:
                chol = np.linalg.cholesky(signal + noise * eye)
            except np.linalg.LinAlgError:
                break
            inv = np.linalg.inv(signal + noise * eye)
            alpha = inv @ y
            nll = 0.5 * y @ alpha + np.log(np.diag(chol)).sum()
            if nll < best:
                best, best_params = nll, params.copy()
            slope = np.outer(alpha, alpha) - inv  # d nll / d K = -0.5 slope
            outer = slope * signal  # d nll / d log w = 0.5 w sum(outer * dist)
            grad = np.append(0.5 * w * np.tensordot(dists, outer, ((1, 2), (0, 1))), -0.5 * np.trace(slope) * (noise - self.noise_floor))
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad**2
            params = params - 0.1 * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
            params = np.clip(params, [-6.0] * (len(params) - 1) + [-9.0], [4.0] * (len(params) - 1) + [0.0])
        self._log_weights, self._log_noise = best_params[:-1], float(best_params[-1])

    def _rebuild(self) -> None:
        """Refit the weights, then the model's state for the current training set and candidates."""
        np = self._np
        self._train = self._choose_train()
        y = self._targets(self._train)
        told, before = list(self.times), self._prior
        self._prior = self._choose_priors(told, self._targets(told))
        if self._prior is None or before is None:  # none agrees; or some newly does: tried, then judged below
            self._prior_on = self._prior is not None
        offset = self._prior_mean(self._train, y)(np.array(self._train))
        self._fit(self._train, y - offset if self._prior_on else y)  # the kernel for the model in use
        self._fitted_at = len(self.times)
        self._tabs = self._tables(self._log_weights)
        free = np.flatnonzero(self._free)
        if len(free) > self.max_candidates:
            free = free[np.sort(np.array(self.rng.sample(range(len(free)), self.max_candidates)))]  # positions: no list of them
        self._candidates = free
        idx = np.array(self._train)
        n, room = len(idx), 2 * self.max_train + 1  # rows kept for the configs added before the next refit
        self._chol_rows = np.zeros((room, room))  # the Cholesky factor L of the training kernel
        self._proj_rows = np.zeros((room, len(self._candidates)))  # L^-1 K(train, candidates)
        self._chol_rows[:n, :n], self._noise = _cholesky(self._kernel(idx, idx, self._tabs), math.exp(self._log_noise) + self.noise_floor)
        if self._prior is not None:
            with_prior, without = loo_errors(self._chol_rows[:n, :n], [y - offset, y])
            self._prior_on = with_prior < without
        self._proj_rows[:n] = np.linalg.solve(
            self._chol_rows[:n, :n], self._kernel(idx, self._candidates, self._tabs)
        )  # numpy's threads: see __init__
        self._var = np.maximum(1.0 - (self._proj_rows[:n] ** 2).sum(axis=0), 1e-12)

    def _extend(self, index: int) -> tuple[Any, float, Any]:
        """What adding config `index` to the model gives, hyperparameters unchanged, in
        O(n x candidates): its row of the Cholesky factor, the corner, and its row of L^-1 K."""
        np = self._np
        n = len(self._train)
        k = self._kernel(np.array(self._train), np.array([index]), self._tabs)[:, 0]
        row = self._lower_solve(self._chol_rows[:n, :n], k)
        corner = math.sqrt(max(1.0 + self._noise - row @ row, 1e-12))
        proj = (self._kernel(np.array([index]), self._candidates, self._tabs)[0] - row @ self._proj_rows[:n]) / corner
        return row, corner, proj

    def _add(self, index: int) -> None:
        np = self._np
        n = len(self._train)
        self._chol_rows[n, :n], self._chol_rows[n, n], self._proj_rows[n] = self._extend(index)
        self._var = np.maximum(self._var - self._proj_rows[n] ** 2, 1e-12)
        self._train.append(index)

    def _due(self) -> bool:
        """Refit every 10 configs told, then every 20% more once past 50, and when the rows kept
        for added configs run out."""
        told, at = len(self.times), self._fitted_at
        unmodelled = told - self._modelled
        return at == 0 or told - at >= max(10, at // 5) or len(self._train) + unmodelled > 2 * self.max_train + 1

    # ---- proposing ------------------------------------------------------------------------

    def propose(self) -> Iterable[int]:
        np = self._np
        if not self._free.any():
            return []
        if len(self.times) < self.initial or not any(math.isfinite(t) for t in self.times.values()):
            return self._random(max(1, self.initial - len(self.times)))
        if self._due():
            self._rebuild()
        else:
            for i in list(self.times)[self._modelled :]:
                self._add(i)
        self._modelled = len(self.times)
        y = self._targets(self._train)
        prior = self._prior_mean(self._train, y) if self._prior_on else _no_prior
        n = len(self._train)
        self._mean = self._lower_solve(self._chol_rows[:n, :n], y - prior(np.array(self._train))) @ self._proj_rows[:n] + prior(
            self._candidates
        )
        self._best = y.max()
        score = self._acquisition(self._mean, self._var, self._best, len(self.times))
        best = int(np.argmax(score))
        if not np.isfinite(score[best]):  # every sampled candidate asked: a random config now,
            self._fitted_at, self._score = 0, None  # a refit with a new sample at the next proposal
            return self._random(1)
        self._score, self._proposed = score, best
        return [int(self._candidates[best])]

    def _acquisition(self, mean: Any, var: Any, best: float, told: int) -> Any:
        """Each candidate's score for the proposal made after `told` configs; -inf for those
        already asked. Turn about: an optimistic bound, the mean plus `explore` standard
        deviations (where the model is unsure and might be fast: it leaves a second-best region
        for an untried one), and the log of the expected improvement over `best` (near the
        fastest: it pins down the optimum of a region). Expected improvement alone stayed in a
        broad second-best region far more often (benchmark_hub's A100 and W6600 convolution
        files, README "What was tried"). Its log, because far from the best the improvement
        itself underflows, and the search spends most of its steps choosing among such
        candidates."""
        np = self._np
        sd = np.sqrt(var)
        if told % 2 == 0:
            score = mean + self.explore * sd
        else:
            score = np.log(sd) + log_improvement_per_sd((mean - best) / sd)
        score[~self._free[self._candidates]] = -np.inf
        return score

    def upcoming(self, k: int) -> list[int]:
        """The next proposals if the config being measured turns out as the model expects
        ("kriging believer"): its neighbourhood's uncertainty shrinks, the rest is unchanged."""
        np = self._np
        if len(self.times) < self.initial or self._score is None:
            return self._next_random(k)
        proposed = int(self._candidates[self._proposed])
        var = np.maximum(self._var - self._extend(proposed)[2] ** 2, 1e-12)
        score = self._acquisition(self._mean, var, max(self._best, float(self._mean[self._proposed])), len(self.times) + 1)
        k = min(k, int(np.isfinite(score).sum()))
        if k <= 0:
            return []
        top = np.argpartition(-score, k - 1)[:k]
        return [int(self._candidates[i]) for i in top[np.argsort(-score[top], kind="stable")]]


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


def _no_prior(idx: Any) -> Any:
    """The prior mean without a prior: 0 for every config (the targets are standardised)."""
    import numpy as np

    return np.zeros(len(idx))


def nonnegative_fit(x: Any, y: Any) -> tuple[Any, float]:
    """Least squares y ~ x @ w + c with w >= 0 and c free: the weights are the non-negative
    least-squares fit of the centred y to the centred columns of x (the free constant takes the
    means), the constant what the means leave."""
    import numpy as np
    from scipy.optimize import nnls

    x_mean, y_mean = x.mean(axis=0), float(np.mean(y))
    weights = nnls(x - x_mean, y - y_mean)[0]
    return weights, y_mean - float(x_mean @ weights)


def loo_errors(lower: Any, targets: Sequence[Any]) -> list[float]:
    """For each of `targets`, the mean squared leave-one-out error of a Gaussian process's
    prediction of it, from the Cholesky factor of its training kernel (exact:
    r_i = [K^-1 y]_i / [K^-1]_ii; the inverse formed once for all of them)."""
    import numpy as np

    inverse = np.linalg.inv(lower)
    k_inv = inverse.T @ inverse
    diagonal = np.diag(k_inv)
    return [float((((k_inv @ y) / diagonal) ** 2).mean()) for y in targets]


def _cholesky(kernel: Any, noise: float) -> tuple[Any, float]:
    """The Cholesky factor of kernel + noise * I and the noise it took: more than asked only if
    rounding made the matrix indefinite (the kernel is positive semi-definite)."""
    import numpy as np

    for _ in range(8):
        try:
            return np.linalg.cholesky(kernel + noise * np.eye(len(kernel))), noise
        except np.linalg.LinAlgError:
            noise *= 10
    raise np.linalg.LinAlgError("the kernel matrix is not positive definite even with noise added")


def log_improvement_per_sd(z: Any) -> Any:
    """log(z * Phi(z) + phi(z)), elementwise: the log of the expected improvement in units of the
    standard deviation, z the mean's gap to the best in the same units. For z < 0 through the
    scaled complementary error function (Phi / phi = sqrt(pi / 2) erfcx(-z / sqrt(2))), so that
    neither tiny number is formed; below z = -40, where 1 + z * Phi / phi cancels, from its
    asymptotic series (truncated there after 1e-15)."""
    import numpy as np
    from scipy.special import erfcx, ndtr

    z = np.asarray(z, dtype=float)
    log_phi = -0.5 * z * z - 0.5 * math.log(2 * math.pi)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        above = np.log(z * ndtr(z) + np.exp(log_phi))  # z >= 0
        mills = math.sqrt(math.pi / 2) * erfcx(-z / math.sqrt(2))  # Phi(z) / phi(z)
        below = log_phi + np.log1p(z * mills)  # z * mills > -1 for z < 0
        w = 1.0 / (z * z)
        tail = log_phi + np.log(w * (1.0 - 3.0 * w * (1.0 - 5.0 * w * (1.0 - 7.0 * w * (1.0 - 9.0 * w)))))  # 1/z^2 - 3/z^4 + 15/z^6 - ...
    return np.where(z >= 0, above, np.where(z > -40, below, tail))


_CLASSES = {c.name: c for c in (Exhaustive, RandomSample, LocalSearch, ParzenSearch, GaussianProcessSearch, Portfolio)}


def _strategy_class(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}: expected one of {', '.join(STRATEGIES)}")
    return _CLASSES[name]


def make_strategy(
    name: str, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()
) -> Strategy:
    """The strategy called `name` (config.py's SEARCH_STRATEGIES); `auto` is the recommended one."""
    return _strategy_class(name)(space, seed, first, prior)


def uses_prior(name: str) -> bool:
    """Whether the strategy called `name` uses a prior (`Strategy.uses_prior`)."""
    return _strategy_class(name).uses_prior


@dataclass(frozen=True)
class WarmStart:
    """What the lock tells a bucket's search before it measures anything: configs to measure
    first, and related results as `auto`'s prior (see Strategy). Fixed when a run starts; plain
    data, so that it crosses Ray as JSON."""

    first: tuple[int, ...] = ()
    prior: tuple[tuple[float | None, ...], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"first": list(self.first), "prior": [list(p) for p in self.prior]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "WarmStart":
        return cls(tuple(raw["first"]), tuple(tuple(p) for p in raw["prior"]))


def run_search(
    strategy: Strategy,
    measure: Callable[[int], float | None],
    budget: Budget,
    clock: Callable[[], float],
    prepare: Callable[[list[int]], None] = lambda batch: None,
    prefetch: Callable[[list[int]], None] | None = None,
    ahead: int = 0,
    own_time: list[float] | None = None,
) -> list[int]:
    """Ask, (prepare: compile the batch), measure and tell until the budget is spent or the
    strategy is done; returns the configs tried, in order. `measure` returns a config's time in
    ms or None if it failed; `clock` is seconds (wall, or a replay's simulated clock). While a
    batch is measured, `prefetch` gets the strategy's `ahead` likeliest next configs, to compile
    them in the meantime: a strategy that asks for one config at a time would otherwise wait
    for each compile in turn. `own_time` (one element) gets the strategy's own seconds added
    (ask, tell and upcoming, on the wall clock): what searching costs beside measuring."""
    tried: list[int] = []
    start = clock()
    own = 0.0
    try:
        while not budget.spent(len(tried), clock() - start):
            t = time.perf_counter()
            batch = strategy.ask()
            own += time.perf_counter() - t
            if not batch:
                break
            if budget.configs is not None:
                batch = batch[: budget.configs - len(tried)]
            prepare(batch)
            if prefetch is not None and ahead > 0:
                t = time.perf_counter()
                upcoming = strategy.upcoming(ahead)
                own += time.perf_counter() - t
                prefetch(upcoming)
            for i in batch:
                ms = measure(i)
                t = time.perf_counter()
                strategy.tell(i, ms)
                own += time.perf_counter() - t
                tried.append(i)
                if budget.spent(len(tried), clock() - start):
                    break
    finally:
        if own_time is not None:
            own_time[0] += own
    return tried
