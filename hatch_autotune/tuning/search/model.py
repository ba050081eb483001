"""The base of the model-based strategies (`ModelSearch`, of `tpe` and `gp`): the unasked configs
as a mask and each config's ranks as an array, for scoring the whole space with numpy."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Strategy
from .space import SearchSpace


class ModelSearch(Strategy):
    """A model-based strategy: scores every unasked config of the space with numpy, so it keeps
    which are unasked as a mask, and each config's ranks as an array over the axes that have
    more than one value (the others tell configs nothing apart)."""

    def __init__(self, space: SearchSpace, seed: int = 0, first: Sequence[int] = (), prior: Sequence[Sequence[float | None]] = ()):
        import numpy as np

        super().__init__(space, seed, first, prior)
        self._np = np
        self._free = np.ones(len(space), dtype=bool)
        self._live = [d for d, n in enumerate(space.sizes) if n > 1]  # the space's axes that are live
        self._sizes = [space.sizes[d] for d in self._live]  # values per live axis
        self._ranks = np.array(space.ranks, dtype=np.int64).reshape(len(space), len(space.sizes))[:, self._live]  # (configs, live axes)

    def ask(self) -> list[int]:
        batch = super().ask()
        self._free[batch] = False
        return batch

    def _unasked(self) -> Sequence[int]:
        return self._np.flatnonzero(self._free)  # type: ignore[return-value]
