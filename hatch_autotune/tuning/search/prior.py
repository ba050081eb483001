"""A model's prior from related results (`RelatedPriors`): each standardised, those that agree
with what is measured here chosen by rank correlation, their mix fitted as the prior mean."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

MAX_PRIORS = 3  # related results a model uses as its prior mean, at most
MAX_RELATED = 8  # related results a model chooses its priors from, at most
MIN_SHARED = 8  # configs measured both here and in a related result before their agreement counts
MIN_AGREEMENT = 0.3  # the rank correlation a related result needs with what is measured here to be a prior...
CHANCE_Z = 3.0  # ...and above what chance gives 1 time in 700 on that many configs: 3 / sqrt(n - 1)


def no_prior(idx: Any) -> Any:
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


class RelatedPriors:
    """The related results a Gaussian process may take its prior mean from (see `Strategy`:
    per result, each config's speed there relative to its fastest, None where not measured),
    and which of them agree with the measurements, chosen again at each refit (`choose`)."""

    def __init__(self, prior: Sequence[Sequence[float | None]], configs: int):
        self.related, self.known = self._columns(prior, configs)  # (configs, related results) standardised, or None
        self.matrix: Any = None  # the related results that agree with the measurements (chosen at each refit), or None
        self.agreement: dict[int, float] = {}  # per related result (its position in `prior`), its rank correlation with the measurements
        self.chosen: list[int] = []  # the columns of the related results in the prior, the most alike first

    def _columns(self, prior: Sequence[Sequence[float | None]], configs: int) -> tuple[Any, Any]:
        """The related results as model inputs (the first MAX_RELATED): each standardised over
        the configs measured there, 0 (its mean) where a config was not, with a mask of where
        it was; (None, None) without any that tells configs apart."""
        import numpy as np

        columns, masks = [], []
        self.given: list[int] = []  # each column's position in `prior`
        for position, speeds in enumerate(prior[:MAX_RELATED]):
            if len(speeds) != configs:
                raise ValueError(f"a prior has {len(speeds)} speeds for a space of {configs} configs")
            known = np.array([s is not None for s in speeds])
            x = np.array([s if s is not None else 0.0 for s in speeds], dtype=float)
            if known.sum() < 2 or x[known].std() == 0:
                continue
            columns.append(np.where(known, (x - x[known].mean()) / x[known].std(), 0.0))
            masks.append(known)
            self.given.append(position)
        if not columns:
            return None, None
        return np.column_stack(columns), np.column_stack(masks)

    def choose(self, told: Sequence[int], y: Any) -> Any:
        """The related results that agree with what has been measured here, by rank
        correlation (Spearman) over the configs measured in both, at least MIN_SHARED of them:
        those of at least MIN_AGREEMENT and above chance (CHANCE_Z), the most alike first, at
        most MAX_PRIORS; None when none agrees (kept as `matrix`). By similarity, not by name:
        a GPU's closest relative informs its search whatever it is called, and one that ranks
        configs differently is left out."""
        import numpy as np
        from scipy.stats import rankdata

        self.agreement, self.chosen = {}, []
        if self.related is None:
            self.matrix = None
            return None
        idx = np.array(told)
        rho, agree = {}, []
        for c in range(self.related.shape[1]):
            shared = self.known[idx, c]
            if shared.sum() < MIN_SHARED:
                continue
            a, b = rankdata(self.related[idx[shared], c]), rankdata(y[shared])
            if a.std() > 0 and b.std() > 0:
                rho[c] = float(np.corrcoef(a, b)[0, 1])
                if rho[c] >= max(MIN_AGREEMENT, CHANCE_Z / math.sqrt(shared.sum() - 1)):
                    agree.append(c)
        self.agreement = {self.given[c]: r for c, r in rho.items()}
        self.chosen = sorted(agree, key=lambda c: (-rho[c], c))[:MAX_PRIORS]
        self.matrix = self.related[:, self.chosen] if self.chosen else None
        return self.matrix

    @property
    def agreeing(self) -> list[int]:
        """Which related results (their positions in `prior`, as given) agreed with the
        measurements at the last choice, the most alike first."""
        return [self.given[c] for c in self.chosen]

    def mean(self, told: Sequence[int], y: Any) -> Callable[[Any], Any]:
        """The prior mean for any configs: the mix of the chosen results that best predicts the
        targets `y` of the configs `told` (non-negative weights and a constant, least squares;
        transfer between GPUs is partial, between buckets strong). A result that does not predict
        this one gets weight 0; with none that does, the prior mean is 0, as without a prior."""
        import numpy as np

        if self.matrix is None:
            return no_prior
        weights, constant = nonnegative_fit(self.matrix[np.array(told)], y)
        if not weights.any():
            return no_prior
        return lambda idx: constant + self.matrix[idx] @ weights
