"""`merge`: one lock file from the lock files of several builders."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import CliError
from ..inspection.readers import read_lock
from ..lock import LockFormatError, merge
from .common import EXIT_OK, write_output
from .ui import UI


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
