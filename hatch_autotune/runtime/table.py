"""The selection table (table.json): the one definition of the wheel's data file. The build
writes it with `table_bytes` (hatch_autotune.wheel.table fills it, one `TableEntry` per
bucket), and the runtime, the tuning worker and the command read it with `parse_table`.

Shape (schema 1):
  {"schema": 1, "module": str, "archs": [table arch], "ptx": {table arch: PTX arch},
   "provenance": {...}, "kernels": {name: {entry, doc, args, key, type_params, launch,
     "constants": [{name, values}],
     "variants": {variant id: {config, types, index, binaries: {arch: {file, sha256, ...}},
                               resources: {arch: {...}}}},
     "select": {types key: {table arch: [TableEntry JSON]}}}}}
"""

from __future__ import annotations

import json

from .errors import TableError
from .record import Record

# CPython's built-in SHA-256: no OpenSSL to load, so importing stays fast. typeshed has no
# stubs for these private modules, hence the ignores; hashlib's is the same function.
try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # Python <= 3.11
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]  # Python >= 3.12
    except ImportError:
        from hashlib import sha256 as _sha256

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any, Mapping

TABLE_SCHEMA = 1
TABLE_FILE = "table.json"
MAX_JSON_DEPTH = 160  # deeper than any file hatch-autotune writes (expression trees included)


def sha256_hex(data: bytes) -> str:
    """The digest the table records for each shipped binary (and the module for the table)."""
    return _sha256(data).hexdigest()


def table_bytes(table: Mapping[str, Any]) -> bytes:
    """The one writer of table.json: sorted keys and a fixed layout, so equal tables give equal
    bytes (the wheel is reproducible, and the generated module pins the table's sha256)."""
    return (json.dumps(table, sort_keys=True, indent=1) + "\n").encode()


def load_json(data: bytes | bytearray | str) -> Any:
    """The one decoder of hatch-autotune's data files (lock file, selection table, cache
    entries): ValueError for text that is not JSON, or that nests deeper than MAX_JSON_DEPTH,
    which the decoder, and later whatever walks the value, would recurse into."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return value


def parse_table(data: Any, where: str) -> dict[str, Any]:
    """The one reader of table.json (bytes, or already-decoded JSON): the table, or TableError
    naming `where` and what is wrong (a newer schema says to upgrade)."""
    if isinstance(data, (bytes, bytearray, str)):
        try:
            data = load_json(data)
        except ValueError as exc:
            raise TableError(f"{where}: corrupt selection table: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict) or "schema" not in data:
        raise TableError(f'{where}: not a hatch-autotune selection table (expected a JSON object with "schema" and "kernels")')
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise TableError(f"{where}: selection table has no valid schema version (got {schema!r})")
    if schema > TABLE_SCHEMA:
        raise TableError(
            f"{where}: selection table schema {schema} is newer than this reader understands "
            f"(schema {TABLE_SCHEMA}); upgrade hatch-autotune, or rebuild the wheel with this one"
        )
    if schema != TABLE_SCHEMA:
        raise TableError(f"{where}: selection table schema {schema} is not supported (this reader understands schema {TABLE_SCHEMA})")
    return data


class TableEntry(Record):
    """One bucket's row of a kernel's `select` table: the variant it runs, and why.

    In the JSON, the times and the reason share the entry's "provenance" object with where it
    was tuned: {"gpu": ..., "cc": ..., "median_ms": ..., "default_ms": ...} for a tuned entry,
    {"reason": ...} for one that took its default; here they are separate fields."""

    __slots__ = ("bucket", "variant", "tuned", "provenance", "median_ms", "default_ms", "reason")
    bucket: tuple[int, ...]  # one declared bucket per key dim
    variant: str
    tuned: bool
    provenance: Mapping[str, Any]  # where it was tuned: gpu, cc, driver, nvrtc, date...; {} if untuned
    median_ms: float | None  # the winner's median time, when the lock has it
    default_ms: float | None  # the default config's median time, when measured
    reason: str  # why an untuned entry took its config (unused for a tuned one)

    def provenance_json(self) -> dict[str, Any]:
        """The entry's "provenance" object as the table writes it."""
        out = dict(self.provenance)
        if self.median_ms is not None:
            out["median_ms"] = self.median_ms
        if self.default_ms is not None:
            out["default_ms"] = self.default_ms
        if not self.tuned:
            out["reason"] = self.reason
        return out

    def to_json(self) -> dict[str, Any]:
        return {"bucket": list(self.bucket), "variant": self.variant, "tuned": self.tuned, "provenance": self.provenance_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableEntry:
        """The entry of a table's JSON; KeyError, TypeError or ValueError for a malformed one."""
        provenance = dict(data.get("provenance") or {})
        median_ms, default_ms = provenance.pop("median_ms", None), provenance.pop("default_ms", None)
        reason = provenance.pop("reason", "")
        return cls(
            bucket=tuple(int(b) for b in data["bucket"]),
            variant=data["variant"],
            tuned=bool(data["tuned"]),
            provenance=provenance,
            median_ms=median_ms,
            default_ms=default_ms,
            reason=str(reason),
        )
