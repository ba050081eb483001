"""A point's choice (`Choice`): the variant it gets in the wheel and why, and what a tuned one
keeps of its lock entry's provenance. The planner makes them; the wheel, `show` and the tuner's
lock entries read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..lock import LockEntry
from ..runtime import short_repr

# What a tuned choice (and so the wheel's selection table, and `show`) keeps of its lock entry's
# provenance: the fields the tuner writes (tuning/bucket.py `provenance`), each a string of at
# most PROVENANCE_MAX_CHARS (`reference`: what every variant was verified against). Anything else
# a lock entry holds stays out of the wheel; LOCK_ONLY_PROVENANCE, the tuner's own bookkeeping (where
# a bucket's time went), without a warning.
PROVENANCE_FIELDS = (
    "gpu",
    "cc",
    "driver",
    "driver_release",
    "nvrtc",
    "nvrtc_build",
    "cuda_bindings",
    "hatch_autotune",
    "code",
    "date",
    "run",
    "search",
    "reference",
    "timing",
)
LOCK_ONLY_PROVENANCE = ("phases", "settings")
PROVENANCE_MAX_CHARS = 200


@dataclass(frozen=True)
class Choice:
    """The variant a point gets in the wheel, and why."""

    variant_index: int
    tuned: bool
    provenance: Mapping[str, Any]
    reason: str  # for an untuned choice: why the default was taken
    fallback: bool = False  # not the default: it may not run at the point, or did not compile (default-may-fail)
    median_ms: float | None = None  # a tuned choice: the winner's median time, from the lock
    default_ms: float | None = None  # and the default config's, so that `show` reports both from a wheel
    left_out: tuple[str, ...] = ()  # what of the lock entry's provenance it does not keep (shipped_provenance)
    # a tuned choice, or one inherited from the plain arch: the point's default config (or its
    # fallback where the default may not run there), where it compiled; the wheel ships it too,
    # so that a run-time pin can force it (runtime/pins.py)
    default_index: int | None = None

    @property
    def status(self) -> str:
        """tuned, default or fallback: what the outcome record and `show` call it."""
        return "tuned" if self.tuned else "fallback" if self.fallback else "default"


def shipped_provenance(provenance: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """What a tuned choice keeps of its lock entry's provenance (PROVENANCE_FIELDS, strings of
    at most PROVENANCE_MAX_CHARS), so that a lock cannot bloat the wheel; and what it leaves
    out, a phrase each, for the build's warning."""
    kept: dict[str, str] = {}
    left_out = []
    for key, value in provenance.items():
        if key in LOCK_ONLY_PROVENANCE:
            continue
        if key not in PROVENANCE_FIELDS:
            left_out.append(f"field {short_repr(key, 40)}")
        elif not isinstance(value, str):
            left_out.append(f"{key} (not a string)")
        elif len(value) > PROVENANCE_MAX_CHARS:
            left_out.append(f"{key} ({len(value):,} characters)")
        else:
            kept[key] = value
    return kept, left_out


def tuned_choice(index: int, entry: LockEntry, default_index: int | None = None) -> Choice:
    """A lock entry's winner as the wheel records it: where it was tuned (bounded:
    shipped_provenance), the winner's and the default's median times, and the variant an
    untuned build would run there (`default_index`, None where it did not compile)."""
    winner = next((m for m in entry.measurements if m.median_ms is not None and m.config == dict(entry.config)), None)
    provenance, left_out = shipped_provenance(entry.provenance)
    median_ms = winner.median_ms if winner else None
    return Choice(
        index, True, provenance, "", median_ms=median_ms, default_ms=entry.default_ms, left_out=tuple(left_out), default_index=default_index
    )
