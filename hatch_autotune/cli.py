"""The `hatch-autotune` command: tune, show, report, diff, merge, cache.

Every subcommand takes what the user has at hand (project, lock file, wheel, installed package),
read by sources.py into one model. Bad input is one line on stderr and exit code 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import __version__
from .sources import (
    CliError,
    Entry,
    Source,
    combine,
    fmt_bucket,
    fmt_bytes,
    fmt_config,
    fmt_ms,
    load_project,
    load_source,
    provenance_lines,
    read_lock,
    time_of,
)

PROG = "hatch-autotune"
EXIT_OK, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2
EXIT_DECLINED = 1  # `cache clear` answered "no"

# --------------------------------------------------------------------------------------------
# Output: rich tables and progress on a terminal, plain text otherwise.


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

    def table(self, title: str | None, columns: Sequence[str], right: Sequence[str] = (), header: bool = True) -> Any:
        from rich import box
        from rich.table import Table

        t = Table(
            title=title,
            title_justify="left",
            box=box.SIMPLE_HEAD if self.tty else box.ASCII,
            header_style="bold" if self.tty else "",
            show_header=header,
        )
        for c in columns:
            t.add_column(c, justify="right" if c in right else "left", no_wrap=not self.tty)
        return t

    def print(self, *things: Any, style: str | None = None) -> None:
        self.out.print(*things, style=style, soft_wrap=True)

    @contextlib.contextmanager
    def progress(self, total: int | None, what: str) -> Iterator[Callable[[str], None]]:
        """advance(label) per finished step; a bar on a terminal, one line per step otherwise.
        With total=None, each call is a log line under a spinner."""
        if not self.err.is_terminal:
            done = [0]

            def step(label: str) -> None:
                done[0] += 1
                if total is None:
                    self.err.print(label, soft_wrap=True)
                else:
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

    root = Path(args.project)
    project = load_project(root)
    unknown = [k for k in args.kernel or () if k not in project.kernels]
    if unknown:
        raise CliError(f"no kernel named {', '.join(unknown)} in {root}; its kernels: {', '.join(project.kernels)}")
    mode = args.mode or {"auto": "tune"}.get(project.mode, project.mode)
    try:
        from . import tuning
    except ImportError as exc:
        if (exc.name or "").startswith("hatch_autotune.tuning"):
            raise CliError("this hatch-autotune has no tuning engine (hatch_autotune.tuning is missing)") from None
        raise
    with ui.progress(None, f"tuning {root}") as log:
        try:
            result = tuning.tune(project, kernels=args.kernel or None, mode=mode, log=log)
        except BuildError as exc:
            lines = str(exc).strip().splitlines() or ["tuning failed"]
            raise CliError(lines[0].removeprefix(f"{PROG}: "), lines[1:]) from None
    # The engine logs its own summary table and writes the lock file as each bucket finishes.
    tuned = len(getattr(result, "tuned", []) or [])
    skipped = getattr(result, "skipped", 0)
    ui.print(f"{project.lock_file}: {tuned} entr{'y' if tuned == 1 else 'ies'} tuned, {skipped} still valid; `{PROG} show {root}` lists them")
    return EXIT_OK


def _fmt_speedup(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}x"


def cmd_show(args: argparse.Namespace, ui: UI) -> int:
    src = load_source(args.source)
    groups = src.by_kernel(args.kernel)
    if args.kernel and not groups:
        raise CliError(f"no kernel named {', '.join(args.kernel)} in {src.label}; its kernels: {', '.join(src.kernels)}")
    for kernel, rows in groups:
        has_types = any(e.types != "-" for e in rows)
        has_notes = any(e.note for e in rows)
        columns = ["arch", *(["types"] if has_types else []), "bucket", "config", "time (ms)", "speedup", "status", *(["note"] if has_notes else [])]
        t = ui.table(kernel, columns, right=("time (ms)", "speedup"))
        for e in rows:
            cells = [e.arch, *([e.types] if has_types else []), fmt_bucket(e.bucket), fmt_config(e.config), fmt_ms(e.time_ms), _fmt_speedup(e.speedup)]
            cells.append("tuned" if e.tuned else "default")
            if has_notes:
                cells.append(e.note)
            t.add_row(*cells, style=None if e.tuned or not ui.tty else "yellow")
        ui.print(t)
    entries = [e for _, rows in groups for e in rows]
    n_tuned = sum(e.tuned for e in entries)
    ui.print(f"{src.label} ({src.kind}): {len(entries)} entries, {n_tuned} tuned, {len(entries) - n_tuned} default")
    for line in provenance_lines(entries) + src.notes:
        ui.print(f"  {line}")
    return EXIT_OK


@dataclass
class Change:
    eid: str
    kind: str  # added | removed | changed
    what: list[str]
    old: Entry | None
    new: Entry | None
    delta: float | None = None  # relative time change of the chosen config
    regression: bool = False


def diff_sources(a: Source, b: Source, threshold: float) -> tuple[list[Change], int]:
    """Per entry id, what changed from a to b; and how many entries did not change."""
    changes: list[Change] = []
    same = 0
    for eid in sorted(set(a.entries) | set(b.entries), key=lambda i: _diff_order(a, b, i)):
        old, new = a.entries.get(eid), b.entries.get(eid)
        if old is None:
            changes.append(Change(eid, "added", [f"new entry ({'tuned' if new.tuned else 'default'})"], None, new))
            continue
        if new is None:
            changes.append(Change(eid, "removed", ["entry removed"], old, None))
            continue
        what = []
        if old.config != new.config:
            what.append("config")
        if old.tuned != new.tuned:
            what.append("now tuned" if new.tuned else "lost its tuning")
        if old.checksum and new.checksum and old.checksum != new.checksum:
            what.append("checksum (sources or settings changed)")
        for field, label in (("gpu", "GPU"), ("nvrtc", "NVRTC")):  # not in the checksum, still worth a line
            was, now = old.provenance.get(field), new.provenance.get(field)
            if was and now and was != now:
                what.append(f"{label} {was} -> {now}")
        delta = None
        if old.time_ms and new.time_ms:
            delta = new.time_ms / old.time_ms - 1
            if abs(delta) > threshold:
                what.append("slower" if delta > 0 else "faster")
        if not what:
            same += 1
            continue
        c = Change(eid, "changed", what, old, new, delta, regression=delta is not None and delta > threshold)
        changes.append(c)
    return changes, same


def _diff_order(a: Source, b: Source, eid: str) -> tuple:
    e = a.entries.get(eid) or b.entries.get(eid)
    return (e.kernel, *e.sort_key())


def cmd_diff(args: argparse.Namespace, ui: UI) -> int:
    if args.threshold < 0:
        raise CliError(f"--threshold must be >= 0, got {args.threshold}")
    a, b = load_source(args.a), load_source(args.b)
    threshold = args.threshold / 100
    changes, same = diff_sources(a, b, threshold)
    if changes:
        t = ui.table(f"{a.label} -> {b.label}", ["entry", "change", "old config", "new config", "old ms", "new ms", "delta", "flag"], right=("old ms", "new ms", "delta"))
        for c in changes:
            delta = "-" if c.delta is None else f"{c.delta * 100:+.1f}%"
            flag = "REGRESSION" if c.regression else ""
            t.add_row(
                c.eid,
                f"{c.kind}: {', '.join(c.what)}" if c.kind == "changed" else c.kind,
                fmt_config(c.old.config) if c.old else "-",
                fmt_config(c.new.config) if c.new else "-",
                fmt_ms(c.old.time_ms if c.old else None),
                fmt_ms(c.new.time_ms if c.new else None),
                delta,
                flag,
                style="bold red" if c.regression and ui.tty else None,
            )
        ui.print(t)
    counts = {k: sum(c.kind == k for c in changes) for k in ("added", "removed", "changed")}
    regressions = [c for c in changes if c.regression]
    ui.print(
        f"{counts['added']} added, {counts['removed']} removed, {counts['changed']} changed, {same} unchanged; "
        f"{len(regressions)} regression(s) over {args.threshold:g}%"
    )
    if regressions and args.fail_on_regression:
        return EXIT_REGRESSION
    return EXIT_OK


def write_output(path: Path, data: bytes) -> None:
    """Atomically, and readable as any file the user creates (atomic_write's temp file is 0600)."""
    from .cache import atomic_write

    try:
        atomic_write(path, data)
    except OSError as exc:
        raise CliError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _same_entry(x: dict[str, Any], y: dict[str, Any]) -> bool:
    return x["checksum"] == y["checksum"] and x["config"] == y["config"]


def _chosen_ms(raw: dict[str, Any]) -> float:
    t = time_of(list(raw.get("measurements", [])), raw["config"])
    return float("inf") if t is None else t


def cmd_merge(args: argparse.Namespace, ui: UI) -> int:
    out = Path(args.output)
    if out.is_dir():
        raise CliError(f"{out}: is a directory, expected the output lock file's path")
    inputs = [(p, read_lock(Path(p))) for p in args.inputs]
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    conflicts: dict[str, str] = {}
    resolved = 0
    for label, entries in inputs:
        for eid, raw in entries.items():
            have = merged.get(eid)
            if have is None:
                merged[eid], origin[eid] = raw, label
                continue
            if _same_entry(have, raw):
                if (raw["tuned"] and not have["tuned"]) or args.prefer == "last":
                    merged[eid], origin[eid] = raw, label
                continue
            why = "different checksums" if have["checksum"] != raw["checksum"] else "different configs"
            if args.prefer is None:
                conflicts.setdefault(eid, f"{eid} ({why}: {origin[eid]} vs {label})")
                continue
            resolved += 1
            take_new = args.prefer == "last" or (args.prefer == "faster" and _chosen_ms(raw) < _chosen_ms(have))
            if take_new:
                merged[eid], origin[eid] = raw, label
    if conflicts:
        ids = sorted(conflicts)
        listing = "; ".join(conflicts[k] for k in ids[:10]) + (f"; and {len(ids) - 10} more" if len(ids) > 10 else "")
        raise CliError(
            f"{len(conflicts)} conflicting entr{'y' if len(conflicts) == 1 else 'ies'}: {listing}; "
            "choose a side with --prefer first|last|faster"
        )
    from .lock import LockFile

    write_output(out, LockFile(entries=merged).to_json())
    how = f", {resolved} conflict(s) resolved by --prefer {args.prefer}" if resolved else ""
    ui.print(f"{out}: {len(merged)} entries merged from {len(inputs)} lock file(s){how}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace, ui: UI) -> int:
    if not args.output and not args.png:
        raise CliError("nothing to write: give -o report.html and/or --png DIR")
    from . import report

    src = combine([load_source(s) for s in args.sources])
    if not src.entries:
        raise CliError(f"{src.label}: no entries to report")
    charts = report.build_charts(src)
    if args.output:
        out = Path(args.output)
        if out.is_dir():
            raise CliError(f"{out}: is a directory, expected the report's file name")
        with ui.progress(len(charts), "drawing charts") as step:
            html = report.render_html(src, charts, title=args.title, progress=step)
        write_output(out, html.encode())
        ui.print(f"{out}: {len(charts)} chart(s), {len(src.entries)} entries")
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


# Files a compile store holds: <2 hex>/<64 hex>.json|.bin, plus atomic_write's temp files.
_STORE_FILE = re.compile(r"^([0-9a-f]{64}\.(json|bin)|\.[0-9a-f]{64}\.(json|bin)\.[^/]*\.tmp)$")


def _foreign_in_store(store: Path) -> str | None:
    """A path in the store that hatch-autotune did not write, or None: never delete someone's files."""
    for d in store.iterdir():
        if d.is_symlink() or not d.is_dir() or not re.fullmatch(r"[0-9a-f]{2}", d.name):
            return str(d)
        for f in d.iterdir():
            if f.is_symlink() or not f.is_file() or not _STORE_FILE.match(f.name):
                return str(f)
    return None


def cmd_cache(args: argparse.Namespace, ui: UI) -> int:
    from .cache import CompileCache, default_cache_dir

    root = default_cache_dir()
    cache = CompileCache(root)
    store = cache.root  # <root>/v1: the only thing `clear` may delete
    entries, size = cache.info()
    if args.action == "info":
        t = ui.table("compile cache", ["what", "value"], header=False)
        t.add_row("location", str(root))
        t.add_row("store", f"{store}" + ("" if store.is_dir() else " (absent)"))
        t.add_row("entries", str(entries))
        t.add_row("size", fmt_bytes(size))
        t.add_row("set with", "HATCH_AUTOTUNE_CACHE_DIR" + (" (set)" if os.environ.get("HATCH_AUTOTUNE_CACHE_DIR") else ""))
        ui.print(t)
        return EXIT_OK
    if store.is_symlink():
        raise CliError(f"{store} is a symbolic link, not a store hatch-autotune created; leaving it alone")
    if not store.exists():
        ui.print(f"{store}: nothing to clear")
        return EXIT_OK
    if not store.is_dir():
        raise CliError(f"{store} is not a directory; not a store hatch-autotune created, leaving it alone")
    foreign = _foreign_in_store(store)
    if foreign:
        raise CliError(f"{store} holds {foreign}, which hatch-autotune did not write; not deleting anything")
    if not args.yes and sys.stdin.isatty():
        try:
            answer = input(f"delete {entries} cached binaries ({fmt_bytes(size)}) in {store}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            ui.print("nothing deleted")
            return EXIT_DECLINED
    shutil.rmtree(store)
    ui.print(f"{store}: removed {entries} entries ({fmt_bytes(size)})")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Argument parsing and the entry point.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not usage + message
        self.exit(EXIT_ERROR, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Tune, inspect, compare and merge hatch-autotune lock files and wheels.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("tune", help="tune a project on this machine's GPU and write its lock file (no wheel)")
    s.add_argument("project", nargs="?", default=".", help="project directory (default: .)")
    s.add_argument("--kernel", "-k", action="append", metavar="K", help="tune only this kernel (repeatable)")
    from .config import MODES

    s.add_argument("--mode", choices=MODES, help="tune: missing and stale entries; retune: all (default: the project's mode, else tune)")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("show", help="per kernel: arch, bucket, chosen config, time, speedup, tuned or default")
    s.add_argument("source", nargs="?", default=".", metavar="PROJECT|WHEEL|LOCK|PACKAGE", help="default: .")
    s.add_argument("--kernel", "-k", action="append", metavar="K", help="only this kernel (repeatable)")
    s.set_defaults(func=cmd_show)

    s = sub.add_parser("report", help="a self-contained HTML report with charts (and PNGs)")
    s.add_argument("sources", nargs="+", metavar="PROJECT|WHEEL|LOCK|PACKAGE", help="one or more; e.g. the lock file (times) and the wheel (resources)")
    s.add_argument("-o", "--output", metavar="HTML", help="the HTML file to write")
    s.add_argument("--png", metavar="DIR", help="also write every chart as a PNG into DIR (needs matplotlib)")
    s.add_argument("--title", default="hatch-autotune report")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("diff", help="what changed between two lock files or wheels, regressions marked")
    s.add_argument("a", metavar="A")
    s.add_argument("b", metavar="B")
    s.add_argument("--threshold", type=float, default=5.0, metavar="PCT", help="slower by more than this is a regression (default 5)")
    s.add_argument("--fail-on-regression", action="store_true", help="exit code 1 if there is a regression")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser("merge", help="one lock file from the lock files of several builders")
    s.add_argument("inputs", nargs="+", metavar="LOCK")
    s.add_argument("-o", "--output", required=True, metavar="OUT")
    s.add_argument("--prefer", choices=("first", "last", "faster"), help="resolve conflicting entries: first/last input, or the faster winner")
    s.set_defaults(func=cmd_merge)

    s = sub.add_parser("cache", help="location and size of the compile cache, or clear it")
    s.add_argument("action", choices=("info", "clear"))
    s.add_argument("--yes", "-y", action="store_true", help="clear without asking")
    s.set_defaults(func=cmd_cache)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        ui = UI()
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
        if os.environ.get("HATCH_AUTOTUNE_DEBUG"):
            raise
        sys.stderr.write(f"{PROG}: error: internal error: {type(exc).__name__}: {exc} (HATCH_AUTOTUNE_DEBUG=1 shows the traceback)\n")
        return EXIT_ERROR
