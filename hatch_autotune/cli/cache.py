"""`cache`: the compile cache's location, size and shared tier, or clearing it (only what
hatch-autotune wrote, and only when asked)."""

from __future__ import annotations

import argparse
import sys

from ..compile.tiers import default_cache_dir, open_compile_cache
from ..declare.settings import read_cache_settings
from ..errors import CliError
from ..inspection.fmt import fmt_bytes
from .common import EXIT_DECLINED, EXIT_OK, PROG
from .ui import UI


def cmd_cache(args: argparse.Namespace, ui: UI) -> int:
    from ..errors import BuildError

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
