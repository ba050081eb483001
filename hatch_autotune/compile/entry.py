"""One compile's outcome as every cache tier keeps it: `CacheEntry` (a success with its binary
and ptxas's `Resources`, or a failure with its log) and its metadata record, the one definition
that the disk store (cache.py) and the shared Redis tier (remote_cache.py) both write and check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one kernel entry."""

    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    barriers: int = 0


CACHE_SCHEMA = 1

_SHA256 = re.compile(r"[0-9a-f]{64}")
_RECORD_KEYS = frozenset({"schema", "key", "ok", "log", "label", "resources", "binary_size", "binary_sha256", "metadata_sha256"})
MAX_METADATA_BYTES = 4 << 20  # a compile log is kilobytes; a larger file is not an entry and is not read


def _resource_fields() -> frozenset[str]:
    """The field names of Resources, which owns them."""
    return frozenset(f.name for f in dataclasses.fields(Resources))


@dataclass(frozen=True)
class CacheEntry:
    """One compile's outcome as the store keeps it: a success with its (non-empty) binary and,
    for a cubin, ptxas's resource counts; or a failure with its log and nothing else. Only a
    valid entry can be made (ValueError otherwise), so `put` never writes a damaged one."""

    ok: bool
    log: str
    label: str
    resources: dict[str, int] | None
    binary: bytes | None

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise ValueError(f"not a valid compile cache entry: {problem}")

    def _problem(self) -> str | None:
        """What is wrong with the fields, exact types included (JSON's true is not 1), or None."""
        if type(self.ok) is not bool:
            return "ok is not a boolean"
        if type(self.log) is not str or type(self.label) is not str:
            return "log and label must be strings"
        if self.resources is not None:
            if type(self.resources) is not dict or set(self.resources) != _resource_fields():
                return "resources must be None or a dict of exactly the Resources fields"
            if not all(type(v) is int and v >= 0 for v in self.resources.values()):
                return "resource counts must be non-negative integers"
        if self.ok:
            if type(self.binary) is not bytes or not self.binary:
                return "a successful compile needs a non-empty binary"
        elif self.binary is not None or self.resources is not None:
            return "a failed compile has neither a binary nor resources"
        return None

    def record(self, key: str) -> dict[str, Any]:
        """The metadata JSON: every field but the binary, which is named by its size and sha256,
        and the sha256 of the rest, so that a flipped bit in the log or a resource count is a
        miss too."""
        fields = {
            "schema": CACHE_SCHEMA,
            "key": key,
            "ok": self.ok,
            "log": self.log,
            "label": self.label,
            "resources": self.resources,
            "binary_size": len(self.binary) if self.binary is not None else None,
            "binary_sha256": hashlib.sha256(self.binary).hexdigest() if self.binary is not None else None,
        }
        return {**fields, "metadata_sha256": _metadata_digest(fields)}

    def metadata(self, key: str) -> bytes:
        """`record(key)` as the bytes every store keeps (on disk and in Redis alike)."""
        return json.dumps(self.record(key), sort_keys=True).encode()

    @classmethod
    def from_record(cls, record: Any, key: str, read_binary: Callable[[int], bytes]) -> CacheEntry | None:
        """The entry that `record` (decoded metadata) and the binary describe, or None for
        anything `record()` would not have written. The binary is read, given its recorded
        size, only for a success."""
        if type(record) is not dict or record.keys() != _RECORD_KEYS:
            return None
        fields = {k: v for k, v in record.items() if k != "metadata_sha256"}
        if record["metadata_sha256"] != _metadata_digest(fields):
            return None
        if type(record["schema"]) is not int or record["schema"] != CACHE_SCHEMA or record["key"] != key:
            return None
        ok, size, digest = record["ok"], record["binary_size"], record["binary_sha256"]
        if ok is True:
            if type(size) is not int or size < 1 or type(digest) is not str or not _SHA256.fullmatch(digest):
                return None
            binary = read_binary(size)
            if hashlib.sha256(binary).hexdigest() != digest:
                return None
        elif ok is False and size is None and digest is None:
            binary = None
        else:
            return None
        try:
            return cls(ok=ok, log=record["log"], label=record["label"], resources=record["resources"], binary=binary)
        except ValueError:
            return None


def _metadata_digest(fields: dict[str, Any]) -> str:
    """sha256 of the metadata's fields in one canonical form (a decoded record re-encodes to it)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
