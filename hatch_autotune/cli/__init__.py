"""The `hatch-autotune` command: tune, render, show, report, diff, merge, cache; `main` runs it.

Every subcommand takes what the user has at hand (project, lock file, wheel, installed package),
read by inspection.readers into one model (inspection.model). This package only parses arguments
and prints, one module per group of subcommands; the rules it applies live with the stages that
own them (inspection.diff, lock's merge, compile.cache's store layout). Bad input is one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence

from ..declare.settings import read_settings
from ..errors import CliError
from .cache import cmd_cache
from .common import EXIT_DECLINED, EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, LIST_LIMIT, PROG, write_output
from .merge import cmd_merge
from .parser import make_parser, threshold
from .render import cmd_render
from .tuning import cmd_ray_resources, cmd_tune
from .ui import PROGRESS_LINES, RICH_MAX_ROWS, UI, TextTable
from .views import cmd_diff, cmd_report, cmd_show

__all__ = [
    "EXIT_DECLINED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "LIST_LIMIT",
    "PROG",
    "PROGRESS_LINES",
    "RICH_MAX_ROWS",
    "UI",
    "TextTable",
    "cmd_cache",
    "cmd_diff",
    "cmd_merge",
    "cmd_ray_resources",
    "cmd_render",
    "cmd_report",
    "cmd_show",
    "cmd_tune",
    "main",
    "make_parser",
    "threshold",
    "write_output",
]


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
            code: int = args.func(args, ui)  # each subcommand's cmd_* (the parser sets it): an exit status
            return code
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
