"""The view model every subcommand of the command works on, whatever the user gave it.

A `Row` is the choice for one (kernel, type instance, arch, bucket) with what an input knows
about it (time, default, measurements, resources, provenance); a `Source` is the rows read from
one input (project, lock file, wheel, table, package) plus notes on what that input cannot know.
`combine` merges several inputs into one view. The readers (readers.py) fill it; `show`,
`diff` and the report only read it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..lock import Bucket, EntryId, Measurement
from ..wheel.outcome import EntryStatus, Outcome
from .fmt import fmt_config

# What a kind of input cannot know: a note of its Source, dropped by `combine` when another
# input makes up for it.
LOCK_NO_RESOURCES = "a lock file has no resource usage (registers, shared memory); the wheel has"
PROJECT_NO_RESOURCES = "a project has no resource usage until it is built; its wheel has"
TABLE_NO_TIMES = "a selection table has no measurements (times); the lock file has"


def finite_ms(value: Any) -> float | None:
    """A time in ms as a finite float; None for anything else: not a number, NaN, infinite, or
    more than a float holds (a 400-digit integer is valid JSON, and a lock file's reader keeps
    numbers as written)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


RowOrder = tuple[str, tuple[str, int, int, str], tuple[int, ...]]  # types, arch (numerically), bucket


@dataclass
class Row:
    """The choice for one (kernel, type instance, arch, bucket), with what is known about it."""

    kernel: str
    types: str  # types key: 'T=float32', or '-' for a kernel without type parameters
    arch: str
    bucket: Bucket
    config: dict[str, Any]
    tuned: bool
    note: str = ""  # why an untuned row took its config
    fallback: bool = False  # untuned, and not the default: the default did not compile (default-may-fail)
    time_ms: float | None = None  # median of the chosen config
    default_ms: float | None = None  # median of the default config
    default_config: dict[str, Any] | None = None
    measurements: list[Measurement] = field(default_factory=list)
    resources: dict[str, Any] | None = None  # ptxas usage of the chosen variant (tables only)
    variant: str | None = None  # variant id in a selection table
    checksum: str | None = None  # of the code and settings it is for: the lock entry's, or a project's now (not tables)
    binary: str | None = None  # sha256 of the cubin it runs on its arch (tables and projects; lock files have none)
    provenance: dict[str, Any] = field(default_factory=dict)
    # The configs that may not serve this entry (plan/exclusions.py): what excluded them -> how
    # many (lock files and projects; a selection table does not say).
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def status(self) -> EntryStatus:
        """tuned, default or fallback, as the build's outcome record says."""
        return EntryStatus.of(self.tuned, self.fallback)

    @property
    def eid(self) -> str:
        """The lock entry id of this (kernel, types, arch, bucket): the key rows are matched by."""
        return str(EntryId.of(self.kernel, self.types, self.arch, self.bucket))

    @property
    def speedup(self) -> float | None:
        """Default time over chosen time; 1.0 when the default is the choice."""
        if self.time_ms and self.default_ms:
            return self.default_ms / self.time_ms
        if self.default_config is not None and self.config == self.default_config and (self.time_ms or self.default_ms):
            return 1.0
        return None

    def sort_key(self) -> RowOrder:
        """Within a kernel: by types, arch (numerically: sm_90 after sm_80), bucket."""
        return (self.types, _arch_key(self.arch), self.bucket.values)


@dataclass
class Source:
    """Rows read from one input (by entry id), with where they came from and what is missing."""

    label: str
    kind: str  # project | lock | wheel | package | table, or e.g. 'lock+wheel' when combined
    rows: dict[str, Row]
    kernels: list[str]  # in the input's order
    notes: list[str] = field(default_factory=list)
    outcome: Outcome | None = None  # what the build decided and what failed (wheels, packages, projects)
    ptx: dict[str, str] = field(default_factory=dict)  # table arch -> its PTX arch (wheels, packages, projects)
    drivers: dict[str, str] = field(default_factory=dict)  # binary arch -> the oldest CUDA driver that loads it (wheels, packages)

    @property
    def has_resources(self) -> bool:
        return any(r.resources for r in self.rows.values())

    def by_kernel(self, only: Sequence[str] | None = None) -> list[tuple[str, list[Row]]]:
        groups: dict[str, list[Row]] = {k: [] for k in self.kernels}
        for r in self.rows.values():
            groups.setdefault(r.kernel, []).append(r)
        return [(k, sorted(rows, key=Row.sort_key)) for k, rows in groups.items() if rows and (not only or k in only)]


@functools.cache
def _arch_key(arch: str) -> tuple[str, int, int, str]:  # cached: sorting 50k rows asked it 50k times about a few archs
    from ..runtime import parse_arch

    try:
        kind, major, minor, suffix = parse_arch(arch)
    except ValueError:
        return (arch, 0, 0, "")
    return (kind, major, minor, suffix)


def combine(sources: Sequence[Source]) -> Source:
    """One view of several inputs (e.g. a lock file for the times plus a wheel for the
    resources): the first input that knows a field provides it."""
    if len(sources) == 1:
        return sources[0]
    rows: dict[str, Row] = {}
    kernels: list[str] = []
    notes: list[str] = []
    for src in sources:
        kernels += [k for k in src.kernels if k not in kernels]
        for eid, r in src.rows.items():
            have = rows.get(eid)
            if have is None:
                rows[eid] = dataclasses.replace(r, measurements=list(r.measurements))
            elif have.config != r.config:
                notes.append(f"{eid}: {src.label} chose {fmt_config(r.config)}; shown: {fmt_config(have.config)}")
            else:
                for f in ("time_ms", "default_ms", "default_config", "resources", "variant", "checksum", "binary"):
                    if getattr(have, f) is None:
                        setattr(have, f, getattr(r, f))
                have.measurements = have.measurements or list(r.measurements)
                have.excluded = have.excluded or dict(r.excluded)
    outcome = next((s.outcome for s in sources if s.outcome is not None), None)
    ptx = next((s.ptx for s in sources if s.ptx), {})
    drivers = next((s.drivers for s in sources if s.drivers), {})
    label, kind = " + ".join(s.label for s in sources), "+".join(s.kind for s in sources)
    merged = Source(label, kind, rows, kernels, outcome=outcome, ptx=ptx, drivers=drivers)
    timed = any(r.measurements for r in rows.values())
    for src in sources:  # drop "X is missing" notes that another input made up for
        for n in src.notes:
            made_up = (merged.has_resources and n in (LOCK_NO_RESOURCES, PROJECT_NO_RESOURCES)) or (timed and n == TABLE_NO_TIMES)
            if n not in notes and not made_up:
                notes.append(n)
    merged.notes = notes
    return merged


def binaries_lines(rows: Sequence[Row], ptx: dict[str, str], drivers: dict[str, str] | None = None) -> list[str]:
    """Where each arch's binary runs, and which one a device takes (runtime `runs_where`, the
    rule `choose_arch` applies), and the driver each needs (a wheel's table), for `show`; none
    without rows. An arch the rule cannot read (a damaged input) is left out, not an error."""
    from ..runtime.selection import runs_where

    archs = sorted({r.arch for r in rows} | set(ptx.values()), key=lambda a: (_arch_key(a)[1:], _arch_key(a)[0] != "sm"))
    where = []
    for arch in archs:
        try:
            where.append(runs_where(arch))
        except ValueError:
            continue
    if not where:
        return []
    lines = [
        f"where the binaries run: {'; '.join(where)}",
        "a device runs, of the binaries that run on it, the one of the newest minor not above its own (its own first), "
        "at that minor arch-specific, else family, else plain; else PTX (select() names the one and why)",
    ]
    if drivers:
        lines.append(
            "the driver each binary needs (a call skips those the driver cannot load): "
            + ", ".join(f"{arch}: CUDA {version}+" for arch, version in sorted(drivers.items(), key=lambda kv: str(kv[0])))
        )
    return lines


def excluded_lines(rows: Sequence[Row], limit: int | None = None) -> list[str]:
    """The configs each entry excludes, one line per kernel, type instance, arch and set of
    reasons (the entries that share them named): "scale on sm_80 at n=4000, n=8000: constraints[2]
    'n % VEC == 0' at n=4000: 3 configs"; at most `limit` lines."""
    from ..text import examples
    from .fmt import fmt_bucket

    groups: dict[tuple[str, str, str, tuple[tuple[str, int], ...]], list[str]] = {}
    for r in rows:
        if r.excluded:
            key = (r.kernel, r.types, r.arch, tuple(r.excluded.items()))
            groups.setdefault(key, []).append(fmt_bucket(r.bucket))
    lines = []
    for (kernel, types, arch, reasons), buckets in groups.items():
        of = f" ({types})" if types != "-" else ""
        said = "; ".join(f"{text}: {n} config{'' if n == 1 else 's'}" for text, n in reasons)
        lines.append(f"{kernel}{of} on {arch} at {examples(buckets)}: {said}")
    if limit is not None and len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more: --all lists every one"]
    return lines


def provenance_lines(rows: Sequence[Row]) -> list[str]:
    """One line per (GPU, cc, driver, NVRTC) the tuned rows were measured with, and when; one per
    way they were timed (eager or in a CUDA graph, the L2 cold or hot), with its kernels."""
    seen: dict[tuple[Any, Any, Any, Any], list[str]] = {}
    for r in rows:
        p = r.provenance
        if r.tuned and p.get("gpu"):
            key = (p.get("gpu"), p.get("cc"), p.get("driver"), p.get("nvrtc"))
            seen.setdefault(key, []).append(str(p.get("date", "")))
    out = []
    for (gpu, cc, driver, nvrtc), dates in seen.items():
        dates = sorted(d for d in dates if d)
        when = f", {dates[0][:10]}" + (f" to {dates[-1][:10]}" if dates[-1][:10] != dates[0][:10] else "") if dates else ""
        out.append(f"tuned on {gpu} (cc {cc}, driver {driver}, NVRTC {nvrtc}){when}")
    timed: dict[str, list[str]] = {}  # how the tuned rows were timed (the lock's `timing`) -> their kernels
    for r in rows:
        if r.tuned and isinstance(r.provenance.get("timing"), str):
            names = timed.setdefault(r.provenance["timing"], [])
            if r.kernel not in names:
                names.append(r.kernel)
    out += [f"timed with {how}: {', '.join(names)}" for how, names in timed.items()]
    return out
