"""The tuning report: a self-contained HTML page (inline SVG, no script, no external resource,
so it can be mailed, attached to a CI run or opened offline) and the same charts as PNGs.

Charts are first built as data (`Chart`) from the rows of a `Source` (model.py), then drawn as
SVG for the HTML or with matplotlib for the PNGs, so both outputs always show the same thing.
"""

from __future__ import annotations

import datetime
import html
import itertools
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .. import __version__
from ..lock import Measurement
from .fmt import fmt_bucket, fmt_config, fmt_ms
from .model import Row, Source, finite_ms, provenance_lines

WINNER = "#2f9e44"  # the chosen config
DEFAULT = "#f08c00"  # the kernel's default config
OTHER = "#74a9cf"  # every other timed config
ELIMINATED = "#c6d9ea"  # timed with few samples, stopped early as clearly slower
SLOWER = "#e03131"  # a winner slower than the default (should not happen; worth seeing)
NEUTRAL = "#868e96"  # the default is the winner
REGISTERS = "#5c7cfa"
SHARED = "#be4bdb"

Progress = Callable[[str], None]


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


def _where(e: Row, with_kernel: bool = False) -> str:
    parts = ([e.kernel] if with_kernel else []) + ([e.types] if e.types != "-" else []) + [e.arch, fmt_bucket(e.bucket)]
    return " ".join(parts)


def _slug(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "chart"
    slug, n = base, 2
    while slug in used:
        slug, n = f"{base}-{n}", n + 1
    used.add(slug)
    return slug


def _listing(items: Sequence[str], limit: int = 12) -> str:
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
        tip = f"{_where(e)}: winner {_cfg(e.config)}"
        if e.time_ms and e.default_ms:
            tip += f", {_ms(e.time_ms)} ms vs default {_ms(e.default_ms)} ms"
        bars.append(Bar(_where(e), s, color, f"{s:.2f}x", tip))
    speedups = [s for _, s in timed]
    chart = Chart(
        slug=_slug(f"speedup {kernel}", used),
        section="speedup",
        title=f"{kernel}: winner vs default",
        subtitle=f"default time / winner time per bucket; median {statistics.median(speedups):.2f}x, best {max(speedups):.2f}x",
        panels=[Panel("speedup over the default config (x)", bars, ref=1.0)],
        legend=[("faster than the default", WINNER), ("the default is the winner", NEUTRAL), ("slower than the default", SLOWER)],
    )
    missing = [_where(e) for e in rows if e.speedup is None or not math.isfinite(e.speedup)]
    if missing:
        chart.notes.append(
            f"no timing for {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} (untuned or no default time): {_listing(missing)}"
        )
    return chart


def resources_chart(all_rows: Sequence[Row], used: set[str]) -> Chart | None:
    seen: dict[tuple, Row] = {}
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
    rank = lambda m: 2 if m.timed and m.status == "ok" else 1 if m.timed else 0  # noqa: E731
    for m in e.measurements:
        key = _cfg(m.config)
        if key not in out or rank(m) > rank(out[key]):
            out[key] = m
    return out


def _instance(e: Row) -> str:
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
    order: dict[str, tuple] = {}
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
            eliminated |= m.status == "eliminated"
            color = WINNER if is_winner else DEFAULT if is_default else ELIMINATED if m.status == "eliminated" else OTHER
            role = " (winner, default)" if is_winner and is_default else " (winner)" if is_winner else " (default)" if is_default else ""
            spread = finite_ms(m.spread_ms)
            tip = f"{key}{role}: median {_ms(ms_)} ms" + (f", spread {_ms(spread)} ms" if spread is not None else "")
            tip += f", {'?' if m.samples is None else m.samples} samples" + (", eliminated early" if m.status == "eliminated" else "")
            bars.append(Bar(labels[key], ms_, color, _ms(ms_), tip))
        speed = f": {e.speedup:.2f}x" if e.speedup is not None else ""
        panels.append(Panel("median time (ms)", bars, title=f"{where}{speed}"))
    notes = _untimed_notes(timed_buckets)
    hidden = sorted({key for _, ms in timed_buckets for key, m in ms.items() if m.timed} - set(drawn))
    if hidden:
        notes.append(
            f"{len(hidden)} more timed config(s) not drawn, slower than the {len(drawn)} drawn in every bucket: {_listing(hidden, 8)}"
        )
    timed_rows = {id(e) for e, _ in timed_buckets}
    untimed = [fmt_bucket(e.bucket) + f" ({'tuned' if e.tuned else 'default'} {_cfg(e.config)})" for e in rows if id(e) not in timed_rows]
    if untimed:
        notes.append(f"no measurements for {_listing(untimed, 8)}")
    legend = [("winner", WINNER), ("default", DEFAULT), ("other configs", OTHER)] + (
        [("eliminated early", ELIMINATED)] if eliminated else []
    )
    title = _instance(first)
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
    return [f"{status} ({len(items)}): {_listing(items, 8)}" for status, items in sorted(by_status.items())]


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


# --------------------------------------------------------------------------------------------
# SVG.

_WIDTH = 1040
_ROW, _BAR = 18, 12
_CHAR = 6.7  # width of a label character at 11px monospace
_VALUE_W = 60  # room for the value printed after a bar
_GAP = 28  # between panels
_MIN_PANEL = 200  # narrower panels wrap into another row


def _ticks(vmax: float, n: int = 5) -> tuple[list[float], float]:
    """About n round ticks from 0 past vmax, and the last one (the axis' end)."""
    vmax = vmax if 0 < vmax < 1e300 else 1.0  # no values, or none a chart can scale to
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(n + 1)], n * step


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "\u2026"


@dataclass(frozen=True)
class _Layout:
    """Where a chart's parts go; one owner, so the SVG and the PNG wrap panels alike."""

    label_w: int  # the row labels' column, repeated left of every row of panels
    per_row: int  # panels side by side
    grid_rows: int  # rows of panels

    @classmethod
    def of(cls, chart: Chart) -> "_Layout":
        longest = max((len(b.label) for b in chart.panels[0].bars), default=0)
        label_w = int(min(max(longest * _CHAR + 24, 120), 440))
        n = len(chart.panels)
        fit = max(1, int((_WIDTH - label_w - 12 + _GAP) // (_MIN_PANEL + _GAP)))
        grid_rows = math.ceil(n / fit)
        return cls(label_w, math.ceil(n / grid_rows), grid_rows)


def svg(chart: Chart) -> str:
    rows = len(chart.panels[0].bars)
    lay = _Layout.of(chart)
    label_w, label_chars = lay.label_w, int((lay.label_w - 16) / _CHAR)
    panel_w = (_WIDTH - label_w - 12 - _GAP * (lay.per_row - 1)) / lay.per_row
    head = 18 if any(p.title for p in chart.panels) else 0  # panel titles
    top = 50 + (20 if chart.legend else 0)
    plot_h = rows * _ROW
    block_h = head + plot_h + 44  # one row of panels: titles, bars, ticks, axis title
    height = top + block_h * lay.grid_rows
    out = [
        f'<svg class="chart" id="{_esc(chart.slug)}" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
        f'role="img" aria-label="{_esc(chart.title)}" font-family="system-ui, sans-serif" font-size="12">',
        f"<title>{_esc(chart.title)}</title>",
        f'<rect width="{_WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="20" font-size="15" font-weight="600" fill="#212529">{_esc(chart.title)}</text>',
        f'<text x="8" y="38" fill="#495057">{_esc(_clip(chart.subtitle, 150))}</text>',
    ]
    x = 8.0
    for label, color in chart.legend:
        out.append(f'<rect x="{x}" y="50" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{x + 16}" y="60" fill="#495057">{_esc(label)}</text>')
        x += 16 + len(label) * 6.5 + 18
    labels = [
        (f"<title>{_esc(b.label)}</title>" if len(b.label) > label_chars else "")
        + _esc(_clip(b.label, label_chars))  # full text on hover when cut
        for b in chart.panels[0].bars
    ]
    for g in range(lay.grid_rows):
        y_plot = top + g * block_h + head
        out.append('<g text-anchor="end" font-family="ui-monospace, Menlo, Consolas, monospace" font-size="11" fill="#212529">')
        out += [f'<text x="{label_w - 8}" y="{y_plot + i * _ROW + _ROW / 2 + 4:.1f}">{label}</text>' for i, label in enumerate(labels)]
        out.append("</g>")
        for p, panel in enumerate(chart.panels[g * lay.per_row : (g + 1) * lay.per_row]):
            out += _svg_panel(panel, label_w + p * (panel_w + _GAP), y_plot, panel_w, plot_h)
    out.append("</svg>")
    return "\n".join(out)


def _svg_panel(panel: Panel, x0: float, top: float, panel_w: float, plot_h: int) -> list[str]:
    """One panel's grid, bars and values; shared attributes sit on groups (a report of a big
    lock file draws hundreds of thousands of these)."""
    out = []
    if panel.title:
        out.append(
            f'<text x="{x0:.1f}" y="{top - 8}" font-size="11" font-weight="600" fill="#343a40">{_esc(_clip(panel.title, int(panel_w / 7)))}</text>'
        )
    values = [b.value for b in panel.bars if b.value is not None] + ([panel.ref] if panel.ref is not None else [])
    ticks, vmax = _ticks(max(values, default=0.0), 5 if panel_w >= 300 else 3)
    scale = (panel_w - _VALUE_W) / vmax
    xs = [(t, x0 + t * scale) for t in ticks]
    out.append(
        '<g stroke="#e9ecef">' + "".join(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + plot_h}"/>' for _, x in xs) + "</g>"
    )
    out.append(
        '<g text-anchor="middle" font-size="10" fill="#868e96">'
        + "".join(f'<text x="{x:.1f}" y="{top + plot_h + 14}">{t:g}</text>' for t, x in xs)
        + "</g>"
    )
    out.append(f'<line x1="{x0:.1f}" y1="{top - 4}" x2="{x0:.1f}" y2="{top + plot_h}" stroke="#adb5bd"/>')
    bars, texts = [], []
    for i, b in enumerate(panel.bars):
        y = top + i * _ROW + (_ROW - _BAR) / 2
        if b.value is None:  # not timed here: say why where the bar would be
            texts.append(
                f'<text x="{x0 + 4:.1f}" y="{y + _BAR - 2:.1f}" font-style="italic" fill="#868e96"><title>{_esc(b.tip)}</title>{_esc(b.text)}</text>'
            )
            continue
        w = max(b.value * scale, 1.0)
        bars.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_BAR}" fill="{b.color}"><title>{_esc(b.tip)}</title></rect>')
        texts.append(f'<text x="{x0 + w + 4:.1f}" y="{y + _BAR - 2:.1f}">{_esc(b.text)}</text>')
    out += bars
    out += ['<g font-size="10" fill="#343a40">', *texts, "</g>"]
    if panel.ref is not None:
        rx = x0 + panel.ref * scale
        out.append(f'<line x1="{rx:.1f}" y1="{top - 6}" x2="{rx:.1f}" y2="{top + plot_h + 2}" stroke="#343a40" stroke-dasharray="4 3"/>')
    out.append(
        f'<text x="{x0 + (panel_w - _VALUE_W) / 2:.1f}" y="{top + plot_h + 32}" text-anchor="middle" fill="#495057">{_esc(panel.axis)}</text>'
    )
    return out


# --------------------------------------------------------------------------------------------
# HTML.

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212529; margin: 0 auto;
       max-width: 1080px; padding: 16px 24px 48px; background: #f8f9fa; }
h1 { font-size: 24px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid #dee2e6; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
.meta, .note, .missing { color: #495057; }
.missing { background: #fff3bf; border-left: 4px solid #fab005; padding: 8px 12px; }
nav a { margin-right: 12px; }
table { border-collapse: collapse; background: #fff; margin: 8px 0; }
th, td { border: 1px solid #dee2e6; padding: 4px 10px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { background: #fff; border: 1px solid #dee2e6; margin: 12px 0; padding: 6px; overflow-x: auto; }
figure ul { margin: 4px 0 2px 0; padding-left: 22px; color: #495057; font-size: 13px; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
"""


def _figure(chart: Chart) -> str:
    notes = "".join(f"<li>{_esc(n)}</li>" for n in chart.notes)
    return f'<figure id="fig-{_esc(chart.slug)}">\n{svg(chart)}\n' + (f"<ul>{notes}</ul>" if notes else "") + "</figure>"


def _summary(src: Source) -> str:
    table_rows = []
    for kernel, rows in src.by_kernel():
        speedups = [r.speedup for r in rows if r.speedup is not None]
        tuned = sum(r.tuned for r in rows)
        med = f"{statistics.median(speedups):.2f}x" if speedups else "-"
        best = f"{max(speedups):.2f}x" if speedups else "-"
        table_rows.append(
            f'<tr><td><a href="#kernel-{_esc(kernel)}">{_esc(kernel)}</a></td><td class="num">{len(rows)}</td>'
            f'<td class="num">{tuned}</td><td class="num">{len(rows) - tuned}</td><td class="num">{med}</td><td class="num">{best}</td></tr>'
        )
    lines = provenance_lines(list(src.rows.values())) + src.notes
    return (
        "<table><tr><th>kernel</th><th>entries</th><th>tuned</th><th>default</th><th>median speedup</th><th>best speedup</th></tr>"
        + "".join(table_rows)
        + "</table>"
        + "".join(f'<p class="note">{_esc(line)}</p>' for line in lines)
    )


def render_html(src: Source, charts: Sequence[Chart], *, title: str = "hatch-autotune report", progress: Progress = lambda s: None) -> str:
    """The whole report as one HTML string: no script, no link, no external resource."""
    figures = {}
    for c in charts:
        figures[c.slug] = _figure(c)
        progress(c.title)
    by_section: dict[str, list[Chart]] = {}
    for c in charts:
        by_section.setdefault(c.section, []).append(c)
    kernels = [k for k, _ in src.by_kernel()]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">{_esc(src.label)} ({_esc(src.kind)}) &middot; {len(src.rows)} entries, {len(charts)} charts '
        f"&middot; hatch-autotune {__version__} &middot; {now}</p>",
        '<nav><a href="#summary">summary</a><a href="#speedup">winner vs default</a><a href="#resources">resources</a>'
        + "".join(f'<a href="#kernel-{_esc(k)}">{_esc(k)}</a>' for k in kernels)
        + "</nav>",
        '<h2 id="summary">Summary</h2>',
        _summary(src),
        '<h2 id="speedup">Winner vs default</h2>',
    ]
    speedups = by_section.get("speedup", [])
    parts += [figures[c.slug] for c in speedups] or [
        '<p class="missing">No timings: nothing was tuned, or the input has no measurements (a wheel alone has none; add the lock file).</p>'
    ]
    parts.append('<h2 id="resources">Resource usage</h2>')
    resources = by_section.get("resources", [])
    parts += [figures[c.slug] for c in resources] or [
        '<p class="missing">Not shown: lock files and projects carry no resource usage (registers, shared memory); '
        "pass the wheel (or its table.json) too, e.g. <code>hatch-autotune report autotune.lock.json dist/pkg.whl -o report.html</code>.</p>"
    ]
    for kernel, rows in src.by_kernel():
        parts.append(f'<h2 id="kernel-{_esc(kernel)}">{_esc(kernel)}: time of every variant</h2>')
        own = by_section.get(kernel, [])
        parts += [figures[c.slug] for c in own]
        charted = {c.title for c in own}  # instances with a chart; its notes name its untimed buckets
        untimed = [_where(e) + f" ({'tuned' if e.tuned else 'default'} {_cfg(e.config)})" for e in rows if _instance(e) not in charted]
        if untimed:
            parts.append(
                f'<p class="note">No measurements for {len(untimed)} entr{"y" if len(untimed) == 1 else "ies"}: {_esc(_listing(untimed, 20))}</p>'
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# PNG.


def write_pngs(charts: Sequence[Chart], out_dir: Path, *, progress: Progress = lambda s: None) -> list[Path]:
    """Every chart as `<slug>.png`, drawn with matplotlib's Agg canvas (no display, no pyplot state)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    written = []
    for chart in charts:
        rows = len(chart.panels[0].bars)
        lay = _Layout.of(chart)
        fig = Figure(figsize=(11, 1.2 + lay.grid_rows * (0.6 + 0.24 * rows)), dpi=100, layout="constrained")
        axes = fig.subplots(lay.grid_rows, lay.per_row, sharey=True, squeeze=False).ravel()
        for ax in axes[len(chart.panels) :]:
            ax.set_visible(False)
        ys = list(range(rows))
        for ax, panel in zip(axes, chart.panels):
            drawn = [(y, b) for y, b in zip(ys, panel.bars) if b.value is not None]
            ax.barh([y for y, _ in drawn], [b.value for _, b in drawn], color=[b.color for _, b in drawn], height=0.7)
            ax.set_yticks(ys, [b.label for b in chart.panels[0].bars], fontsize=8, family="monospace")
            for y, b in zip(ys, panel.bars):
                ax.text(b.value or 0.0, y, " " + b.text, va="center", fontsize=7, color="#343a40" if b.value is not None else "#868e96")
            if panel.ref is not None:
                ax.axvline(panel.ref, color="#343a40", linewidth=1, linestyle="--")
            if panel.title:
                ax.set_title(panel.title, fontsize=8, loc="left")
            ax.set_xlabel(panel.axis, fontsize=9)
            top = max([b.value for _, b in drawn if b.value is not None] + ([panel.ref] if panel.ref is not None else []), default=0.0)
            ax.set_xlim(0, top * 1.12 if top > 0 else 1.0)
            ax.spines[["top", "right"]].set_visible(False)
            ax.grid(axis="x", color="#e9ecef")
            ax.set_axisbelow(True)
        axes[0].invert_yaxis()
        fig.suptitle(f"{chart.title}\n{chart.subtitle}", fontsize=10, x=0.01, ha="left")
        if chart.legend:
            fig.legend(
                handles=[Patch(color=c, label=label) for label, c in chart.legend],
                loc="outside lower center",
                ncols=len(chart.legend),
                fontsize=8,
                frameon=False,
            )
        path = out_dir / f"{chart.slug}.png"
        fig.savefig(path)
        written.append(path)
        progress(chart.title)
    return written
