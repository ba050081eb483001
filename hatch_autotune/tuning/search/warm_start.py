"""What the lock tells a bucket's search before it measures anything (`WarmStart`): configs to
measure first, related results as a prior; plain data, so that it crosses Ray as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WarmStart:
    """What the lock tells a bucket's search before it measures anything: configs to measure
    first, and related results as `auto`'s prior (see Strategy). Fixed when a run starts; plain
    data, so that it crosses Ray as JSON."""

    first: tuple[int, ...] = ()
    prior: tuple[tuple[float | None, ...], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"first": list(self.first), "prior": [list(p) for p in self.prior]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WarmStart:
        return cls(tuple(raw["first"]), tuple(tuple(p) for p in raw["prior"]))
