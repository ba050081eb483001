"""The search space and the key space: configs (axes x constraints) and bucket points.

Key -> bucket mapping itself lives in the runtime (the wheel needs it); this module enumerates
what the build tunes and packs. Canonical order is the product of the axes in declared order,
so a config's index is stable while the space is unchanged (ties resolve to the lowest index).
Both spaces are counted before anything enumerates them (`count_points`), so that
the config check can refuse one too large to walk instead of walking it for minutes.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..runtime import ExpressionError


class ConstraintError(ValueError):
    """Constraint number `index` could not be evaluated for `config`; `cause` says why."""

    def __init__(self, index: int, config: Mapping[str, Any], cause: ExpressionError):
        self.index, self.config, self.cause = index, dict(config), cause
        super().__init__(f"constraint #{index} fails for {self.config}: {cause}")


def count_points(values_per_dim: Iterable[Sequence[Any]]) -> int:
    """How many points the product of these value lists has: the configs of a space's axes
    (before constraints), or the tuning points of the key dims' buckets."""
    return math.prod(len(values) for values in values_per_dim)


def enumerate_configs(
    space: Mapping[str, Sequence[Any]],
    constraints: Iterable[Callable[[Mapping[str, Any]], Any]],
    extra_env: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every assignment of the axes that satisfies all constraints, in canonical order;
    ConstraintError naming the first constraint that cannot be evaluated."""
    axes = list(space)
    checks = list(enumerate(constraints))
    extra = dict(extra_env or {})
    out = []
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
            out.append(config)
    return out


def bucket_points(buckets_per_dim: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The Cartesian product of each key dim's buckets: the points where tuning happens."""
    return [tuple(p) for p in itertools.product(*buckets_per_dim)]


def corner_points(buckets_per_dim: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The points made of each dim's smallest and largest bucket (at most 2 ** dims)."""
    return sorted(set(itertools.product(*({b[0], b[-1]} for b in buckets_per_dim))))
