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
    compiler: str,
) -> str:
    """Hash of what a measurement depends on: the variant sources (so the template and the
    space), the arguments, the key dim definitions, the launch geometry, arch, bucket and NVRTC."""
    blob = {
        "kernel": spec.name,
        "entry": spec.entry,
        "types": types_key,
        "sources": list(source_hashes),
        "args": [[a.name, a.dtype, [e.text for e in a.shape] if a.shape else None, a.intent, a.value.text if a.value else None] for a in spec.args],
        "key": [[k.name, k.source, k.axis, k.mapping] for k in spec.key],
        "launch": [[e.text for e in spec.grid], [e.text for e in spec.block], spec.shared.text],
        "options": list(spec.nvrtc_options),
        "arch": arch,
        "bucket": dict(bucket),
        "compiler": compiler,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


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

    def valid(self, eid: str, checksum: str) -> dict[str, Any] | None:
        """The entry if it exists, is tuned and its checksum matches; else None (stale or absent)."""
        entry = self.entries.get(eid)
        if entry is None or entry.get("checksum") != checksum or not entry.get("tuned"):
            return None
        return entry


def _well_formed(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("checksum"), str)
        and isinstance(entry.get("config"), dict)
        and isinstance(entry.get("tuned"), bool)
        and isinstance(entry.get("measurements", []), list)
        and isinstance(entry.get("provenance", {}), dict)
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
) -> Choice:
    """The lock's winner when its entry is valid and its variant compiled; else the default."""
    entry = lock.entries.get(eid)
    if entry is None:
        reason = "no lock entry"
    elif entry.get("checksum") != checksum:
        reason = "stale lock entry (checksum mismatch)"
    elif not entry.get("tuned"):
        reason = "lock entry is untuned"
    else:
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
