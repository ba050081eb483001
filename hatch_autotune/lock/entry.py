"""One lock entry (`LockEntry`): a tuned point's winning config, every measurement, where it was
measured, and the checksum of what it depends on; `from_json` (which says what is malformed)
and `to_json` are its one reader and writer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import LockFormatError
from .measurements import Measurement, Runoff, Status, number_as_written


@dataclass(frozen=True)
class LockEntry:
    """One tuned point: the winning config, every measurement, where it was measured, and the
    checksum of what it depends on. `from_json` and `to_json` are its one reader and writer."""

    checksum: str
    config: Mapping[str, Any]
    tuned: bool
    index: int | None = None  # the winner's position in the canonical config list
    default: Mapping[str, Any] | None = None  # the kernel's default config when it was tuned
    default_ms: float | None = None  # the default's median time
    measurements: tuple[Measurement, ...] = ()  # one per config that may serve the point, in canonical order
    provenance: Mapping[str, Any] = field(default_factory=dict)
    runoff: Runoff | None = None  # how the winner was chosen among near-ties (None: no runoff)
    # The configs that could not serve the point, so were neither measured nor compiled for it
    # (plan/exclusions.py): what excluded them -> how many; JSON "excluded" only when any were.
    excluded: Mapping[str, int] = field(default_factory=dict)
    read_from: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # the JSON it was read from

    @classmethod
    def from_json(cls, raw: Any) -> LockEntry:
        """The entry, or LockFormatError saying what is malformed."""
        problem = _entry_problem(raw)
        if problem:
            raise LockFormatError(problem)
        return cls(
            checksum=raw["checksum"],
            config=dict(raw["config"]),
            tuned=raw["tuned"],
            index=raw.get("index"),
            default=dict(raw["default"]) if isinstance(raw.get("default"), dict) else None,
            default_ms=number_as_written(raw.get("default_ms")),
            measurements=tuple(Measurement.from_json(m) for m in raw.get("measurements", [])),
            provenance=dict(raw.get("provenance", {})),
            runoff=Runoff.from_json(raw.get("runoff")),
            excluded=_excluded(raw.get("excluded")),
            read_from=raw,
        )

    def to_json(self) -> dict[str, Any]:
        """The entry's JSON; an entry read from a file and not changed since is written back as
        it was read (keys a newer writer added, and number formats, survive a re-save)."""
        if self.read_from is not None and LockEntry.from_json(self.read_from) == self:
            copy: dict[str, Any] = json.loads(json.dumps(self.read_from))
            return copy
        out: dict[str, Any] = {"checksum": self.checksum, "config": dict(self.config), "tuned": self.tuned}
        if self.index is not None:
            out["index"] = self.index
        if self.default is not None:
            out["default"] = dict(self.default)
        if self.default is not None or self.default_ms is not None:
            out["default_ms"] = self.default_ms
        if self.measurements:
            out["measurements"] = [m.to_json() for m in self.measurements]
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        if self.runoff is not None:
            out["runoff"] = self.runoff.to_json()
        if self.excluded:
            out["excluded"] = dict(self.excluded)
        return out

    def time_of(self, config: Mapping[str, Any]) -> float | None:
        """The median time measured for `config` (a fully timed run before an eliminated one)."""
        times = [
            (m.status != Status.OK, m.median_ms)
            for m in self.measurements
            if m.timed and m.median_ms is not None and m.config == dict(config)
        ]
        return min(times)[1] if times else None

    @property
    def winner_ms(self) -> float | None:
        return self.time_of(self.config)


def _excluded(raw: Any) -> dict[str, int]:
    """The `excluded` record as a lenient reader keeps it: the groups with a count of configs."""
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0}


def _entry_problem(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return "not an object"
    if not isinstance(raw.get("checksum"), str):
        return "no checksum"
    if not isinstance(raw.get("config"), dict):
        return "no config"
    if not isinstance(raw.get("tuned"), bool):
        return "no tuned flag"
    if raw.get("index") is not None and (not isinstance(raw["index"], int) or isinstance(raw["index"], bool)):
        return "index is not an integer"
    if raw.get("default") is not None and not isinstance(raw["default"], dict):
        return "default is not an object"
    if not isinstance(raw.get("provenance", {}), dict):
        return "provenance is not an object"
    if raw.get("runoff") is not None and Runoff.from_json(raw["runoff"]) is None:
        return "runoff is not an object with a list of contenders"
    ms = raw.get("measurements", [])
    if not isinstance(ms, list) or not all(isinstance(m, dict) and isinstance(m.get("config"), dict) for m in ms):
        return "measurements are not a list of objects with a config"
    if raw.get("default_ms") is not None and number_as_written(raw["default_ms"]) is None:
        return "default_ms is not a number"
    return None
