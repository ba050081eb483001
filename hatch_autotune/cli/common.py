"""What every subcommand shares: the command's name, its exit codes, how many rows a list
prints, and how an output file is written."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import CliError
from ..files import atomic_write, replaced_file

PROG = "hatch-autotune"
EXIT_OK, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2
EXIT_DECLINED = 1  # `cache clear` answered "no"
LIST_LIMIT = 500  # rows `show` and `diff` print unless told --limit N or --all: a 50k-entry lock is not a page


def row_limit(args: argparse.Namespace) -> int | None:
    """How many rows to print: --limit N, none with --all, else LIST_LIMIT."""
    return None if args.all else args.limit or LIST_LIMIT


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
