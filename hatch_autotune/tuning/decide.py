"""What to tune: the target archs this machine can tune, the kernels asked for, and the lock
entries that need it (missing, stale, or all of them in `retune`). Plain functions, decided
before any GPU is touched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..declare.config import Mode, ProjectSpec
from ..plan.devices import Gpu, tunable_targets
from ..plan.planner import Instance, Plan, Point, resolve_archs
from ..text import Log
from .errors import TuningError

Todo = list[tuple[str, Instance, list[Point]]]  # per arch and type instance, the points to tune


@dataclass(frozen=True)
class TuningPlan:
    """The target archs this machine tunes (a device here tunes each: `Gpu.can_tune`), all the
    target archs, and what it warns about."""

    archs: tuple[str, ...]
    targets: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what it decided, for the build log: not warnings


def _device(g: Gpu) -> str:
    return f"{g.ordinal} ({g.name or 'unnamed'}, {g.arch})"


def plan_tuning(project: ProjectSpec, gpus: Sequence[Gpu], mode: Mode) -> TuningPlan:
    """Every target arch that a device here tunes (`Gpu.can_tune`: a 9.0 GPU tunes sm_90 and
    sm_90a, an 8.6 one not sm_80) is tuned, on those devices only. `offline` tunes nothing;
    `tune` and `retune` need a device that tunes a target arch (TuningError otherwise); `auto`
    without one builds from the lock, and says so in a note. One warning for target archs no
    device here tunes, one for devices that tune none."""
    if mode == Mode.OFFLINE:
        return TuningPlan(())
    if not gpus:
        if mode == Mode.AUTO:
            lock = project.lock_file.name
            return TuningPlan(
                (),
                notes=(
                    f"mode auto: no GPU found on this machine, so nothing is tuned; the build takes the valid winners of {lock} and the default configs elsewhere",
                ),
            )
        raise TuningError(f"tuning (mode '{mode}') needs a CUDA GPU on this machine and none was found")
    targets = resolve_archs(project, gpus)
    archs = tunable_targets(targets, gpus)
    if not archs:
        why = f"no GPU here is of a target arch ({', '.join(targets)}); devices: {', '.join(map(_device, gpus))}"
        if mode == Mode.AUTO:
            return TuningPlan((), targets, (f"{why}; not tuning",))
        raise TuningError(f"{why}; add their arch to `archs` or tune on a builder with such a GPU")
    warnings = []
    missing = [a for a in targets if a not in archs]
    if missing:
        their = "its" if len(missing) == 1 else "their"
        warnings.append(f"no GPU here is {', '.join(missing)}: {their} entries are not tuned on this machine")
    others = [g for g in gpus if not any(g.can_tune(t) for t in targets)]
    if others:
        one = len(others) == 1
        warnings.append(
            f"device{'' if one else 's'} {', '.join(map(_device, others))} {'is' if one else 'are'} not of a target arch "
            f"({', '.join(targets)}): not tuning on {'it' if one else 'them'}"
        )
    return TuningPlan(archs, targets, tuple(warnings))


def check_kernels(project: ProjectSpec, kernels: Sequence[str] | None) -> None:
    """TuningError naming the kernels asked for that the project does not declare."""
    unknown = sorted(set(kernels or []) - set(project.kernels))
    if unknown:
        raise TuningError(f"no kernel named {', '.join(unknown)}; kernels: {', '.join(project.kernels)}")


def stale_points(plan: Plan, archs: Sequence[str], mode: Mode, log: Log) -> tuple[Todo, int]:
    """What to tune (plan.to_tune) and how many entries are still valid, said in the log."""
    todo, skipped = plan.to_tune(archs, mode)
    if skipped:
        log(f"tuning: {skipped} entr(y/ies) still valid in {plan.project.lock_file.name}; not re-tuned")
    return todo, skipped
