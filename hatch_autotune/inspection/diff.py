"""What changed between two inputs (lock files, wheels, projects...), row by row.

Rows are matched by entry id. A row is added, removed, or changed: another config, tuning
gained or lost, another checksum, another GPU or NVRTC, or a time that moved by more than the
threshold. A chosen config that got slower by more than the threshold is a regression.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Row, Source

KINDS = ("added", "removed", "changed")


@dataclass
class Change:
    """How one row differs from A to B."""

    eid: str
    kind: str  # added | removed | changed
    what: list[str]  # for 'changed': what changed, in words
    old: Row | None
    new: Row | None
    delta: float | None = None  # relative time change of the chosen config (0.2: 20% slower)
    regression: bool = False


@dataclass
class Diff:
    """The changes from A to B, in kernel / types / arch / bucket order, and how many rows
    did not change."""

    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.changes)


def diff_sources(a: Source, b: Source, threshold: float) -> Diff:
    """Per entry id, what changed from a to b; `threshold`: the relative time change (0.05 is
    5%) beyond which a time is 'slower' or 'faster', and slower is a regression."""
    out = Diff()
    for eid in sorted(set(a.rows) | set(b.rows), key=lambda i: _order(a, b, i)):
        old, new = a.rows.get(eid), b.rows.get(eid)
        if old is None or new is None:  # the id is in one of the two
            if new is not None:
                out.changes.append(Change(eid, "added", [f"new entry ({'tuned' if new.tuned else 'default'})"], None, new))
            elif old is not None:
                out.changes.append(Change(eid, "removed", ["entry removed"], old, None))
            continue
        what = []
        if old.config != new.config:
            what.append("config")
        if old.tuned != new.tuned:
            what.append("now tuned" if new.tuned else "lost its tuning")
        if old.checksum and new.checksum and old.checksum != new.checksum:
            what.append("checksum (sources or settings changed)")
        for key, label in (("gpu", "GPU"), ("nvrtc", "NVRTC")):  # not in the checksum, still worth a line
            was, now = old.provenance.get(key), new.provenance.get(key)
            if was and now and was != now:
                what.append(f"{label} {was} -> {now}")
        delta = None
        if old.time_ms and new.time_ms:
            delta = new.time_ms / old.time_ms - 1
            if abs(delta) > threshold:
                what.append("slower" if delta > 0 else "faster")
        if not what:
            out.unchanged += 1
            continue
        out.changes.append(Change(eid, "changed", what, old, new, delta, regression=delta is not None and delta > threshold))
    return out


def _order(a: Source, b: Source, eid: str) -> tuple:
    r = a.rows.get(eid) or b.rows[eid]
    return (r.kernel, *r.sort_key())
