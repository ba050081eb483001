"""The strategies by name: `make_strategy` and `uses_prior` for the names a project may configure
(`STRATEGIES`, declare/search.py's SEARCH_STRATEGIES)."""

from __future__ import annotations

from collections.abc import Sequence

from ...declare.search import SEARCH_STRATEGIES as STRATEGIES  # the names a project may configure
from .auto import Portfolio
from .base import Strategy
from .exhaustive import Exhaustive
from .gp import GaussianProcessSearch
from .local import LocalSearch
from .random_sample import RandomSample
from .space import SearchSpace
from .tpe import ParzenSearch

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
