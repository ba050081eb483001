"""Where a tuning run goes, decided once for the build hook and the `tune` command: the Ray
cluster that `tune --ray` or HATCH_AUTOTUNE_RAY names (every target arch it has, in one run),
else this machine's GPUs. Both engines write the lock as each bucket finishes, and return the
plan whose lock holds the new entries."""

from __future__ import annotations

from collections.abc import Sequence

from ..compile.cache import CompileCache
from ..declare.config import Mode, ProjectSpec
from ..plan.devices import Gpu
from ..text import Log
from .tuner import TuneSummary


def cluster_address(project: ProjectSpec, ray_address: str | None = None) -> str | None:
    """The Ray cluster to tune on: `ray_address` (the command's --ray), else the settings'."""
    return ray_address or project.settings.ray_address


def run_engine(
    project: ProjectSpec,
    *,
    mode: Mode | str,
    log: Log,
    cache: CompileCache,
    kernels: list[str] | None = None,
    gpus: Sequence[Gpu] | None = None,
    ray_address: str | None = None,
) -> TuneSummary:
    """Tune `project` (only `kernels`, if given) in `mode` on the cluster cluster_address()
    names, else on this machine's devices (`gpus` when the caller has detected them already)."""
    address = cluster_address(project, ray_address)
    if address:
        from . import ray_engine

        return ray_engine.tune_on_ray(project, address, kernels=kernels, mode=mode, log=log, cache=cache)
    from .. import tuning  # the package's `tune`: the public entry point of the local engine

    return tuning.tune(project, kernels=kernels, mode=mode, log=log, cache=cache, gpus=gpus)
