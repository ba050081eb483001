"""The command's argument parser: every subcommand, its options and help texts, and the
function that runs it."""

from __future__ import annotations

import argparse
import math
from typing import Any

from .. import __version__
from ..lock import MERGE_PREFERENCES
from .cache import cmd_cache
from .common import EXIT_ERROR, LIST_LIMIT, PROG
from .merge import cmd_merge
from .render import cmd_render
from .tuning import cmd_ray_resources, cmd_tune
from .views import cmd_diff, cmd_report, cmd_show


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
    from ..declare.settings import MODES

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
