"""The report's charts as data: winner vs default per kernel, the chosen variants' resource
usage, and every timed config in every bucket of each kernel, type instance and arch.

A `Chart` is built once from the rows of a `Source` (model.py) and then drawn twice, as SVG for
the HTML and with matplotlib for the PNGs (report_figures.py), so both outputs always show the
same thing.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..lock import Measurement, Status
from .fmt import fmt_bucket, fmt_config, fmt_ms
from .model import Row, Source, finite_ms

WINNER = "#2f9e44"  # the chosen config
DEFAULT = "#f08c00"  # the kernel's default config
OTHER = "#74a9cf"  # every other timed config
ELIMINATED = "#c6d9ea"  # timed with few samples, stopped early as clearly slower
SLOWER = "#e03131"  # a winner slower than the default (should not happen; worth seeing)
NEUTRAL = "#868e96"  # the default is the winner
REGISTERS = "#5c7cfa"
SHARED = "#be4bdb"


@dataclass
class Bar:
    label: str
    value: float | None  # None: nothing to draw in this panel (the text says why: 'rejected', '-')
    color: str
    text: str  # printed at the end of the bar
    tip: str  # hover text (an SVG <title>)


@dataclass
class Panel:
    axis: str
    bars: list[Bar]
    ref: float | None = None  # a dashed reference line, e.g. speedup 1.0
    title: str = ""  # above the panel: which bucket, in a chart of one panel per bucket


@dataclass
class Chart:
    slug: str  # file name of its PNG, anchor in the HTML
    section: str  # 'speedup', 'resources' or a kernel's name
    title: str
    subtitle: str
    panels: list[Panel]  # side by side (wrapping into rows), sharing the row labels of the first
    legend: list[tuple[str, str]] = field(default_factory=list)  # (label, colour)
    notes: list[str] = field(default_factory=list)  # under the chart: configs not timed, and why


_cfg, _ms = fmt_config, fmt_ms


def entry_text(e: Row, with_kernel: bool = False) -> str:
    """'T=float32 sm_90 n=1024': one entry in a chart's or the page's text."""
    parts = ([e.kernel] if with_kernel else []) + ([e.types] if e.types != "-" else []) + [e.arch, fmt_bucket(e.bucket)]
    return " ".join(parts)


def _slug(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "chart"
    slug, n = base, 2
    while slug in used:
        slug, n = f"{base}-{n}", n + 1
    used.add(slug)
    return slug


def listing(items: Sequence[str], limit: int = 12) -> str:
    """The first `limit` items, and how many more: a note stays short in a big report."""
    shown = ", ".join(items[:limit])
    return shown + (f", and {len(items) - limit} more" if len(items) > limit else "")


# --------------------------------------------------------------------------------------------
# Charts as data.


def speedup_chart(kernel: str, rows: Sequence[Row], used: set[str]) -> Chart | None:
    timed = [(e, s) for e in rows if (s := e.speedup) is not None and math.isfinite(s)]
    if not timed:
        return None
    bars = []
    for e, s in timed:
        color = WINNER if s > 1.005 else SLOWER if s < 0.995 else NEUTRAL
        tip = f"{entry_text(e)}: winner {_cfg(e.config)}"
        if e.time_ms and e.default_ms:
            tip += f", {_ms(e.time_ms)} ms vs default {_ms(e.default_ms)} ms"
        bars.append(Bar(entry_text(e), s, color, f"{s:.2f}x", tip))
    speedups = [s for _, s in timed]
    chart = Chart(
        slug=_slug(f"speedup {kernel}", used),
        section="speedup",
        title=f"{kernel}: winner vs default",
        subtitle=f"default time / winner time per bucket; median {statistics.median(speedups):.2f}x, best {max(speedups):.2f}x",
        panels=[Panel("speedup over the default config (x)", bars, ref=1.0)],
        legend=[("faster than the default", WINNER), ("the default is the winner", NEUTRAL), ("slower than the default", SLOWER)],
    )
    missing = [entry_text(e) for e in rows if e.speedup is None or not math.isfinite(e.speedup)]
    if missing:
        chart.notes.append(
            f"no timing for {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} (untuned or no default time): {listing(missing)}"
        )
    return chart


def resources_chart(all_rows: Sequence[Row], used: set[str]) -> Chart | None:
    seen: dict[tuple[str, str, str, str], Row] = {}
    for e in all_rows:
        if e.resources:
            seen.setdefault((e.kernel, e.types, e.arch, e.variant or _cfg(e.config)), e)
    if not seen:
        return None
    rows = sorted(seen.values(), key=lambda e: (e.kernel, *e.sort_key()))
    regs, shared, notes = [], [], []
    for e in rows:
        r = e.resources or {}
        label = " ".join([e.kernel] + ([e.types] if e.types != "-" else []) + [e.arch, _cfg(e.config)])
        n_regs, n_shared = int(r.get("registers", 0)), int(r.get("shared_bytes", 0))
        regs.append(Bar(label, n_regs, REGISTERS, str(n_regs), f"{label}: {n_regs} registers per thread"))
        shared.append(Bar(label, n_shared / 1024, SHARED, f"{n_shared / 1024:.1f}", f"{label}: {n_shared} bytes of static shared memory"))
        if r.get("spill_stores") or r.get("spill_loads"):
            notes.append(f"{label} spills registers ({r.get('spill_stores', 0)} B stores, {r.get('spill_loads', 0)} B loads)")
    return Chart(
        slug=_slug("resources", used),
        section="resources",
        title="Resource usage of the chosen variants",
        subtitle="as reported by ptxas for each cubin in the wheel; one row per distinct chosen variant and arch",
        panels=[Panel("registers per thread", regs), Panel("static shared memory (KiB)", shared)],
        notes=notes,
    )


MAX_CONFIG_ROWS = 24  # configs drawn per chart; the rest (slower than these in every bucket) are named in a note


def _by_config(e: Row) -> dict[str, Measurement]:
    """The measurement of each config of an entry, keyed by its written form; a fully timed run
    wins over an eliminated or untimed one of the same config."""
    out: dict[str, Measurement] = {}

    def rank(m: Measurement) -> int:
        return 2 if m.timed and m.status == Status.OK else 1 if m.timed else 0

    for m in e.measurements:
        key = _cfg(m.config)
        if key not in out or rank(m) > rank(out[key]):
            out[key] = m
    return out


def instance_text(e: Row) -> str:
    """'saxpy T=float32 sm_90': what one times chart covers."""
    return " ".join([e.kernel] + ([e.types] if e.types != "-" else []) + [e.arch])


def _drawn_configs(per_bucket: Sequence[tuple[Row, dict[str, Measurement]]], keep: set[str]) -> list[str]:
    """The configs a chart draws: every timed one, or when there are more than MAX_CONFIG_ROWS,
    those among the k fastest of some bucket (the largest k that fits), plus `keep` (the
    default and the winners)."""
    rank: dict[str, int] = {}
    for _, ms in per_bucket:
        timed = sorted((t, key) for key, m in ms.items() if m.timed and (t := finite_ms(m.median_ms)) is not None)
        for i, (_, key) in enumerate(timed):
            rank[key] = min(rank.get(key, i), i)
    if len(rank) <= MAX_CONFIG_ROWS:
        return list(rank)
    for k in range(MAX_CONFIG_ROWS, 0, -1):
        chosen = [key for key, r in rank.items() if r < k or key in keep]
        if len(chosen) <= MAX_CONFIG_ROWS:
            return chosen
    return [key for key in rank if key in keep]


def times_chart(rows: Sequence[Row], used: set[str]) -> Chart | None:
    """Every measured config's time in every bucket of one kernel, type instance and arch: a
    panel per bucket (small multiples, each on its own scale: a bigger bucket takes longer), a
    row per config. One chart per instance, not per bucket, keeps a report of a lock file with
    tens of thousands of entries a few thousand charts."""
    per_bucket = [(e, _by_config(e)) for e in rows]
    timed_buckets = [(e, ms) for e, ms in per_bucket if any(m.timed for m in ms.values())]
    if not timed_buckets:
        return None
    first = rows[0]
    default = next((_cfg(e.default_config) for e in rows if e.default_config is not None), None)
    winners = {_cfg(e.config) for e, _ in timed_buckets}
    drawn = _drawn_configs(timed_buckets, winners | ({default} if default else set()))
    order: dict[str, tuple[int, int]] = {}
    for n, (_, ms) in enumerate(timed_buckets):
        for key, measured in ms.items():
            order.setdefault(key, (measured.index if measured.index is not None else 1 << 30, n))
    drawn.sort(key=lambda key: (order[key], key))  # the space's canonical order: rows line up across charts
    labels = {key: key + (" (default)" if key == default else "") for key in drawn}
    panels = []
    eliminated = False
    for e, ms in timed_buckets:
        where, winner = fmt_bucket(e.bucket), _cfg(e.config)
        bars = []
        for key in drawn:
            m = ms.get(key)
            ms_ = finite_ms(m.median_ms) if m is not None and m.timed else None
            if m is None or ms_ is None:
                status = (m.status or "unknown") if m is not None else "-"
                bars.append(Bar(labels[key], None, OTHER, status, f"{where}: {key}: {status if m is not None else 'not measured'}"))
                continue
            is_winner, is_default = key == winner, key == default
            eliminated |= m.status == Status.ELIMINATED
            color = WINNER if is_winner else DEFAULT if is_default else ELIMINATED if m.status == Status.ELIMINATED else OTHER
            role = " (winner, default)" if is_winner and is_default else " (winner)" if is_winner else " (default)" if is_default else ""
            spread = finite_ms(m.spread_ms)
            tip = f"{key}{role}: median {_ms(ms_)} ms" + (f", spread {_ms(spread)} ms" if spread is not None else "")
            tip += f", {'?' if m.samples is None else m.samples} samples" + (", eliminated early" if m.status == Status.ELIMINATED else "")
            bars.append(Bar(labels[key], ms_, color, _ms(ms_), tip))
        speed = f": {e.speedup:.2f}x" if e.speedup is not None else ""
        panels.append(Panel("median time (ms)", bars, title=f"{where}{speed}"))
    notes = _untimed_notes(timed_buckets)
    hidden = sorted({key for _, ms in timed_buckets for key, m in ms.items() if m.timed} - set(drawn))
    if hidden:
        notes.append(
            f"{len(hidden)} more timed config(s) not drawn, slower than the {len(drawn)} drawn in every bucket: {listing(hidden, 8)}"
        )
    timed_rows = {id(e) for e, _ in timed_buckets}
    untimed = [fmt_bucket(e.bucket) + f" ({'tuned' if e.tuned else 'default'} {_cfg(e.config)})" for e in rows if id(e) not in timed_rows]
    if untimed:
        notes.append(f"no measurements for {listing(untimed, 8)}")
    legend = [("winner", WINNER), ("default", DEFAULT), ("other configs", OTHER)] + (
        [("eliminated early", ELIMINATED)] if eliminated else []
    )
    title = instance_text(first)
    return Chart(
        slug=_slug(f"times {title}", used),
        section=first.kernel,
        title=title,
        subtitle=f"median time of each measured config, a panel per bucket ({len(panels)}) on its own scale, titled with the winner's speedup over the default",
        panels=panels,
        legend=legend,
        notes=notes,
    )


def _untimed_notes(per_bucket: Sequence[tuple[Row, dict[str, Measurement]]]) -> list[str]:
    """Configs that were not timed, by status: 'rejected (3): cfg (why)', naming the buckets
    when it was not all of them."""
    where: dict[tuple[str, str, str], list[str]] = {}
    for e, ms in per_bucket:
        for key, m in ms.items():
            if not m.timed:
                reason = f" ({m.reason})" if m.reason else ""
                where.setdefault((m.status or "unknown", key, reason), []).append(fmt_bucket(e.bucket))
    by_status: dict[str, list[str]] = {}
    for (status, key, reason), buckets in where.items():
        scope = "" if len(buckets) == len(per_bucket) else f" in {', '.join(buckets)}"
        by_status.setdefault(status, []).append(key + reason + scope)
    return [f"{status} ({len(items)}): {listing(items, 8)}" for status, items in sorted(by_status.items())]


def build_charts(src: Source) -> list[Chart]:
    """Winner-vs-default per kernel, resource usage, then per kernel, type instance and arch
    every variant's time in every bucket."""
    used: set[str] = set()
    groups = src.by_kernel()
    charts = [c for kernel, rows in groups if (c := speedup_chart(kernel, rows, used))]
    if (c := resources_chart(list(src.rows.values()), used)) is not None:
        charts.append(c)
    for _, rows in groups:  # sorted by types, arch, bucket: each instance's rows are adjacent
        for _, instance in itertools.groupby(rows, key=lambda e: (e.types, e.arch)):
            if (c := times_chart(list(instance), used)) is not None:
                charts.append(c)
    return charts
