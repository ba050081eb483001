"""The search space as strategies see it (`SearchSpace`): each axis's values in rank order, each
config's ranks, the unit cube and one-step neighbours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SearchSpace:
    """The configs of one instance with the structure strategies use: each axis's values and,
    per config, the rank of its value on each axis (values sorted where they are numbers)."""

    axes: Mapping[str, Sequence[Any]]
    configs: Sequence[Mapping[str, Any]]
    ranks: list[tuple[int, ...]] = field(init=False)
    sizes: tuple[int, ...] = field(init=False)
    ordered: tuple[tuple[Any, ...], ...] = field(init=False)  # per axis, its values in rank order
    _index: dict[tuple[int, ...], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ordered = []
        for values in self.axes.values():
            numeric = all(isinstance(v, (int, float)) for v in values)
            ordered.append(tuple(sorted(values) if numeric else values))
        self.ordered = tuple(ordered)
        orders = {axis: {v: r for r, v in enumerate(values)} for axis, values in zip(self.axes, self.ordered)}
        self.sizes = tuple(len(v) for v in self.axes.values())
        self.ranks = [tuple(orders[a][c[a]] for a in self.axes) for c in self.configs]
        self._index = {r: i for i, r in enumerate(self.ranks)}

    def __len__(self) -> int:
        return len(self.configs)

    def features(self) -> list[list[float]]:
        """Each config as a point of the unit cube (rank / (values - 1) per axis with values)."""
        live = [d for d, n in enumerate(self.sizes) if n > 1]
        return [[r[d] / (self.sizes[d] - 1) for d in live] for r in self.ranks]

    def neighbours(self, index: int) -> list[int]:
        """Configs one step away: one axis moved to the next or previous value (any other value
        for a two-valued axis), the others unchanged; in canonical order."""
        here = self.ranks[index]
        out = []
        for d, n in enumerate(self.sizes):
            for r in (here[d] - 1, here[d] + 1):
                if 0 <= r < n:
                    j = self._index.get((*here[:d], r, *here[d + 1 :]))
                    if j is not None:
                        out.append(j)
        return sorted(out)
