"""One lock file from several builders' (`merge`): equal entries merge, entries that differ
are a `MergeConflict` unless a preference (first, last, faster) chooses."""

from __future__ import annotations

from collections.abc import Sequence

from .entry import LockEntry
from .errors import LockFormatError
from .file import LockFile

MERGE_PREFERENCES = ("first", "last", "faster")


def _ms_or_inf(entry: LockEntry) -> float:
    ms = entry.winner_ms
    return float("inf") if ms is None else ms


class MergeConflict(LockFormatError):
    """Entries of the same id that differ, with no rule to choose between them."""


def merge(inputs: Sequence[tuple[str, LockFile]], prefer: str | None = None) -> tuple[LockFile, int]:
    """One lock file from several builders' (label, lock) pairs, and how many conflicts `prefer`
    resolved. Equal entries (same checksum and config) merge, a tuned one over an untuned one;
    entries that differ are a MergeConflict unless `prefer` says first, last or faster."""
    merged: dict[str, LockEntry] = {}
    origin: dict[str, str] = {}
    conflicts: dict[str, str] = {}
    resolved = 0
    for label, lock in inputs:
        for eid, entry in lock.entries.items():
            have = merged.get(eid)
            if have is None:
                merged[eid], origin[eid] = entry, label
                continue
            if have.checksum == entry.checksum and have.config == entry.config:
                if (entry.tuned and not have.tuned) or prefer == "last":
                    merged[eid], origin[eid] = entry, label
                continue
            why = "different checksums" if have.checksum != entry.checksum else "different configs"
            if prefer is None:
                conflicts.setdefault(eid, f"{eid} ({why}: {origin[eid]} vs {label})")
                continue
            resolved += 1
            if prefer == "last" or (prefer == "faster" and _ms_or_inf(entry) < _ms_or_inf(have)):
                merged[eid], origin[eid] = entry, label
    if conflicts:
        ids = sorted(conflicts)
        listing = "; ".join(conflicts[k] for k in ids[:10]) + (f"; and {len(ids) - 10} more" if len(ids) > 10 else "")
        raise MergeConflict(
            f"{len(conflicts)} conflicting entr{'y' if len(conflicts) == 1 else 'ies'}: {listing}; "
            "choose a side with --prefer first|last|faster"
        )
    return LockFile(entries=merged), resolved
