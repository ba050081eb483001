"""Warm starts: what the lock tells a bucket's search before it measures anything (the related
entries' winners to measure first, their times as a prior), and the waves that let a run's own
results warm-start the rest of its buckets."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..lock import Bucket, EntryId, LockEntry, LockFile, LockFormatError, Status
from ..plan.planner import Point
from .search import MAX_RELATED, WarmStart, uses_prior

MAX_WARM = 8  # warm-start configs measured first, at most
WAVE_GROWTH = 3  # each wave of an instance's buckets is this many times the one before: 1, 3, 9, ...


def log_gap(a: Bucket, b: Mapping[str, float]) -> float:
    """How far apart two buckets of one key space lie: the sum over the dims of the log2 gaps
    (a size twice as big is one step away, whatever the size)."""
    return sum(abs(math.log2(max(v, 1)) - math.log2(max(b.get(k, v), 1))) for k, v in a.dims)


def transfer_waves(points: Sequence[Point]) -> list[list[Point]]:
    """A type instance's buckets in waves, so that a search that measures part of each space
    starts from this run's results as well as the lock's (each wave's warm starts are fixed
    when it starts: from the lock as the waves before it left it). The first wave is the
    bucket nearest the centre of the key space (log2 of each dim), each next one WAVE_GROWTH
    times bigger, of the buckets farthest from those before it, so that every region of the key
    space has a tuned neighbour early while the GPUs still get the buckets of a wave at once.
    On example_pkg's H200 lock replayed (benchmarks/search_lock.py), `auto` at 10% shipped a
    config within 1.02x of the optimum for 60% of the buckets alone and 74% in waves."""
    if len(points) <= 1:
        return [list(points)]
    where = {p.eid: p.bucket.as_dict() for p in points}
    dims = list(where[points[0].eid])
    centre = {d: 2 ** statistics.fmean(math.log2(max(where[p.eid][d], 1)) for p in points) for d in dims}
    rest = sorted(points, key=lambda p: p.eid)
    order = [min(rest, key=lambda p: log_gap(p.bucket, centre))]  # the first of equals: canonical
    rest.remove(order[0])
    while rest:  # the farthest from every bucket ordered so far next (maximin)
        far = max(rest, key=lambda p: min(log_gap(p.bucket, where[q.eid]) for q in order))
        order.append(far)
        rest.remove(far)
    waves, size = [], 1
    while order:
        waves.append(order[:size])
        order, size = order[size:], size * WAVE_GROWTH
    return waves


def related_entries(lock: LockFile, point: Point) -> list[LockEntry]:
    """The tuned entries of the point's instance, likeliest to resemble it first: its own
    previous result, the same bucket on other archs, then the nearest buckets (log2 distance)."""
    me = point.id
    mine = me.bucket.as_dict()

    def distance(eid: EntryId) -> tuple[bool, float, bool, str]:
        return (eid != me, log_gap(eid.bucket, mine), eid.arch != me.arch, str(eid))

    found = []
    for text, entry in lock.entries.items():
        try:
            eid = EntryId.parse(text)
        except LockFormatError:
            continue
        if entry.tuned and eid.kernel == me.kernel and eid.types == me.types:
            found.append((distance(eid), entry))
    return [entry for _, entry in sorted(found, key=lambda f: f[0])]


def warm_start(lock: LockFile, point: Point, configs: Sequence[Mapping[str, Any]], strategy: str = "auto") -> WarmStart:
    """What the lock tells this point's search: the winners of the related entries to measure
    first (`related_entries`' order, at most MAX_WARM; a lock tuned on one GPU warm-starts the
    next), and to a strategy that uses one (`auto`), their times as candidates for its prior
    (`speeds`): the strategy chooses among them by how well they agree with what it measures."""
    related = related_entries(lock, point)
    index = {config_key(c): i for i, c in enumerate(configs)}
    picks = (index.get(config_key(entry.config)) for entry in related)
    first = list(dict.fromkeys(i for i in picks if i is not None))[:MAX_WARM]
    prior = speeds(related, index, len(configs)) if uses_prior(strategy) else []
    return WarmStart(tuple(first), tuple(tuple(s) for s in prior))


def speeds(related: Sequence[LockEntry], index: Mapping[str, int], n_configs: int) -> list[list[float | None]]:
    """The measurements of the first related entries that measured more than one config (at
    most search.MAX_RELATED), as each config's speed there relative to its fastest (0: failed,
    rejected or pruned there; None: not measured there). How much they help is measured by
    benchmarks/search_quality.py (`warm`)."""
    out = []
    for entry in related:
        times: dict[int, float] = {}  # config index -> median ms; inf where it did not run
        for m in entry.measurements:
            i = index.get(config_key(m.config))
            if i is None or m.status == Status.SKIPPED:
                continue
            ms = m.median_ms if m.timed and m.median_ms is not None and 0 < m.median_ms < math.inf else math.inf
            times[i] = min(times.get(i, math.inf), ms)
        fastest = min(times.values(), default=math.inf)
        if len(times) < 2 or math.isinf(fastest):
            continue
        config_speeds: list[float | None] = [None] * n_configs
        for i, t in times.items():
            config_speeds[i] = fastest / t
        out.append(config_speeds)
        if len(out) == MAX_RELATED:
            break
    return out


def config_key(config: Mapping[str, Any]) -> str:
    """A config's identity across lock entries and spaces: its JSON with sorted keys."""
    return json.dumps(config, sort_keys=True)
