"""`show`, `diff` and `report`: the subcommands that read records (project, lock file, wheel,
package) and print, compare or draw them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..errors import CliError
from ..inspection.diff import diff_sources
from ..inspection.fmt import fmt_bucket, fmt_config, fmt_delta, fmt_ms, fmt_speedup
from ..inspection.model import Source, binaries_lines, combine, excluded_lines, provenance_lines
from ..inspection.readers import load_source
from ..wheel.outcome import EntryStatus
from .common import EXIT_OK, EXIT_REGRESSION, row_limit, write_output
from .ui import UI


def cmd_show(args: argparse.Namespace, ui: UI) -> int:
    src = load_source(args.source)
    groups = src.by_kernel(args.kernel)
    if args.kernel and not groups:
        raise CliError(f"no kernel named {', '.join(args.kernel)} in {src.label}; its kernels: {', '.join(src.kernels)}")
    shown = [r for _, rows in groups for r in rows]
    limit = row_limit(args)
    left = len(shown) if limit is None else min(limit, len(shown))
    listed = left  # one kind of table for all of them: rich's or plain
    for kernel, rows in groups:
        if left <= 0:
            break
        has_types = any(r.types != "-" for r in rows)
        has_notes = any(r.note for r in rows)
        has_excluded = any(r.excluded for r in rows)
        rows = rows[:left]
        left -= len(rows)
        columns = [
            "arch",
            *(["types"] if has_types else []),
            "bucket",
            "config",
            "time (ms)",
            "speedup",
            "status",
            *(["excluded"] if has_excluded else []),
            *(["note"] if has_notes else []),
        ]
        t = ui.table(kernel, columns, right=("time (ms)", "speedup", "excluded"), rows=listed)
        for r in rows:
            cells = [
                r.arch,
                *([r.types] if has_types else []),
                fmt_bucket(r.bucket),
                fmt_config(r.config),
                fmt_ms(r.time_ms),
                fmt_speedup(r.speedup),
            ]
            cells.append(r.status)
            if has_excluded:
                cells.append(str(sum(r.excluded.values())) if r.excluded else "")
            if has_notes:
                cells.append(r.note)
            t.add_row(*cells, style=None if r.tuned or not ui.tty else "yellow")
        ui.print(t)
    if limit is not None and len(shown) > limit:
        ui.print(
            f"... {len(shown) - limit} more entries not shown (the first {limit} of {len(shown)}): "
            "--all shows every one, --limit N the first N, --kernel K one kernel's"
        )
    excluded = excluded_lines(shown, limit)
    if excluded:
        ui.print("configs that may not run at an entry (never measured nor compiled for it), by kernel, arch and reason:")
        for line in excluded:
            ui.print(f"  {line}")
    failed = _show_outcome(src, args.kernel, limit, ui)
    status = {s: sum(r.status == s for r in shown) for s in EntryStatus}
    summary = f"{src.label} ({src.kind}): {len(shown)} entries, {status[EntryStatus.TUNED]} tuned, {status[EntryStatus.DEFAULT]} default"
    if status[EntryStatus.FALLBACK]:
        moved = sum(r.status == EntryStatus.FALLBACK and "may not run here" in r.note for r in shown)
        why = ["the default config does not compile"] if moved < status[EntryStatus.FALLBACK] else []
        why += ["the default config may not run there"] if moved else []
        summary += f", {status[EntryStatus.FALLBACK]} fallback ({', or '.join(why)})"
    if src.outcome is not None:
        summary += f"; {failed} variant binar{'y' if failed == 1 else 'ies'} failed to compile"
        if src.outcome.shipped is not None and not args.kernel:
            summary += f"; {src.outcome.shipped} binaries shipped"
    ui.print(summary)
    for line in binaries_lines(shown, src.ptx, src.drivers) + provenance_lines(shown) + src.notes:
        ui.print(f"  {line}")
    return EXIT_OK


def _show_outcome(src: Source, kernels: Sequence[str] | None, limit: int | None, ui: UI) -> int:
    """What the build's outcome record adds to the tables: the untuned entries grouped by
    kernel and reason, and the compile failures grouped by kernel, type instance and arch (the
    first one's log in each group; every recorded log with --all). Returns how many failed."""
    from ..text import indent, instance_text

    outcome = src.outcome
    if outcome is None:
        return 0
    untuned = {k: eids for k, eids in outcome.untuned().items() if not kernels or k[0] in kernels}
    if untuned:
        ui.print("untuned entries, by kernel and reason:")
        for (kernel, status, reason), eids in untuned.items():
            config = "the default config" if status == EntryStatus.DEFAULT else "a fallback config"
            ui.print(f"  {kernel}: {len(eids)} entr{'y runs' if len(eids) == 1 else 'ies run'} {config}: {reason}")
    groups = {k: fs for k, fs in outcome.failure_groups().items() if not kernels or k[0] in kernels}
    failed = sum(len(fs) for fs in groups.values())
    if groups:
        ui.print(f"compile failures: {failed} variant binar{'y' if failed == 1 else 'ies'} did not compile (none of them ships):")
        left, logs_left_out = limit, False
        for (kernel, types, arch), fs in groups.items():
            ui.print(f"  {kernel} ({instance_text(types)}) on {arch}: {len(fs)} variant(s)")
            for n, f in enumerate(fs):
                if left is not None and left <= 0:
                    ui.print(f"    ... {len(fs) - n} more: --all lists every one")
                    break
                left = None if left is None else left - 1
                ui.print(f"    {f.variant}" + (f" (and {f.configs - 1} more config(s) of the same source)" if f.configs > 1 else ""))
                if f.log and (n == 0 or limit is None):
                    ui.print(indent(f.log, "      "))
                logs_left_out = logs_left_out or bool(f.log and n and limit is not None)
        if logs_left_out:
            ui.print("  (the first log of each group; --all shows every recorded log)")
    return failed


def cmd_diff(args: argparse.Namespace, ui: UI) -> int:
    a, b = load_source(args.a), load_source(args.b)
    diff = diff_sources(a, b, args.threshold)
    limit = row_limit(args)
    listed = diff.changes if limit is None else diff.changes[:limit]
    if listed:
        t = ui.table(
            f"{a.label} -> {b.label}",
            ["entry", "change", "old config", "new config", "old ms", "new ms", "delta", "flag"],
            right=("old ms", "new ms", "delta"),
            rows=len(listed),
        )
        for c in listed:
            t.add_row(
                c.eid,
                c.text,
                fmt_config(c.old.config) if c.old else "-",
                fmt_config(c.new.config) if c.new else "-",
                fmt_ms(c.old.time_ms if c.old else None),
                fmt_ms(c.new.time_ms if c.new else None),
                fmt_delta(c.delta),
                "REGRESSION" if c.regression else "",
                style="bold red" if c.regression and ui.tty else None,
            )
        ui.print(t)
    hidden = diff.changes[len(listed) :]
    if hidden:
        regressions = sum(c.regression for c in hidden)
        ui.print(
            f"... {len(hidden)} more changes not shown (the first {len(listed)} of {len(diff.changes)}; "
            f"{regressions} of those not shown are regressions): --all lists every change, --limit N the first N"
        )
    ui.print(f"{diff.summary()}; {len(diff.regressions)} regression(s) over {args.threshold * 100:g}% (--threshold {args.threshold:g})")
    if diff.regressions and args.fail_on_regression:
        return EXIT_REGRESSION
    return EXIT_OK


def cmd_report(args: argparse.Namespace, ui: UI) -> int:
    if not args.output and not args.png:
        raise CliError("nothing to write: give -o report.html and/or --png DIR")
    from ..inspection import report

    src = combine([load_source(s) for s in args.sources])
    if not src.rows:
        raise CliError(f"{src.label}: no entries to report")
    charts = report.build_charts(src)
    if args.output:
        out = Path(args.output)
        if out.is_dir():
            raise CliError(f"{out}: is a directory, expected the report's file name")
        with ui.progress(len(charts), "drawing charts") as step:
            html = report.render_html(src, charts, title=args.title, progress=step)
        write_output(out, html.encode())
        ui.print(f"{out}: {len(charts)} chart(s), {len(src.rows)} entries")
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("PNG output needs matplotlib: pip install 'hatch-autotune[report]'") from None
        png_dir = Path(args.png)
        if png_dir.exists() and not png_dir.is_dir():
            raise CliError(f"{png_dir}: exists and is not a directory")
        png_dir.mkdir(parents=True, exist_ok=True)
        with ui.progress(len(charts), "writing PNGs") as step:
            written = report.write_pngs(charts, png_dir, progress=step)
        ui.print(f"{png_dir}: {len(written)} PNG file(s)")
    return EXIT_OK
