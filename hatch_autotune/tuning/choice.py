"""What ships: the config that is fastest, not the one that measured fastest once.

A search times each config once, with few repetitions, while it looks. Under noise its leader
may be a config that was lucky, and a noisy config may look as good as any. So before a
bucket's winner is written, the configs that the search's timings cannot tell apart from the
leader (`contenders`: their medians' confidence intervals overlap the leader's) are timed
again in a runoff (`run_runoff`). The runoff is interleaved round by round, so that drift
(clocks, temperature, a neighbour on the machine) falls on every contender alike. The winner
is chosen from the runoff's timings alone (`choose_winner`): the fastest median, or the
canonical config among near-ties. The lock records the contenders and the margin
(`lock.Runoff`). These are plain functions; the tuner and the replay benchmark run the same
ones (benchmarks/search_quality.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..lock import Contender, Measurement, Runoff, Status, recorded
from .bench import median, spread

TIE_FLOOR = 0.005  # timings closer than 0.5% are a tie whatever the measured spread
MAX_CONTENDERS = 6  # configs a runoff times again, at most: the leader and the closest others
# A median's 95% confidence interval: median +- 1.58 IQR / sqrt(n), the notch of a box plot
# (McGill, Tukey and Larsen 1978); the spread is half the IQR.
NOTCH = 1.58


def measured(index: int, config: Mapping[str, Any], status: Status, samples: Sequence[float] = (), reason: str = "") -> Measurement:
    """The measurement of a config from its timings (ms; none for a config that was not timed),
    its median and spread exact: the lock rounds them (Measurement.as_recorded)."""
    if not samples:
        return Measurement(index, config, status, 0, reason=reason)
    return Measurement(index, config, status, len(samples), median(samples), spread(samples), reason)


def _runs(measurements: Sequence[Measurement]) -> list[Measurement]:
    return [m for m in measurements if m.status == Status.OK and m.samples and m.median_ms is not None]


def _leader(ok: Sequence[Measurement]) -> Measurement:
    """The fastest median among timed measurements; ties: the lowest config index."""
    return min(ok, key=lambda m: (m.median_ms, m.index if m.index is not None else math.inf))


def choose_winner(measurements: Sequence[Measurement], default_index: int, by_spread: bool = True) -> Measurement | None:
    """The fastest by median; among near-ties, the canonical one: the default if it is tied,
    else the lowest config index. None if none ran. A near-tie is within 0.5% of the fastest
    or, `by_spread`, within the fastest's own spread: the leader's noise says how far apart
    two configs can look and be the same, a noisy candidate's own noise does not make it close
    (the runoff decides with `by_spread` off: its medians are of many interleaved timings)."""
    ok = _runs(measurements)
    if not ok:
        return None
    best = _leader(ok)
    band = max(TIE_FLOOR * best.median_ms, (best.spread_ms or 0.0) if by_spread else 0.0)  # type: ignore[operator]
    tied = [m for m in ok if m.median_ms - best.median_ms <= band]  # type: ignore[operator]
    for m in tied:
        if m.index == default_index:
            return m
    return min(tied, key=lambda m: m.index if m.index is not None else math.inf)


def interval(m: Measurement) -> tuple[float, float]:
    """The 95% confidence interval of a measurement's median, at least 0.5% wide."""
    assert m.median_ms is not None and m.samples
    half = max(NOTCH * 2 * (m.spread_ms or 0.0) / math.sqrt(m.samples), TIE_FLOOR / 2 * m.median_ms)
    return m.median_ms - half, m.median_ms + half


def contenders(measurements: Sequence[Measurement], limit: int = MAX_CONTENDERS) -> list[Measurement]:
    """The leader (the fastest median) and the configs whose medians' intervals overlap its
    interval, at most `limit` in all: those that could be faster first (lowest interval
    bound), so a noisy config that might be the fastest is not crowded out by steady ones
    that cannot be."""
    ok = _runs(measurements)
    if not ok:
        return []
    leader = _leader(ok)
    top = interval(leader)[1]
    close = sorted((m for m in ok if m is not leader and interval(m)[0] <= top), key=lambda m: (interval(m)[0], m.index or 0))
    return [leader, *close[: max(0, limit - 1)]]


Retime = Callable[[int], "Sequence[float] | str"]  # a config's timings for one round, or why it failed


@dataclass(frozen=True)
class RunoffResult:
    """The winner, every contender's measurement over the runoff (a failed one as failed),
    and the lock's record of it."""

    winner: Measurement | None
    measurements: tuple[Measurement, ...]
    record: Runoff


def run_runoff(field: Sequence[Measurement], retime: Retime, rounds: int, default_index: int) -> RunoffResult:
    """Time the contenders `field` again: `rounds` rounds, each timing every contender still
    in (a round's order rotated by one each time, so no config is always first after
    another), their timings pooled; a contender that fails drops out, recorded as failed. The
    winner: the fastest median over the runoff, the canonical config among those within 0.5%
    of it."""
    samples: dict[int, list[float]] = {m.index: [] for m in field if m.index is not None}
    failed: dict[int, str] = {}
    round_medians: list[dict[int, float]] = []
    order = list(samples)
    for r in range(rounds):
        this_round: dict[int, float] = {}
        for i in order[r % len(order) :] + order[: r % len(order)] if order else []:
            if i in failed:
                continue
            got = retime(i)
            if isinstance(got, str):
                failed[i] = got
                continue
            samples[i].extend(got)
            this_round[i] = median(got)
        round_medians.append(this_round)
    by_index = {m.index: m for m in field}
    pooled = []
    for i, times in samples.items():
        was = by_index[i]
        if i in failed:
            pooled.append(
                replace(was, status=Status.FAILED, samples=0, median_ms=None, spread_ms=None, reason=f"failed in the runoff: {failed[i]}")
            )
        elif times:
            pooled.append(replace(was, samples=len(times), median_ms=median(times), spread_ms=spread(times)))
    winner = choose_winner(pooled, default_index, by_spread=False)
    ran = sorted(_runs(pooled), key=lambda m: (m.median_ms, m.index))
    others = [m for m in ran if winner is not None and m.index != winner.index]
    margin = others[0].median_ms / winner.median_ms - 1 if winner is not None and others else None  # type: ignore[operator]
    won = sum(1 for rm in round_medians if winner is not None and rm and min(rm, key=lambda i: (rm[i], i)) == winner.index)
    after = {m.index: m.as_recorded() for m in pooled}  # the record as the lock keeps it: to 1 ns
    record = Runoff(
        rounds=rounds,
        contenders=tuple(
            Contender(m.index, m.as_recorded().median_ms, after[m.index].median_ms, after[m.index].spread_ms, after[m.index].samples)
            for m in sorted(field, key=lambda m: (after[m.index].median_ms is None, after[m.index].median_ms or 0.0, m.index))
        ),
        margin=recorded(margin),
        rounds_won=won if winner is not None else None,
    )
    return RunoffResult(winner, tuple(pooled), record)
