"""What an entry records of its timings: each config's `Measurement`, and the `Runoff` that
chose the winner among its `Contender`s; times kept to 1 ns. Each record's `from_json` and
`to_json` are its one reader and writer, lenient: a field absent or of the wrong type reads as
not recorded."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """What happened to one config in one bucket; the lock writes the value."""

    OK = "ok"  # timed in full
    ELIMINATED = "eliminated"  # timed, and stopped early as a clear loser
    REJECTED = "rejected"  # ran, and its outputs disagree with the reference
    FAILED = "failed"  # crashed, hung, or failed in the runoff
    PRUNED = "pruned"  # not run: it did not compile, or exceeds the device's limits
    SKIPPED = "skipped"  # not tried by the search
    UNRECORDED = ""  # the lock does not say


TIMED = (Status.OK, Status.ELIMINATED)  # measurement statuses that carry a median time
_STATUSES = {s.value: s for s in Status}
RECORDED_DIGITS = 6  # times are kept to 1 ns (in ms)


def recorded(ms: float | None) -> float | None:
    """A time as the lock keeps it: to 1 ns."""
    return None if ms is None else round(ms, RECORDED_DIGITS)


def number_as_written(value: Any) -> float | None:
    """The number as written (an int stays an int, so a re-written file keeps its bytes)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def integer_as_written(value: Any) -> int | None:
    """The integer as written; None for anything else (a bool is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status_as_written(value: Any) -> Status | str:
    """A status as a lenient reader keeps it: its member, a string this version does not know
    as written (a re-written file keeps it), anything else as not recorded."""
    if not isinstance(value, str):
        return Status.UNRECORDED
    return _STATUSES.get(value, value)


@dataclass(frozen=True)
class Measurement:
    """What happened to one config in one bucket, as the lock records it: the tuner makes it,
    the lock keeps it, the planner, the warm starts and the inspection read it. `from_json`
    and `to_json` are its one reader and writer; the reader takes what a lenient lock reader
    accepted (a field that is absent or of the wrong type reads as not recorded)."""

    index: int | None  # the config's position in the instance's canonical config list
    config: Mapping[str, Any]
    status: Status | str  # a string only where a lock names a status this version does not know
    samples: int | None = 0  # how many timings the median is of (None: not recorded)
    median_ms: float | None = None
    spread_ms: float | None = None  # half the interquartile range of the timings
    reason: str = ""  # why it was not timed, or a note (the reference)

    @property
    def timed(self) -> bool:
        """Whether it carries a median time (ok, or eliminated early)."""
        return self.status in TIMED and self.median_ms is not None

    def as_recorded(self) -> Measurement:
        """The record as the lock file keeps it: its times rounded to 1 ns."""
        return dataclasses.replace(self, median_ms=recorded(self.median_ms), spread_ms=recorded(self.spread_ms))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Measurement:
        index, samples, status, reason = raw.get("index"), raw.get("samples"), raw.get("status"), raw.get("reason")
        return cls(
            index=integer_as_written(index),
            config=dict(raw["config"]),
            status=status_as_written(status),
            samples=integer_as_written(samples),
            median_ms=number_as_written(raw.get("median_ms")),
            spread_ms=number_as_written(raw.get("spread_ms")),
            reason=reason if isinstance(reason, str) else "",
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.index is None else {"index": self.index}
        out.update(config=dict(self.config), status=str(self.status))
        if self.samples is not None:
            out["samples"] = self.samples
        if self.median_ms is not None:
            out["median_ms"] = self.median_ms
        if self.spread_ms is not None:
            out["spread_ms"] = self.spread_ms
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Contender:
    """A config the search could not tell apart from its leader, timed again in the runoff
    (tuning/choice.py): its median in the search and over the runoff's rounds."""

    index: int | None
    search_ms: float | None
    median_ms: float | None
    spread_ms: float | None = None
    samples: int | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Contender:
        index, samples = raw.get("index"), raw.get("samples")
        return cls(
            index=integer_as_written(index),
            search_ms=number_as_written(raw.get("search_ms")),
            median_ms=number_as_written(raw.get("median_ms")),
            spread_ms=number_as_written(raw.get("spread_ms")),
            samples=integer_as_written(samples),
        )

    def to_json(self) -> dict[str, Any]:
        out = {"index": self.index, "search_ms": recorded(self.search_ms), "median_ms": recorded(self.median_ms)}
        if self.spread_ms is not None:
            out["spread_ms"] = recorded(self.spread_ms)
        if self.samples is not None:
            out["samples"] = self.samples
        return out


@dataclass(frozen=True)
class Runoff:
    """How a bucket's winner was chosen among its contenders: the rounds of interleaved timing,
    each contender (fastest first), and the margin: the runner-up's median over the winner's,
    minus one (0.01: the runner-up is 1% slower; below 0 where the canonical config of a
    near-tie was chosen over a marginally faster one)."""

    rounds: int
    contenders: tuple[Contender, ...]
    margin: float | None
    rounds_won: int | None = None  # rounds in which the winner's median was the fastest

    @classmethod
    def from_json(cls, raw: Any) -> Runoff | None:
        """The record, or None for one this reader cannot use (a lenient reader: the runoff is
        an explanation, the winner stands without it)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("contenders"), list):
            return None
        rounds, won = raw.get("rounds"), raw.get("rounds_won")
        return cls(
            rounds=integer_as_written(rounds) or 0,
            contenders=tuple(Contender.from_json(c) for c in raw["contenders"] if isinstance(c, dict)),
            margin=number_as_written(raw.get("margin")),
            rounds_won=integer_as_written(won),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rounds": self.rounds, "contenders": [c.to_json() for c in self.contenders]}
        out["margin"] = recorded(self.margin)
        if self.rounds_won is not None:
            out["rounds_won"] = self.rounds_won
        return out
