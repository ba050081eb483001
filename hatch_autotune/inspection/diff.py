"""What changed between two inputs (lock files, wheels, projects...), row by row.

Rows are matched by entry id. A row is added, removed, changed (another config, tuning gained
or lost, another GPU or NVRTC, a time that moved by more than the threshold), or only its code
changed: the same winner, but another checksum (sources or settings: lock files, projects) or
another binary (wheels, packages, projects). Code is compared only where both inputs know it, so
a lock file against a wheel says nothing about it. A chosen config that got slower by more than
the threshold is a regression.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from .model import Row, Source

ChangeKind = Literal["added", "removed", "changed", "code changed"]
KINDS: tuple[ChangeKind, ...] = ("added", "removed", "changed")  # counted in every summary
CODE_CHANGED: Final = "code changed"  # the same winner, other code: counted in the summary when there are any


@dataclass
class Change:
    """How one row differs from A to B."""

    eid: str
    kind: ChangeKind  # "code changed": the same winner, other code
    what: list[str]  # for 'changed' and 'code changed': what changed, in words
    old: Row | None
    new: Row | None
    delta: float | None = None  # relative time change of the chosen config (0.2: 20% slower)
    regression: bool = False

    @property
    def text(self) -> str:
        """The change in a table's cell: 'changed: config, slower', 'code changed: binary (...)', 'added'."""
        return f"{self.kind}: {', '.join(self.what)}" if self.kind in ("changed", CODE_CHANGED) else self.kind


@dataclass
class Diff:
    """The changes from A to B, in kernel / types / arch / bucket order, and how many rows
    did not change."""

    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0
    code_compared: int = 0  # rows in both whose code both inputs know (a checksum or a binary each)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def count(self, kind: ChangeKind) -> int:
        return sum(c.kind == kind for c in self.changes)

    def summary(self) -> str:
        """'1 added, 0 removed, 2 changed, 6 code changed, 3 unchanged' (code changes counted
        when there are any); where the two inputs know no code in common (a lock file has
        checksums, a wheel binaries), it says so rather than let "unchanged" claim the code."""
        counts = [f"{self.count(kind)} {kind}" for kind in KINDS]
        if self.count(CODE_CHANGED):
            counts.append(f"{self.count(CODE_CHANGED)} {CODE_CHANGED}")
        text = ", ".join(counts) + f", {self.unchanged} unchanged"
        matched = self.unchanged + self.count("changed") + self.count(CODE_CHANGED)
        return text + (f" ({NOT_COMPARED})" if matched and not self.code_compared else "")


NOT_COMPARED = "code not compared: no checksum or binary known to both inputs"


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
        code = _code_changes(old, new)
        what += code
        out.code_compared += _knows_code(old, new)
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
        kind: ChangeKind = CODE_CHANGED if what == code else "changed"
        out.changes.append(Change(eid, kind, what, old, new, delta, regression=delta is not None and delta > threshold))
    return out


def _code_changes(old: Row, new: Row) -> list[str]:
    """How the code of a row changed, as far as both inputs know it: the checksum of its sources
    and settings, the sha256 of its binary. Nothing where one of them does not know."""
    out = []
    if old.checksum and new.checksum and old.checksum != new.checksum:
        out.append("checksum (sources or settings changed)")
    if old.binary and new.binary and old.binary != new.binary:
        out.append("binary (sources, settings or NVRTC changed)")
    return out


def _knows_code(old: Row, new: Row) -> bool:
    return bool((old.checksum and new.checksum) or (old.binary and new.binary))


def _order(a: Source, b: Source, eid: str) -> tuple[str, str, tuple[str, int, int, str], tuple[int, ...]]:
    r = a.rows.get(eid) or b.rows[eid]
    return (r.kernel, *r.sort_key())
