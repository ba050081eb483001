"""`gp` (`GaussianProcessSearch`): Bayesian optimisation with a Gaussian process over the
enumerated space; its kernel, its refits and the configs added between them, its proposals."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .gp_math import cholesky, fit_log_params, log_improvement_per_sd, loo_errors
from .model import ModelSearch
from .prior import RelatedPriors, no_prior
from .space import SearchSpace


class GaussianProcessSearch(ModelSearch):
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
        self.priors = RelatedPriors(prior, len(space))  # the related results, and which agree with the measurements
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

    # ---- the prior ----------------------------------------------------------------------------

    @property
    def agreement(self) -> dict[int, float]:
        """Per related result (its position in `prior`), its rank correlation with the
        measurements at the last refit."""
        return self.priors.agreement

    @property
    def priors_agreeing(self) -> list[int]:
        """Which related results (their positions in `prior`, as given) agreed with the
        measurements at the last refit, the most alike first (`agreement` has every one's rank
        correlation)."""
        return self.priors.agreeing

    @property
    def priors_used(self) -> list[int]:
        """The agreeing results, if the model's prior mean draws on them now: none when they
        predict the measurements worse than no prior (leave-one-out, at the last refit)."""
        return self.priors_agreeing if self._prior_on and self.priors.matrix is not None else []

    def _prior_mean(self, told: Sequence[int], y: Any) -> Callable[[Any], Any]:
        """The model's prior mean (`RelatedPriors.mean`), used while it predicts the
        measurements better than no prior, by the model's leave-one-out error at each refit
        (`_rebuild`): a GPU whose optimum lies where the others are slow (benchmark_hub's A100
        convolution) is searched as without the others' results once its own measurements say
        so."""
        return self.priors.mean(told, y)

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
        last fit, the best kept (`fit_log_params`)."""
        np = self._np
        idx = np.array(train)
        pairs = [distance[self._ranks[idx, d][:, None], self._ranks[idx, d][None, :]] for d, distance in self._terms]
        dists = np.stack(pairs) if pairs else np.zeros((0, len(idx), len(idx)))
        best_params = fit_log_params(dists, y, np.append(self._log_weights, self._log_noise), self.fit_steps, self.noise_floor)
        self._log_weights, self._log_noise = best_params[:-1], float(best_params[-1])

    def _rebuild(self) -> None:
        """Refit the weights, then the model's state for the current training set and candidates."""
        np = self._np
        self._train = self._choose_train()
        y = self._targets(self._train)
        told, before = list(self.times), self.priors.matrix
        chosen = self.priors.choose(told, self._targets(told))
        if chosen is None or before is None:  # none agrees; or some newly does: tried, then judged below
            self._prior_on = chosen is not None
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
        self._chol_rows[:n, :n], self._noise = cholesky(self._kernel(idx, idx, self._tabs), math.exp(self._log_noise) + self.noise_floor)
        if chosen is not None:
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
        prior = self._prior_mean(self._train, y) if self._prior_on else no_prior
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
