"""The self-contained HTML report (inline SVG, no script, no external resource, so it can be
mailed, attached to a CI run or opened offline) and the same charts as PNGs.

The command builds the charts as data (`build_charts`, report_charts.py), then writes the page
(`render_html`, here) and the PNGs (`write_pngs`, report_figures.py) from them.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Sequence

from .. import __version__
from .fmt import fmt_config
from .model import Source, provenance_lines
from .report_charts import Chart, build_charts, entry_text, instance_text, listing
from .report_figures import Progress, esc, svg, write_pngs

__all__ = ["build_charts", "render_html", "write_pngs"]  # what the command calls

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
    notes = "".join(f"<li>{esc(n)}</li>" for n in chart.notes)
    return f'<figure id="fig-{esc(chart.slug)}">\n{svg(chart)}\n' + (f"<ul>{notes}</ul>" if notes else "") + "</figure>"


def _summary(src: Source) -> str:
    table_rows = []
    for kernel, rows in src.by_kernel():
        speedups = [r.speedup for r in rows if r.speedup is not None]
        tuned = sum(r.tuned for r in rows)
        med = f"{statistics.median(speedups):.2f}x" if speedups else "-"
        best = f"{max(speedups):.2f}x" if speedups else "-"
        table_rows.append(
            f'<tr><td><a href="#kernel-{esc(kernel)}">{esc(kernel)}</a></td><td class="num">{len(rows)}</td>'
            f'<td class="num">{tuned}</td><td class="num">{len(rows) - tuned}</td><td class="num">{med}</td><td class="num">{best}</td></tr>'
        )
    lines = provenance_lines(list(src.rows.values())) + src.notes
    return (
        "<table><tr><th>kernel</th><th>entries</th><th>tuned</th><th>default</th><th>median speedup</th><th>best speedup</th></tr>"
        + "".join(table_rows)
        + "</table>"
        + "".join(f'<p class="note">{esc(line)}</p>' for line in lines)
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
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{esc(src.label)} ({esc(src.kind)}) &middot; {len(src.rows)} entries, {len(charts)} charts '
        f"&middot; hatch-autotune {__version__} &middot; {now}</p>",
        '<nav><a href="#summary">summary</a><a href="#speedup">winner vs default</a><a href="#resources">resources</a>'
        + "".join(f'<a href="#kernel-{esc(k)}">{esc(k)}</a>' for k in kernels)
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
        parts.append(f'<h2 id="kernel-{esc(kernel)}">{esc(kernel)}: time of every variant</h2>')
        own = by_section.get(kernel, [])
        parts += [figures[c.slug] for c in own]
        charted = {c.title for c in own}  # instances with a chart; its notes name its untimed buckets
        untimed = [
            entry_text(e) + f" ({'tuned' if e.tuned else 'default'} {fmt_config(e.config)})"
            for e in rows
            if instance_text(e) not in charted
        ]
        if untimed:
            parts.append(
                f'<p class="note">No measurements for {len(untimed)} entr{"y" if len(untimed) == 1 else "ies"}: {esc(listing(untimed, 20))}</p>'
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)
