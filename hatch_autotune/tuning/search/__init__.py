"""Search strategies: which configs of a space to measure, in what order, within a budget.

A strategy proposes batches of config indices (`ask`) and learns each one's time (`tell`);
the loop that measures, counts the budget and stops is `run_search`, shared by the GPU tuner
and the replay benchmark, so a strategy is proven on recorded data with the same code that
runs on a GPU (after Kernel Tuner's strategy/runner split). A batch is what can be compiled in
parallel before any of it is measured. Every strategy is deterministic for its seed and never
proposes a config twice; a time of None means the config failed (did not compile, was pruned,
crashed, gave a wrong answer): the strategy treats it as infinitely slow.

The package holds one strategy per module (exhaustive, random_sample, local, tpe, gp, auto),
their base (base.py, and model.py for the model-based ones), the space (space.py), the
Gaussian process's prior (prior.py) and numerics (gp_math.py), the strategies by name
(registry.py), the warm start (warm_start.py) and the loop (run.py). The names importers use
are re-exported here.
"""

from ...declare.search import SEARCH_STRATEGIES as STRATEGIES  # the names a project may configure
from ...declare.search import Budget  # what a search may spend: the kernel's SearchSpec.budget_for
from .auto import Portfolio
from .base import Strategy
from .exhaustive import Exhaustive
from .gp import GaussianProcessSearch
from .gp_math import cholesky, fit_log_params, log_improvement_per_sd, loo_errors
from .local import LocalSearch
from .model import ModelSearch
from .prior import CHANCE_Z, MAX_PRIORS, MAX_RELATED, MIN_AGREEMENT, MIN_SHARED, RelatedPriors, no_prior, nonnegative_fit
from .random_sample import RandomSample
from .registry import make_strategy, uses_prior
from .run import run_search
from .space import SearchSpace
from .tpe import ParzenSearch
from .warm_start import WarmStart

__all__ = [
    "CHANCE_Z",
    "MAX_PRIORS",
    "MAX_RELATED",
    "MIN_AGREEMENT",
    "MIN_SHARED",
    "STRATEGIES",
    "Budget",
    "Exhaustive",
    "GaussianProcessSearch",
    "LocalSearch",
    "ModelSearch",
    "ParzenSearch",
    "Portfolio",
    "RandomSample",
    "RelatedPriors",
    "SearchSpace",
    "Strategy",
    "WarmStart",
    "cholesky",
    "fit_log_params",
    "log_improvement_per_sd",
    "loo_errors",
    "make_strategy",
    "no_prior",
    "nonnegative_fit",
    "run_search",
    "uses_prior",
]
