"""The report's charts drawn: as inline SVG for the HTML page and as PNGs with matplotlib, both
wrapping panels into rows alike (`_Layout`)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .report_charts import Chart, Panel

Progress = Callable[[str], None]

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


def esc(text: str) -> str:
    """Text made safe inside the page's HTML and SVG, attribute values included."""
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
    def of(cls, chart: Chart) -> _Layout:
        longest = max((len(b.label) for b in chart.panels[0].bars), default=0)
        label_w = int(min(max(longest * _CHAR + 24, 120), 440))
        n = len(chart.panels)
        fit = max(1, int((_WIDTH - label_w - 12 + _GAP) // (_MIN_PANEL + _GAP)))
        grid_rows = math.ceil(n / fit)
        return cls(label_w, math.ceil(n / grid_rows), grid_rows)


def svg(chart: Chart) -> str:
    """One chart as an inline `<svg>`: title, legend, then its panels in rows, each row of
    panels led by the row labels."""
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
        f'<svg class="chart" id="{esc(chart.slug)}" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" height="{height}" '
        f'role="img" aria-label="{esc(chart.title)}" font-family="system-ui, sans-serif" font-size="12">',
        f"<title>{esc(chart.title)}</title>",
        f'<rect width="{_WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="20" font-size="15" font-weight="600" fill="#212529">{esc(chart.title)}</text>',
        f'<text x="8" y="38" fill="#495057">{esc(_clip(chart.subtitle, 150))}</text>',
    ]
    x = 8.0
    for label, color in chart.legend:
        out.append(f'<rect x="{x}" y="50" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{x + 16}" y="60" fill="#495057">{esc(label)}</text>')
        x += 16 + len(label) * 6.5 + 18
    labels = [
        (f"<title>{esc(b.label)}</title>" if len(b.label) > label_chars else "")
        + esc(_clip(b.label, label_chars))  # full text on hover when cut
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
            f'<text x="{x0:.1f}" y="{top - 8}" font-size="11" font-weight="600" fill="#343a40">{esc(_clip(panel.title, int(panel_w / 7)))}</text>'
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
                f'<text x="{x0 + 4:.1f}" y="{y + _BAR - 2:.1f}" font-style="italic" fill="#868e96"><title>{esc(b.tip)}</title>{esc(b.text)}</text>'
            )
            continue
        w = max(b.value * scale, 1.0)
        bars.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_BAR}" fill="{b.color}"><title>{esc(b.tip)}</title></rect>')
        texts.append(f'<text x="{x0 + w + 4:.1f}" y="{y + _BAR - 2:.1f}">{esc(b.text)}</text>')
    out += bars
    out += ['<g font-size="10" fill="#343a40">', *texts, "</g>"]
    if panel.ref is not None:
        rx = x0 + panel.ref * scale
        out.append(f'<line x1="{rx:.1f}" y1="{top - 6}" x2="{rx:.1f}" y2="{top + plot_h + 2}" stroke="#343a40" stroke-dasharray="4 3"/>')
    out.append(
        f'<text x="{x0 + (panel_w - _VALUE_W) / 2:.1f}" y="{top + plot_h + 32}" text-anchor="middle" fill="#495057">{esc(panel.axis)}</text>'
    )
    return out


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
