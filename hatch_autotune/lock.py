"""The lock file (tuning database): per kernel, type instance, arch and bucket, the chosen config,
every measurement, the provenance, and a checksum of everything that makes the entry valid.

A package author tunes on a GPU builder and commits this file; a builder without a GPU then
takes the winners from entries whose checksum still matches and produces the same wheel byte
for byte. JSON with a schema version, sorted keys, atomic replace. A corrupt or foreign file is
a warning and a miss, never a crash, never silently trusted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .cache import atomic_write
from .config import KernelSpec

LOCK_SCHEMA = 1


def entry_id(kernel: str, types_key: str, arch: str, bucket: Mapping[str, int]) -> str:
    """'saxpy|T=float32|sm_90|n=4096': stable, readable, and sorts by kernel."""
    point = ",".join(f"{k}={v}" for k, v in bucket.items())
    return f"{kernel}|{types_key}|{arch}|{point}"


def entry_checksum(
    spec: KernelSpec,
    types_key: str,
    source_hashes: Sequence[str],
    arch: str,
    bucket: Mapping[str, int],
) -> str:
    """Hash of what a measurement and its winner depend on: the variant sources (so the template
    and the space), the compile options, the arguments, how key dims are read, the launch
    geometry, what verification compares against, the search, the arch and bucket.
    Expressions enter as parsed trees, so reformatting one does not invalidate the lock; the
    bucket mapping does not enter (it decides which bucket a call uses, not what was measured).
    Nor does the NVRTC version: the dependency allows any 13.x, and a builder that resolved
    another one must not lose every winner; NvrtcPolicy decides what a version change does."""
    from .compile import CompileJob

    blob = {
        "kernel": spec.name,
        "entry": spec.entry,
        "types": types_key,
        "sources": list(source_hashes),
        "options": CompileJob("", arch, spec.entry, spec.nvrtc_options).full_options(),
        "args": [[a.name, a.dtype, [e.tree for e in a.shape] if a.shape else None, a.intent, a.value.tree if a.value else None] for a in spec.args],
        "key": [[k.name, k.source, k.axis] for k in spec.key],
        "launch": [[e.tree for e in spec.grid], [e.tree for e in spec.block], spec.shared.tree],
        "verification": [spec.reference, spec.inputs, list(spec.tolerance) if spec.tolerance else None],
        "search": [spec.search.strategy, spec.search.budget, spec.search.seed],
        "arch": arch,
        "bucket": dict(bucket),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class EntryKey:
    """One tuning point of a kernel's type instance on an arch: where it sits in the lock."""

    point: tuple[int, ...]
    bucket: dict[str, int]
    eid: str
    checksum: str


def entries_for(spec: KernelSpec, types_key: str, source_hashes: Sequence[str], arch: str) -> list[EntryKey]:
    """Every bucket of a kernel's type instance on `arch`, with its lock id and checksum."""
    from .space import bucket_points

    out = []
    for point in bucket_points([k.buckets for k in spec.key]):
        bucket = dict(zip((k.name for k in spec.key), point))
        eid = entry_id(spec.name, types_key, arch, bucket)
        out.append(EntryKey(point, bucket, eid, entry_checksum(spec, types_key, source_hashes, arch, bucket)))
    return out


NOT_RECORDED = "(not recorded)"


def tuned_with(provenance: Mapping[str, Any]) -> str:
    """The NVRTC major.minor an entry was tuned with, as its provenance records it."""
    return str(provenance.get("nvrtc") or NOT_RECORDED)


@dataclass(frozen=True)
class NvrtcPolicy:
    """What a change of NVRTC version does to a lock entry. The version an entry was tuned with
    is recorded in its provenance; by default another one is reported, not invalidating (a
    winner measured with 13.0 is still the best guess under 13.5). `exact-nvrtc = true` makes an
    entry tuned with another major.minor stale, for projects that want every shipped winner
    measured with the compiler that built it."""

    nvrtc: str  # this build's NVRTC, 'major.minor'
    exact: bool = False

    def problem(self, entry: Mapping[str, Any]) -> str | None:
        """Why exact-nvrtc refuses this (tuned, checksum-valid) entry; None if it does not."""
        version = tuned_with(entry.get("provenance", {}))
        if not self.exact or version == self.nvrtc:
            return None
        return f"tuned with NVRTC {version}, this build uses {self.nvrtc} and exact-nvrtc = true"

    def warning(self, versions: Counter) -> str | None:
        """One line about the winners in use that another NVRTC measured, or None;
        `versions`: NVRTC version -> how many of the entries in use were tuned with it."""
        others = {v: n for v, n in versions.most_common() if v not in (self.nvrtc, NOT_RECORDED)}
        if not others:
            return None
        n, most = sum(others.values()), next(iter(others))
        named = most if len(others) == 1 else " and ".join(f"{v} ({k})" for v, k in others.items())
        return (
            f"{n} lock entr{'y was' if n == 1 else 'ies were'} tuned with NVRTC {named} and this build uses NVRTC {self.nvrtc}: "
            f"{'its winner is' if n == 1 else 'their winners are'} used (exact-nvrtc = true re-tunes them instead; "
            f"pin nvidia-cuda-nvrtc=={most}.* in build-system.requires for byte-identical binaries)"
        )


@dataclass
class LockFile:
    """The entries of a lock file, plus the warnings met while reading it."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> "LockFile":
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            return cls(warnings=[f"lock file {path} is unreadable or not JSON ({exc}); ignoring it"])
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            return cls(warnings=[f"lock file {path} is not a hatch-autotune lock file; ignoring it"])
        schema = data.get("schema")
        if schema != LOCK_SCHEMA:
            return cls(warnings=[f"lock file {path} has schema {schema!r}, this hatch-autotune reads {LOCK_SCHEMA}; ignoring it"])
        entries, warnings = {}, []
        for eid, entry in data["entries"].items():
            if _well_formed(entry):
                entries[eid] = entry
            else:
                warnings.append(f"lock file {path}: entry {eid!r} is malformed; ignoring it")
        return cls(entries=entries, warnings=warnings)

    def to_json(self) -> bytes:
        return (json.dumps({"schema": LOCK_SCHEMA, "entries": self.entries}, sort_keys=True, indent=1) + "\n").encode()

    def save(self, path: Path) -> None:
        atomic_write(path, self.to_json())

    def problem(self, eid: str, checksum: str, policy: NvrtcPolicy | None = None) -> str | None:
        """Why the entry cannot be used (absent, stale, untuned, or refused by exact-nvrtc), or
        None when it can: the one validity rule of the build, `tune` and `show`."""
        entry = self.entries.get(eid)
        if entry is None:
            return "no lock entry"
        if entry.get("checksum") != checksum:
            return "stale lock entry (checksum mismatch)"
        if not entry.get("tuned"):
            return "lock entry is untuned"
        return policy.problem(entry) if policy else None

    def valid(self, eid: str, checksum: str, policy: NvrtcPolicy | None = None) -> dict[str, Any] | None:
        """The entry if it can be used (see problem); else None."""
        return None if self.problem(eid, checksum, policy) else self.entries[eid]


def _well_formed(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("checksum"), str)
        and isinstance(entry.get("config"), dict)
        and isinstance(entry.get("tuned"), bool)
        and isinstance(entry.get("measurements", []), list)
        and all(isinstance(m, dict) for m in entry.get("measurements", []))
        and isinstance(entry.get("provenance", {}), dict)
        and (entry.get("default_ms") is None or isinstance(entry.get("default_ms"), (int, float)))
    )


def _provenance_with_times(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What the wheel records of a tuned entry: where it was tuned, and the winner's and the
    default's median times, so that `hatch-autotune show` can report them from a wheel alone."""
    out = dict(entry.get("provenance", {}))
    winner = next(
        (m for m in entry.get("measurements", []) if m.get("config") == entry["config"] and m.get("median_ms") is not None),
        None,
    )
    if winner is not None:
        out["median_ms"] = winner["median_ms"]
    if entry.get("default_ms") is not None:
        out["default_ms"] = entry["default_ms"]
    return out


@dataclass(frozen=True)
class Choice:
    """The variant a (kernel, types, arch, bucket) gets in the wheel, and why."""

    variant_index: int
    tuned: bool
    provenance: Mapping[str, Any]
    reason: str  # for an untuned choice: why the default was taken


def choose(
    lock: LockFile,
    eid: str,
    checksum: str,
    configs: Sequence[Mapping[str, Any]],
    usable: Sequence[bool],
    default_index: int,
    policy: NvrtcPolicy | None = None,
) -> Choice:
    """The lock's winner when its entry is valid and its variant compiled; else the default."""
    reason = lock.problem(eid, checksum, policy)
    if reason is None:
        entry = lock.entries[eid]
        try:
            index = [dict(c) for c in configs].index(entry["config"])
        except ValueError:
            index = -1
        if index >= 0 and usable[index]:
            return Choice(index, True, _provenance_with_times(entry), "")
        reason = "lock winner is not in the space or failed to compile"
    if usable[default_index]:
        return Choice(default_index, False, {}, reason)
    fallback = next(i for i, ok in enumerate(usable) if ok)
    return Choice(fallback, False, {}, f"{reason}; the default config failed to compile, took config #{fallback}")
