"""The search space and the key space: configs (axes x constraints) and bucket points.

Key -> bucket mapping itself lives in runtime.py (the wheel needs it); this module enumerates
what the build tunes and packs. Canonical order is the product of the axes in declared order,
so a config's index is stable while the space is unchanged (ties resolve to the lowest index).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping, Sequence


def enumerate_configs(
    space: Mapping[str, Sequence[Any]],
    constraints: Iterable[Callable[[Mapping[str, Any]], Any]],
    extra_env: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every assignment of the axes that satisfies all constraints, in canonical order."""
    axes = list(space)
    checks = list(constraints)
    extra = dict(extra_env or {})
    out = []
    for values in itertools.product(*(space[a] for a in axes)):
        config = dict(zip(axes, values))
        env = {**extra, **config}
        if all(c(env) for c in checks):
            out.append(config)
    return out


def bucket_points(buckets_per_dim: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The Cartesian product of each key dim's buckets: the points where tuning happens."""
    return [tuple(p) for p in itertools.product(*buckets_per_dim)]
