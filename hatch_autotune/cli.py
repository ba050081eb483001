"""The `hatch-autotune` command: tune, render, show, report, diff, merge, cache.

Every subcommand takes what the user has at hand (project, lock file, wheel, installed package),
read by inspection.readers into one model (inspection.model). This module only parses arguments
and prints; the rules it applies live with the stages that own them (inspection.diff, build.lock's
merge, build.cache's store layout). Bad input is one line on stderr and exit code 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import __version__
from .compile.tiers import default_cache_dir, open_compile_cache
from .declare.settings import RAY_VAR, read_cache_settings, read_settings
from .errors import CliError
from .files import atomic_write, replaced_file
from .inspection.diff import diff_sources
from .inspection.fmt import fmt_bucket, fmt_bytes, fmt_config, fmt_delta, fmt_ms, fmt_speedup
from .inspection.model import combine, provenance_lines
from .inspection.readers import load_project, load_source, read_lock
from .lock import MERGE_PREFERENCES, LockFormatError, merge
from .text import shown

PROG = "hatch-autotune"
EXIT_OK, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2
EXIT_DECLINED = 1  # `cache clear` answered "no"
LIST_LIMIT = 500  # rows `show` and `diff` print unless told --limit N or --all: a 50k-entry lock is not a page
RICH_MAX_ROWS = 1000  # a terminal gets rich's tables up to this size; they take about 2 ms a row to lay out
PROGRESS_LINES = 100  # plain progress (not a terminal) prints about this many lines, however many steps

# --------------------------------------------------------------------------------------------
# Output: rich tables and progress on a terminal, plain text otherwise.


class TextTable:
    """A table drawn as rich draws it with its ASCII box (what a pipe or a file gets), in one
    pass: rich measures and lays out every cell, about 2 ms a row, which made `show` of a
    50k-entry lock take half a minute. Cells are never wrapped or cut."""

    def __init__(self, title: str | None, columns: Sequence[str], right: Sequence[str] = (), header: bool = True):
        self.title, self.columns, self.header = title, list(columns), header
        self.right = [c in right for c in columns]
        self.rows: list[Sequence[str]] = []

    def add_row(self, *cells: str, style: str | None = None) -> None:  # style: a terminal's; none here
        self.rows.append(cells)

    def text(self) -> str:
        from rich.cells import cell_len

        width = lambda s: len(s) if s.isascii() else cell_len(s)  # noqa: E731
        body = ([self.columns] if self.header else []) + [list(map(str, r)) for r in self.rows]
        widths = [max((width(r[i]) for r in body), default=0) for i in range(len(self.columns))]

        def line(cells: Sequence[str]) -> str:
            padded = (" " * (w - width(c)) + c if right else c + " " * (w - width(c)) for c, w, right in zip(cells, widths, self.right))
            return "| " + " | ".join(padded) + " |"

        border = "+" + "-" * (sum(widths) + 3 * len(widths) - 1) + "+"
        out = ([self.title] if self.title else []) + [border]
        if self.header:
            out += [line(self.columns), "|" + "+".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in body[1 if self.header else 0 :]]
        out.append(border)
        return "\n".join(out) + "\n"


class UI:
    """stdout for results, stderr for progress and errors; plain when not on a terminal."""

    def __init__(self) -> None:
        from rich.console import Console

        self.out = Console(highlight=False, markup=False, emoji=False)
        self.err = Console(stderr=True, highlight=False, markup=False, emoji=False)
        self.tty = self.out.is_terminal
        if not self.tty:
            self.out.width = max(self.out.width, 200)  # a pipe or a file: never wrap table cells
        if not self.err.is_terminal:
            self.err.width = max(self.err.width, 200)

    def table(self, title: str | None, columns: Sequence[str], right: Sequence[str] = (), header: bool = True, rows: int = 0) -> Any:
        """A table to fill with add_row and print: rich's on a terminal, unless it will hold
        more than RICH_MAX_ROWS `rows`; the same ASCII lines as rich's otherwise, written at once."""
        if not self.tty or rows > RICH_MAX_ROWS:
            return TextTable(title, columns, right, header)
        from rich import box
        from rich.table import Table

        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, header_style="bold", show_header=header)
        for c in columns:
            t.add_column(c, justify="right" if c in right else "left")
        return t

    def print(self, *things: Any, style: str | None = None) -> None:
        if len(things) == 1 and isinstance(things[0], TextTable):
            self.out.file.write(things[0].text())
            return
        self.out.print(*things, style=style, soft_wrap=True)

    @contextlib.contextmanager
    def progress(self, total: int | None, what: str) -> Iterator[Callable[[str], None]]:
        """advance(label) per finished step; a bar on a terminal, one line per step otherwise.
        With total=None, each call is a log line under a spinner."""
        if not self.err.is_terminal:
            done = [0]
            every = max(1, math.ceil((total or 0) / PROGRESS_LINES))

            def step(label: str) -> None:
                done[0] += 1
                if total is None:
                    self.err.print(label, soft_wrap=True)
                elif done[0] % every == 0 or done[0] == total:
                    self.err.print(f"{what}: {done[0]}/{total} {label}", soft_wrap=True)

            yield step
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(what, total=total)

            def step(label: str) -> None:
                if total is None:
                    bar.console.print(label, soft_wrap=True)
                else:
                    bar.update(task, advance=1, description=f"{what}: {label}")

            yield step


# --------------------------------------------------------------------------------------------
# Subcommands.


def cmd_tune(args: argparse.Namespace, ui: UI) -> int:
    from .errors import BuildError
    from .tuning.engine import cluster_address, run_engine  # here, not at the top: the other subcommands need no tuning engine

    root = Path(args.project)
    # --ray overrides HATCH_AUTOTUNE_RAY: a bad value of the variable is then no error
    project = load_project(root, env={k: v for k, v in os.environ.items() if k != RAY_VAR} if args.ray else None)
    unknown = [k for k in args.kernel or () if k not in project.kernels]
    if unknown:
        raise CliError(f"no kernel named {', '.join(unknown)} in {root}; its kernels: {', '.join(project.kernels)}")
    mode = args.mode or {"auto": "tune"}.get(project.mode, project.mode)
    address = cluster_address(project, args.ray)
    with ui.progress(None, f"tuning {root}" + (f" on the Ray cluster at {address}" if address else "")) as log:
        try:
            cache = open_compile_cache(project.settings.cache)
            result = run_engine(project, kernels=args.kernel or None, mode=mode, log=log, cache=cache, ray_address=address)
            for w in cache.warnings():
                log(f"warning: {w}")
        except BuildError as exc:
            lines = str(exc).strip().splitlines() or ["tuning failed"]
            raise CliError(lines[0].removeprefix(f"{PROG}: "), lines[1:]) from None
    # The engine logs its own summary table and writes the lock file as each bucket finishes.
    tuned, skipped = len(result.tuned), result.skipped
    ui.print(
        f"{project.lock_file}: {tuned} entr{'y' if tuned == 1 else 'ies'} tuned, {skipped} still valid; `{PROG} show {root}` lists them"
    )
    return EXIT_OK


def cmd_ray_resources(args: argparse.Namespace, ui: UI) -> int:
    """What this node offers a Ray cluster: its GPUs, counted by arch, as `ray start --resources`
    takes them (stdout holds the JSON alone, for `--resources="$(hatch-autotune ray-resources)"`)."""
    from .plan.devices import detect_gpus
    from .tuning.ray_engine import arch_resources

    gpus = detect_gpus()
    if not gpus:
        sys.stderr.write(f"{PROG}: warning: no CUDA GPU found on this machine; it offers the cluster no GPU arch\n")
    sys.stdout.write(json.dumps(arch_resources(gpus), sort_keys=True) + "\n")
    return EXIT_OK


def _limit(args: argparse.Namespace) -> int | None:
    """How many rows to print: --limit N, none with --all, else LIST_LIMIT."""
    return None if args.all else args.limit or LIST_LIMIT


def cmd_show(args: argparse.Namespace, ui: UI) -> int:
    src = load_source(args.source)
    groups = src.by_kernel(args.kernel)
    if args.kernel and not groups:
        raise CliError(f"no kernel named {', '.join(args.kernel)} in {src.label}; its kernels: {', '.join(src.kernels)}")
    shown = [r for _, rows in groups for r in rows]
    limit = _limit(args)
    left = len(shown) if limit is None else min(limit, len(shown))
    listed = left  # one kind of table for all of them: rich's or plain
    for kernel, rows in groups:
        if left <= 0:
            break
        has_types = any(r.types != "-" for r in rows)
        has_notes = any(r.note for r in rows)
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
            *(["note"] if has_notes else []),
        ]
        t = ui.table(kernel, columns, right=("time (ms)", "speedup"), rows=listed)
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
            if has_notes:
                cells.append(r.note)
            t.add_row(*cells, style=None if r.tuned or not ui.tty else "yellow")
        ui.print(t)
    if limit is not None and len(shown) > limit:
        ui.print(
            f"... {len(shown) - limit} more entries not shown (the first {limit} of {len(shown)}): "
            "--all shows every one, --limit N the first N, --kernel K one kernel's"
        )
    failed = _show_outcome(src, args.kernel, limit, ui)
    status = {s: sum(r.status == s for r in shown) for s in ("tuned", "default", "fallback")}
    summary = f"{src.label} ({src.kind}): {len(shown)} entries, {status['tuned']} tuned, {status['default']} default"
    if status["fallback"]:
        summary += f", {status['fallback']} fallback (the default config does not compile)"
    if src.outcome is not None:
        summary += f"; {failed} variant binar{'y' if failed == 1 else 'ies'} failed to compile"
        if src.outcome.shipped is not None and not args.kernel:
            summary += f"; {src.outcome.shipped} binaries shipped"
    ui.print(summary)
    for line in provenance_lines(shown) + src.notes:
        ui.print(f"  {line}")
    return EXIT_OK


def _show_outcome(src: Any, kernels: Sequence[str] | None, limit: int | None, ui: UI) -> int:
    """What the build's outcome record adds to the tables: the untuned entries grouped by
    kernel and reason, and the compile failures grouped by kernel, type instance and arch (the
    first one's log in each group; every recorded log with --all). Returns how many failed."""
    from .text import indent, instance_text

    outcome = src.outcome
    if outcome is None:
        return 0
    untuned = {k: eids for k, eids in outcome.untuned().items() if not kernels or k[0] in kernels}
    if untuned:
        ui.print("untuned entries, by kernel and reason:")
        for (kernel, status, reason), eids in untuned.items():
            config = "the default config" if status == "default" else "a fallback config"
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
    limit = _limit(args)
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


_PAIR = re.compile(r"(\w+)=(.*)", re.DOTALL)


def _shown(value: str) -> str:
    """A value from the command line for a one-line message."""
    return shown(value, 100)


def _pairs(option: str, texts: Sequence[str]) -> dict[str, str]:
    """NAME=VALUE pairs of a repeatable option, several to an argument separated by commas or
    spaces, as `show` prints configs (`BLOCK=64 VEC=2`) and types (`CAUSAL=true,T=float16`);
    a separator counts only before the next NAME=, so a string value may hold one."""
    from .runtime.errors import short_repr

    pairs: dict[str, str] = {}
    for text in texts:
        for piece in re.split(r"[,\s]+(?=\w+=)", text.strip(", \t\n")):
            m = _PAIR.fullmatch(piece)
            if m is None:
                raise CliError(f"{option} {short_repr(text, 100)}: expected NAME=VALUE pairs, such as {option} BLOCK=128,VEC=2")
            name, value = m.group(1), m.group(2).rstrip(", \t\n")
            if name in pairs:
                raise CliError(f"{option}: {name} is given twice ({name}={_shown(pairs[name])} and {name}={_shown(value)})")
            pairs[name] = value
    return pairs


def _chosen(option: str, given: dict[str, str], allowed: dict[str, tuple[Any, ...]], kind: tuple[str, str], kernel: str) -> dict[str, Any]:
    """The given values as the kernel declares them: each name one of `allowed`'s, each value
    one of that name's values (matched by how TOML and `show` write it: `true`, `128`, `float16`)."""
    from .runtime import value_text
    from .text import examples

    out = {}
    for name, text in given.items():
        if name not in allowed:
            has = f"its {kind[1]}: {', '.join(allowed)}" if allowed else f"it has no {kind[1]}"
            raise CliError(f"{option} {name}={_shown(text)}: kernel {kernel} has no {kind[0]} named {name}; {has}")
        by_text = {value_text(v): v for v in allowed[name]}
        if text not in by_text:
            raise CliError(f"{option} {name}={_shown(text)}: not one of {name}'s values ({examples(list(by_text), 20)})")
        out[name] = by_text[text]
    return out


def _check_constraints(spec: Any, types: dict[str, Any], config: dict[str, Any]) -> None:
    """The config must be in the instance's space: each constraint holds (the space's own
    evaluation, one constraint at a time so that the message names the one broken)."""
    from .declare.space import ConstraintError, enumerate_configs
    from .runtime import value_text

    point = {k: (v,) for k, v in config.items()}
    shown = ",".join(f"{k}={value_text(v)}" for k, v in config.items())
    for_types = f" with {','.join(f'{k}={value_text(v)}' for k, v in types.items())}" if types else ""
    for i, constraint in enumerate(spec.constraints):
        try:
            holds = enumerate_configs(point, [constraint], spec.type_env(types))
        except ConstraintError as exc:
            raise CliError(f"--config {shown}{for_types}: constraints[{i}] {constraint.text!r} cannot be evaluated: {exc.cause}") from None
        if not holds:
            raise CliError(f"--config {shown}{for_types}: violates kernel {spec.name}'s constraints[{i}] {constraint.text!r}")


def cmd_render(args: argparse.Namespace, ui: UI) -> int:
    """One variant's source as NVRTC compiles it, with line numbers: NVRTC's `<entry>.cu(91)`
    is line 91 of this, not of the template."""
    from .compile.render import render_config
    from .errors import BuildError

    root = Path(args.project)
    project = load_project(root)
    spec = project.kernels.get(args.kernel)
    if spec is None:
        raise CliError(f"no kernel named {_shown(args.kernel)} in {root}; its kernels: {', '.join(project.kernels)}")
    type_values = {**spec.types, **spec.constants}
    types = {name: values[0] for name, values in type_values.items()}
    types.update(
        _chosen(
            "--types",
            _pairs("--types", args.types or ()),
            type_values,
            ("type parameter or constant", "type parameters and constants"),
            spec.name,
        )
    )
    config = {axis: spec.default[axis] for axis in spec.space}  # in the space's order, as the build labels variants
    config.update(_chosen("--config", _pairs("--config", args.config or ()), dict(spec.space), ("axis", "axes"), spec.name))
    _check_constraints(spec, types, config)
    try:
        variant, header_files = render_config(spec, types, config)
    except BuildError as exc:  # a template error: file:line: message (kernel, config)
        raise CliError(str(exc).strip().splitlines()[0].removeprefix(f"{PROG}: ")) from None
    if args.plain:
        sys.stdout.write(variant.source)
        return EXIT_OK
    out = [f"// {variant.label}: {spec.entry}.cu as NVRTC compiles it, rendered from {spec.template}"]
    out += _numbered(variant.source)
    for name, text in variant.headers:
        out.append(f'// #include "{name}": {header_files[name]}' + ("" if args.headers else " (--headers prints it)"))
        if args.headers:
            out += _numbered(text)
    if not variant.headers:
        out.append('// no headers (#include "...")')
    sys.stdout.write("\n".join(out) + "\n")
    return EXIT_OK


def _numbered(text: str) -> list[str]:
    """The lines of a source, each after its number as NVRTC counts them (newlines only)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    width = len(str(len(lines)))
    return [f"{n:>{width}}  {line}" if line else f"{n:>{width}}" for n, line in enumerate(lines, 1)]


def write_output(path: Path, data: bytes) -> None:
    """Atomically, and readable as any file the user creates (atomic_write's temp file is 0600);
    through a symlink to its target, and never over a pipe or a device."""
    try:
        path = replaced_file(path)
        atomic_write(path, data)
    except OSError as exc:
        raise CliError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def cmd_merge(args: argparse.Namespace, ui: UI) -> int:
    out = Path(args.output)
    if out.is_dir():
        raise CliError(f"{out}: is a directory, expected the output lock file's path")
    inputs = [(p, read_lock(Path(p))) for p in args.inputs]
    try:
        merged, resolved = merge(inputs, args.prefer)
    except LockFormatError as exc:
        raise CliError(str(exc)) from None
    write_output(out, merged.to_json())
    how = f", {resolved} conflict(s) resolved by --prefer {args.prefer}" if resolved else ""
    ui.print(f"{out}: {len(merged.entries)} entries merged from {len(inputs)} lock file(s){how}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace, ui: UI) -> int:
    if not args.output and not args.png:
        raise CliError("nothing to write: give -o report.html and/or --png DIR")
    from .inspection import report

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


def cmd_cache(args: argparse.Namespace, ui: UI) -> int:
    from .errors import BuildError

    try:
        settings = read_cache_settings()
        cache = open_compile_cache(settings)
    except BuildError as exc:  # a bad HATCH_AUTOTUNE_CACHE_* setting
        raise CliError(str(exc).removeprefix(f"{PROG}: ")) from None
    root = default_cache_dir(settings)
    store = cache.root  # <root>/v1: the only thing `clear` may delete
    entries, size = cache.info()
    if args.action == "info":
        t = ui.table("compile cache", ["what", "value"], header=False)
        t.add_row("location", str(root))
        t.add_row("store", f"{store}" + ("" if store.is_dir() else " (absent)"))
        t.add_row("entries", str(entries))
        t.add_row("size", fmt_bytes(size))
        t.add_row("set with", "HATCH_AUTOTUNE_CACHE_DIR" + (" (set)" if settings.dir is not None else ""))
        remote = cache.remote
        if remote is None:
            t.add_row("shared", "none (HATCH_AUTOTUNE_CACHE_URL unset)")
        else:
            t.add_row("shared", remote.url)  # the password shown as ***
            t.add_row("shared status", remote.probe() or "answers")
            expiry = f"expire {remote.ttl} s after their last use" if remote.ttl else "never expire"
            t.add_row("shared limits", f"timeout {remote.timeout:g} s, entries up to {fmt_bytes(remote.max_bytes)}, {expiry}")
        ui.print(t)
        return EXIT_OK
    if not args.yes and not sys.stdin.isatty():  # a script or a pipe: nobody to ask, so nothing is deleted unasked
        raise CliError(
            f"cache clear asks before it deletes the compile cache ({entries} entries, {fmt_bytes(size)} in {store}), and stdin "
            "is not a terminal to ask on: pass --yes to clear it without asking (nothing deleted)"
        )
    if store.is_symlink():
        raise CliError(f"{store} is a symbolic link, not a store hatch-autotune created; leaving it alone")
    if not store.exists():
        ui.print(f"{store}: nothing to clear")
        return EXIT_OK
    if not store.is_dir():
        raise CliError(f"{store} is not a directory; not a store hatch-autotune created, leaving it alone")
    not_ours = "{} holds {}, which hatch-autotune did not write; not deleting anything"
    foreign = cache.foreign_path()
    if foreign is not None:
        raise CliError(not_ours.format(store, foreign))
    if not args.yes:
        try:
            answer = input(f"delete {entries} cached binaries ({fmt_bytes(size)}) in {store}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            ui.print("nothing deleted")
            return EXIT_DECLINED
    foreign = cache.clear()  # looks again: something may have been written while we asked
    if foreign is not None:
        raise CliError(not_ours.format(store, foreign))
    ui.print(f"{store}: removed {entries} entries ({fmt_bytes(size)})")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Argument parsing and the entry point.


class _Parser(argparse.ArgumentParser):
    any_order = False  # options between and after the positionals (`render K -c X=1 PROJECT`); not with subcommands
    _intermixing = False

    def error(self, message: str) -> Any:  # one line, not usage + message
        self.exit(EXIT_ERROR, f"{PROG}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse gives every positional its value at the first one (PROJECT gets nothing in
        `render K -c X=1 PROJECT`) unless told to take them intermixed; that calls this again."""
        if not self.any_order or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def threshold(text: str) -> float:
    """--threshold: a fraction (0.05 is 5%), or a percentage written as one ('5%'). A bare number
    over 1 is refused: `--threshold 5` most likely meant 5%, not "500% slower"."""
    value = text.strip()
    percent = value.endswith("%")
    try:
        number = float(value[:-1] if percent else value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05 (or a percentage such as 5%), got {text!r}")
    if percent:
        return number / 100
    if number > 1:
        raise argparse.ArgumentTypeError(
            f"{text} is read as a fraction, {number * 100:g}% slower; for {number:g}% write {number / 100:g} or {number:g}%"
        )
    return number


def _limit_options(s: argparse.ArgumentParser, what: str) -> None:
    g = s.add_mutually_exclusive_group()
    g.add_argument(
        "--limit", type=_positive, metavar="N", help=f"list the first N {what} (default {LIST_LIMIT}); the totals count them all"
    )
    g.add_argument("--all", action="store_true", help=f"list every one of the {what}")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Tune, inspect, compare and merge hatch-autotune lock files and wheels.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("tune", help="tune a project on this machine's GPU and write its lock file (no wheel)")
    s.add_argument("project", nargs="?", default=".", help="project directory (default: .)")
    s.add_argument("--kernel", "-k", action="append", metavar="K", help="tune only this kernel (repeatable)")
    from .declare.settings import MODES

    s.add_argument("--mode", choices=MODES, help="tune: missing and stale entries; retune: all (default: the project's mode, else tune)")
    s.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="tune on the GPUs of the Ray cluster at ADDRESS (host:port), every arch it has, in one run (default: $HATCH_AUTOTUNE_RAY)",
    )
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("render", help="a variant's source as NVRTC compiles it, with line numbers (for NVRTC's `kernel.cu(91)`)")
    s.add_argument("kernel", metavar="KERNEL")
    s.add_argument("project", nargs="?", default=".", help="project directory (default: .)")
    s.add_argument(
        "--config",
        "-c",
        action="append",
        metavar="K=V",
        help="an axis's value, e.g. BLOCK=128 (repeatable, or several: BLOCK=128,VEC=2); the others from the kernel's default",
    )
    s.add_argument(
        "--types",
        "-t",
        action="append",
        metavar="K=V",
        help="a type parameter's or constant's value, e.g. T=float16 (repeatable, or several); the others their first declared value",
    )
    out = s.add_mutually_exclusive_group()
    out.add_argument("--headers", action="store_true", help="also print each header it includes, with line numbers")
    out.add_argument("--plain", action="store_true", help="the source alone, byte for byte, no line numbers or notes")
    s.set_defaults(func=cmd_render)
    s.any_order = True

    s = sub.add_parser("ray-resources", help="this node's GPUs by arch, as JSON for `ray start --resources` (tuning on a cluster)")
    s.set_defaults(func=cmd_ray_resources)

    s = sub.add_parser(
        "show",
        help="per kernel: arch, bucket, chosen config, time, speedup, tuned or default; a wheel's untuned entries and compile failures",
    )
    s.add_argument(
        "source",
        nargs="?",
        default=".",
        metavar="PROJECT|WHEEL|LOCK|PACKAGE",
        help="default: .; PACKAGE: an installed package's import or distribution name",
    )
    s.add_argument("--kernel", "-k", action="append", metavar="K", help="only this kernel (repeatable)")
    _limit_options(s, "entries")
    s.set_defaults(func=cmd_show, pause_gc=True)

    s = sub.add_parser("report", help="a self-contained HTML report with charts (and PNGs)")
    s.add_argument(
        "sources", nargs="+", metavar="PROJECT|WHEEL|LOCK|PACKAGE", help="one or more; e.g. the lock file (times) and the wheel (resources)"
    )
    s.add_argument("-o", "--output", metavar="HTML", help="the HTML file to write")
    s.add_argument("--png", metavar="DIR", help="also write every chart as a PNG into DIR (needs matplotlib)")
    s.add_argument("--title", default="hatch-autotune report")
    s.set_defaults(func=cmd_report, pause_gc=True)

    s = sub.add_parser("diff", help="what changed between two lock files or wheels, regressions marked")
    s.add_argument("a", metavar="A")
    s.add_argument("b", metavar="B")
    s.add_argument(
        "--threshold",
        type=threshold,
        default=0.05,
        metavar="FRACTION",
        help="a time that changed by more than this fraction is slower or faster, and slower is a regression: 0.05 (or 5%%) is 5%% (default 0.05)",
    )
    s.add_argument("--fail-on-regression", action="store_true", help="exit code 1 if there is a regression")
    _limit_options(s, "changes")
    s.set_defaults(func=cmd_diff, pause_gc=True)

    s = sub.add_parser("merge", help="one lock file from the lock files of several builders")
    s.add_argument("inputs", nargs="+", metavar="LOCK")
    s.add_argument("-o", "--output", required=True, metavar="OUT")
    s.add_argument("--prefer", choices=MERGE_PREFERENCES, help="resolve conflicting entries: first/last input, or the faster winner")
    s.set_defaults(func=cmd_merge, pause_gc=True)

    s = sub.add_parser("cache", help="location and size of the compile cache, or clear it")
    s.add_argument("action", choices=("info", "clear"))
    s.add_argument("--yes", "-y", action="store_true", help="clear without asking (required when stdin is not a terminal)")
    s.set_defaults(func=cmd_cache)
    return p


@contextlib.contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    """The cyclic garbage collector off while a command reads and draws whole lock files: they
    make millions of containers, none of them garbage, and the collector walked the growing
    heap again and again (40% of the time of `show` on a 50k-entry lock). Reference counting
    still frees everything; the collector comes back when the command ends."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        ui = UI()
        with _gc_paused(getattr(args, "pause_gc", False)):
            return args.func(args, ui)
    except CliError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        for line in exc.details:
            sys.stderr.write(f"  {line}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:  # a file that cannot be written or deleted: say which, in one line
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"{PROG}: error: {where}{exc.strerror or exc}\n")
        return EXIT_ERROR
    except Exception as exc:  # a bug, not bad input: still one line, the traceback on request
        if read_settings(problems=[]).debug:  # the other variables' problems are not this error's
            raise
        sys.stderr.write(f"{PROG}: error: internal error: {type(exc).__name__}: {exc} (HATCH_AUTOTUNE_DEBUG=1 shows the traceback)\n")
        return EXIT_ERROR
