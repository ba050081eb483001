"""The tuning report: a self-contained HTML page (inline SVG, no script, no external resource,
so it can be mailed, attached to a CI run or opened offline) and the same charts as PNGs.

Charts are first built as data (`Chart`) from the rows of a `Source` (model.py), then drawn as
SVG for the HTML or with matplotlib for the PNGs, so both outputs always show the same thing.
"""

from __future__ import annotations

import datetime
import html
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .. import __version__
from ..build.lock import TIMED
from .fmt import fmt_bucket, fmt_config, fmt_ms
from .model import Row, Source, provenance_lines

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
    value: float
    color: str
    text: str  # printed at the end of the bar
    tip: str  # hover text (an SVG <title>)


@dataclass
class Panel:
    axis: str
    bars: list[Bar]
    ref: float | None = None  # a dashed reference line, e.g. speedup 1.0


@dataclass
class Chart:
    slug: str  # file name of its PNG, anchor in the HTML
    section: str  # 'speedup', 'resources' or a kernel's name
    title: str
    subtitle: str
    panels: list[Panel]  # side by side, sharing the row labels of the first
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
    timed = [e for e in rows if e.speedup is not None]
    if not timed:
        return None
    bars = []
    for e in timed:
        s = e.speedup
        color = WINNER if s > 1.005 else SLOWER if s < 0.995 else NEUTRAL
        tip = f"{_where(e)}: winner {_cfg(e.config)}"
        if e.time_ms and e.default_ms:
            tip += f", {_ms(e.time_ms)} ms vs default {_ms(e.default_ms)} ms"
        bars.append(Bar(_where(e), s, color, f"{s:.2f}x", tip))
    speedups = [e.speedup for e in timed]
    chart = Chart(
        slug=_slug(f"speedup {kernel}", used),
        section="speedup",
        title=f"{kernel}: winner vs default",
        subtitle=f"default time / winner time per bucket; median {statistics.median(speedups):.2f}x, best {max(speedups):.2f}x",
        panels=[Panel("speedup over the default config (x)", bars, ref=1.0)],
        legend=[("faster than the default", WINNER), ("the default is the winner", NEUTRAL), ("slower than the default", SLOWER)],
    )
    missing = [_where(e) for e in rows if e.speedup is None]
    if missing:
        chart.notes.append(f"no timing for {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} (untuned or no default time): {_listing(missing)}")
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
        r = e.resources
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


def times_chart(e: Row, used: set[str]) -> Chart | None:
    timed = [m for m in e.measurements if m.get("status") in TIMED and isinstance(m.get("median_ms"), (int, float))]
    if not timed:
        return None
    bars = []
    for m in sorted(timed, key=lambda m: m["median_ms"]):
        config, ms = m["config"], float(m["median_ms"])
        is_winner, is_default = config == e.config, e.default_config is not None and config == e.default_config
        color = WINNER if is_winner else DEFAULT if is_default else ELIMINATED if m["status"] == "eliminated" else OTHER
        role = " (winner, default)" if is_winner and is_default else " (winner)" if is_winner else " (default)" if is_default else ""
        spread = m.get("spread_ms")
        tip = f"{_cfg(config)}{role}: median {_ms(ms)} ms" + (f", spread {_ms(spread)} ms" if isinstance(spread, (int, float)) else "")
        tip += f", {m.get('samples', '?')} samples" + (", eliminated early" if m["status"] == "eliminated" else "")
        bars.append(Bar(_cfg(config) + role, ms, color, f"{_ms(ms)}", tip))
    by_status: dict[str, list[str]] = {}
    for m in e.measurements:
        if m not in timed:
            reason = f" ({m['reason']})" if m.get("reason") else ""
            by_status.setdefault(str(m.get("status", "unknown")), []).append(_cfg(m.get("config")) + reason)
    notes = [f"{status} ({len(items)}): {_listing(items, 8)}" for status, items in sorted(by_status.items())]
    speed = f", {e.speedup:.2f}x the default" if e.speedup is not None else ""
    winner = f"winner {_cfg(e.config)}" + (f": {_ms(e.time_ms)} ms" if e.time_ms else "") + speed
    legend = [("winner", WINNER), ("default", DEFAULT), ("other configs", OTHER)]
    if any(m["status"] == "eliminated" for m in timed):
        legend.append(("eliminated early", ELIMINATED))
    return Chart(
        slug=_slug(f"times {_where(e, with_kernel=True)}", used),
        section=e.kernel,
        title=_where(e, with_kernel=True),
        subtitle=f"median time of every measured config ({len(timed)} of {len(e.measurements)}); {winner}",
        panels=[Panel("median time (ms)", bars)],
        legend=legend,
        notes=notes,
    )


def build_charts(src: Source) -> list[Chart]:
    """Winner-vs-default per kernel, resource usage, then every variant's time per bucket."""
    used: set[str] = set()
    groups = src.by_kernel()
    charts = [c for kernel, rows in groups if (c := speedup_chart(kernel, rows, used))]
    if (c := resources_chart(list(src.rows.values()), used)) is not None:
        charts.append(c)
    for _, rows in groups:
        charts += [c for e in rows if (c := times_chart(e, used))]
    return charts


# --------------------------------------------------------------------------------------------
# SVG.

_WIDTH = 1040
_ROW, _BAR = 18, 12
_CHAR = 6.7  # width of a label character at 11px monospace
_VALUE_W = 60  # room for the value printed after a bar
_GAP = 28  # between panels


def _ticks(vmax: float) -> tuple[list[float], float]:
    vmax = vmax if vmax > 0 else 1.0
    raw = vmax / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(n + 1)], n * step


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "\u2026"


def svg(chart: Chart) -> str:
    rows = len(chart.panels[0].bars)
    longest = max(len(b.label) for b in chart.panels[0].bars)
    label_w = int(min(max(longest * _CHAR + 24, 120), 440))
    label_chars = int((label_w - 16) / _CHAR)
    n = len(chart.panels)
    panel_w = (_WIDTH - label_w - 12 - _GAP * (n - 1)) / n
    top = 50 + (20 if chart.legend else 0)
    plot_h = rows * _ROW
    height = top + plot_h + 44
    out = [
        f'<svg class="chart" id="{_esc(chart.slug)}" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
        f'role="img" aria-label="{_esc(chart.title)}" font-family="system-ui, sans-serif" font-size="12">',
        f"<title>{_esc(chart.title)}</title>",
        f'<rect width="{_WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="20" font-size="15" font-weight="600" fill="#212529">{_esc(chart.title)}</text>',
        f'<text x="8" y="38" fill="#495057">{_esc(_clip(chart.subtitle, 150))}</text>',
    ]
    x = 8
    for label, color in chart.legend:
        out.append(f'<rect x="{x}" y="50" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{x + 16}" y="60" fill="#495057">{_esc(label)}</text>')
        x += 16 + len(label) * 6.5 + 18
    for i, b in enumerate(chart.panels[0].bars):
        y = top + i * _ROW + _ROW / 2 + 4
        out.append(
            f'<text x="{label_w - 8}" y="{y:.1f}" text-anchor="end" font-family="ui-monospace, Menlo, Consolas, monospace" '
            f'font-size="11" fill="#212529"><title>{_esc(b.label)}</title>{_esc(_clip(b.label, label_chars))}</text>'
        )
    for p, panel in enumerate(chart.panels):
        x0 = label_w + p * (panel_w + _GAP)
        values = [b.value for b in panel.bars] + ([panel.ref] if panel.ref is not None else [])
        ticks, vmax = _ticks(max(values))
        scale = (panel_w - _VALUE_W) / vmax
        for t in ticks:
            tx = x0 + t * scale
            out.append(f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{top + plot_h}" stroke="#e9ecef"/>')
            out.append(f'<text x="{tx:.1f}" y="{top + plot_h + 14}" text-anchor="middle" font-size="10" fill="#868e96">{t:g}</text>')
        out.append(f'<line x1="{x0:.1f}" y1="{top - 4}" x2="{x0:.1f}" y2="{top + plot_h}" stroke="#adb5bd"/>')
        for i, b in enumerate(panel.bars):
            y = top + i * _ROW + (_ROW - _BAR) / 2
            w = max(b.value * scale, 1.0)
            out.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_BAR}" fill="{b.color}"><title>{_esc(b.tip)}</title></rect>'
            )
            out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + _BAR - 2:.1f}" font-size="10" fill="#343a40">{_esc(b.text)}</text>')
        if panel.ref is not None:
            rx = x0 + panel.ref * scale
            out.append(f'<line x1="{rx:.1f}" y1="{top - 6}" x2="{rx:.1f}" y2="{top + plot_h + 2}" stroke="#343a40" stroke-dasharray="4 3"/>')
        out.append(
            f'<text x="{x0 + (panel_w - _VALUE_W) / 2:.1f}" y="{top + plot_h + 32}" text-anchor="middle" fill="#495057">{_esc(panel.axis)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


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
    parts += [figures[c.slug] for c in speedups] or ['<p class="missing">No timings: nothing was tuned, or the input has no measurements (a wheel alone has none; add the lock file).</p>']
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
        charted = {c.title for c in own}
        untimed = [_where(e) + f" ({'tuned' if e.tuned else 'default'} {_cfg(e.config)})" for e in rows if _where(e, True) not in charted]
        if untimed:
            parts.append(f'<p class="note">No measurements for {len(untimed)} entr{"y" if len(untimed) == 1 else "ies"}: {_esc(_listing(untimed, 20))}</p>')
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
        fig = Figure(figsize=(11, 1.6 + 0.24 * rows), dpi=100, layout="constrained")
        axes = fig.subplots(1, len(chart.panels), sharey=True, squeeze=False)[0]
        for ax, panel in zip(axes, chart.panels):
            ys = list(range(rows))
            ax.barh(ys, [b.value for b in panel.bars], color=[b.color for b in panel.bars], height=0.7)
            ax.set_yticks(ys, [b.label for b in chart.panels[0].bars], fontsize=8, family="monospace")
            for y, b in zip(ys, panel.bars):
                ax.text(b.value, y, " " + b.text, va="center", fontsize=7, color="#343a40")
            if panel.ref is not None:
                ax.axvline(panel.ref, color="#343a40", linewidth=1, linestyle="--")
            ax.set_xlabel(panel.axis, fontsize=9)
            top = max([b.value for b in panel.bars] + ([panel.ref] if panel.ref is not None else []))
            ax.set_xlim(0, top * 1.12 if top > 0 else 1.0)
            ax.spines[["top", "right"]].set_visible(False)
            ax.grid(axis="x", color="#e9ecef")
            ax.set_axisbelow(True)
        axes[0].invert_yaxis()
        fig.suptitle(f"{chart.title}\n{chart.subtitle}", fontsize=10, x=0.01, ha="left")
        if chart.legend:
            fig.legend(handles=[Patch(color=c, label=label) for label, c in chart.legend], loc="outside lower center", ncols=len(chart.legend), fontsize=8, frameon=False)
        path = out_dir / f"{chart.slug}.png"
        fig.savefig(path)
        written.append(path)
        progress(chart.title)
    return written
