"""`tune` and `ray-resources`: tuning a project on this machine's GPUs or a Ray cluster's, and
what this node offers such a cluster."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..compile.tiers import open_compile_cache
from ..declare.project import load_project
from ..declare.settings import RAY_VAR, Mode
from ..errors import CliError
from .common import EXIT_OK, PROG
from .ui import UI


def cmd_tune(args: argparse.Namespace, ui: UI) -> int:
    from ..errors import BuildError
    from ..tuning.engine import cluster_address, run_engine  # here, not at the top: the other subcommands need no tuning engine

    root = Path(args.project)
    # --ray overrides HATCH_AUTOTUNE_RAY: a bad value of the variable is then no error
    project = load_project(root, env={k: v for k, v in os.environ.items() if k != RAY_VAR} if args.ray else None)
    unknown = [k for k in args.kernel or () if k not in project.kernels]
    if unknown:
        raise CliError(f"no kernel named {', '.join(unknown)} in {root}; its kernels: {', '.join(project.kernels)}")
    mode = Mode(args.mode) if args.mode else Mode.TUNE if project.mode == Mode.AUTO else project.mode
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
    from ..plan.devices import detect_gpus
    from ..tuning.ray_engine import arch_resources

    gpus = detect_gpus()
    if not gpus:
        sys.stderr.write(f"{PROG}: warning: no CUDA GPU found on this machine; it offers the cluster no GPU arch\n")
    sys.stdout.write(json.dumps(arch_resources(gpus), sort_keys=True) + "\n")
    return EXIT_OK
