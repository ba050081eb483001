"""`run_search`: the loop that asks a strategy, measures, tells and counts the budget, shared by
the tuner and the replay benchmark."""

from __future__ import annotations

import time
from collections.abc import Callable

from ...declare.search import Budget  # what a search may spend: the kernel's SearchSpec.budget_for
from .base import Strategy


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
