"""The search space and the key space: configs (axes x constraints) and bucket points.

Key -> bucket mapping itself lives in the runtime (the wheel needs it); this module enumerates
what the build tunes and packs. Canonical order is the product of the axes in declared order,
so a config's index is stable while the space is unchanged (ties resolve to the lowest index).
Both spaces are counted before anything enumerates them (`count_points`, `size_problem`), so
that the config check can refuse one too large to walk instead of walking it for minutes; the
walk itself streams (`iter_configs`), and a list of configs is never longer than MAX_VARIANTS,
so memory stays bounded whatever `max-configs` allows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..runtime import ExpressionError

# The most configs a kernel keeps after its constraints, over all its type instances: each is
# rendered and held in every build (about 2 ms and 10-20 KB of source each, so up to 1-2 GB) and,
# when tuned, compiled for every arch. A fixed bound, not raised by `max-configs` (which bounds
# what is walked), so that a raised `max-configs` walks a huge space in bounded memory.
MAX_VARIANTS = 100_000
# The most configs a kernel's check walks over all its type instances (configs before
# constraints x instances), unless its `max-configs` is larger: `max-configs` bounds one
# instance's space, this their product (100,000 configs x 1,000 constants walked for hours).
MAX_WALKED = 1_000_000


class ConstraintError(ValueError):
    """Constraint number `index` could not be evaluated for `config`; `cause` says why."""

    def __init__(self, index: int, config: Mapping[str, Any], cause: ExpressionError):
        self.index, self.config, self.cause = index, dict(config), cause
        super().__init__(f"constraint #{index} fails for {self.config}: {cause}")


def count_points(values_per_dim: Iterable[Sequence[Any]]) -> int:
    """How many points the product of these value lists has: the configs of a space's axes
    (before constraints), or the tuning points of the key dims' buckets."""
    return math.prod(len(values) for values in values_per_dim)


class SpaceTooLarge(ValueError):
    """The constraints keep more than `limit` configs; the walk stopped there."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"the constraints keep more than {limit:,} configs")


def size_problem(space: Mapping[str, Sequence[Any]], instances: Mapping[str, Sequence[Any]], max_configs: int) -> str | None:
    """What is wrong with a kernel's size before anything is walked, the factors named: its
    configs before constraints against `max-configs`, and those times its instances
    (`instances`: each type parameter's and constant's values) against the larger of
    `max-configs` and MAX_WALKED; None when within both. The walk (the config check and every
    build's rendering) visits each of them."""
    n_configs = count_points(space.values())
    n_instances = count_points(instances.values())
    sizes = " x ".join(f"{len(v):,} {a}" for a, v in space.items())
    if n_configs > max_configs:
        return (
            f"{n_configs:,} configs ({sizes}) before constraints, more than `max-configs` ({max_configs:,}) allows; each would be "
            "rendered and compiled, and checked here first. Shrink the axes, or raise `max-configs` for this kernel if you mean it"
        )
    walked = max(max_configs, MAX_WALKED)
    if n_configs * n_instances <= walked:
        return None
    per = " x ".join(f"{len(v):,} {name}" for name, v in instances.items() if len(v) > 1)
    return (
        f"{n_configs:,} configs ({sizes}) before constraints x {n_instances:,} instances ({per}) = {n_configs * n_instances:,}, "
        f"more than the {walked:,} a kernel may walk over its instances (`max-configs` or {MAX_WALKED:,}, the larger); each would "
        "be rendered and compiled, and checked here first. Shrink the axes, the type parameters or the constants, or raise "
        "`max-configs` for this kernel if you mean it"
    )


def iter_configs(
    space: Mapping[str, Sequence[Any]],
    constraints: Iterable[Callable[[Mapping[str, Any]], Any]],
    extra_env: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every assignment of the axes that satisfies all constraints, in canonical order, one at a
    time: the one walk of a space, in memory bounded whatever its size; ConstraintError naming
    the first constraint that cannot be evaluated."""
    axes = list(space)
    checks = list(enumerate(constraints))
    extra = dict(extra_env or {})
    for values in itertools.product(*(space[a] for a in axes)):
        config = dict(zip(axes, values))
        env = {**extra, **config}
        for index, check in checks:
            try:
                holds = check(env)
            except ExpressionError as exc:  # e.g. division by zero for this config, or a bound exceeded
                raise ConstraintError(index, config, exc) from None
            if not holds:
                break
        else:
            yield config


def enumerate_configs(
    space: Mapping[str, Sequence[Any]],
    constraints: Iterable[Callable[[Mapping[str, Any]], Any]],
    extra_env: Mapping[str, Any] | None = None,
    limit: int = MAX_VARIANTS,
) -> list[dict[str, Any]]:
    """The configs `iter_configs` walks, as a list of at most `limit`: SpaceTooLarge as soon as
    one more is kept (the walk stops there)."""
    out: list[dict[str, Any]] = []
    for config in iter_configs(space, constraints, extra_env):
        if len(out) >= limit:
            raise SpaceTooLarge(limit)
        out.append(config)
    return out


def bucket_points(buckets_per_dim: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The Cartesian product of each key dim's buckets: the points where tuning happens."""
    return [tuple(p) for p in itertools.product(*buckets_per_dim)]


def corner_points(buckets_per_dim: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The points made of each dim's smallest and largest bucket (at most 2 ** dims)."""
    return sorted(set(itertools.product(*({b[0], b[-1]} for b in buckets_per_dim))))
