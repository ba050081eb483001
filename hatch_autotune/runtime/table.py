"""The selection table (table.json): the one definition of the wheel's data file. The build
writes it with `table_bytes` (hatch_autotune.wheel.table fills it: per kernel a `KernelTable`,
its declaration a `KernelDecl`, one `Variant` per variant shipped, one `TableEntry` per bucket),
and the runtime and the command read it with `parse_table` and `KernelTable.from_json`.

Shape (schema 1):
  {"schema": 1, "module": str, "archs": [table arch], "ptx": {table arch: PTX arch},
   "drivers": {binary arch: "MAJOR.MINOR", the oldest CUDA driver that loads it},
   "provenance": {...}, "kernels": {name: {entry, doc, args, key, type_params, launch,
     "constants": [{name, values}],
     "variants": {variant id: {config, types, index, binaries: {arch: {file, sha256, ...}},
                               resources: {arch: {...}}}},
     "select": {types key: {table arch: [TableEntry JSON]}}}}}
"""

from __future__ import annotations

import json

from .declaration import KernelDecl
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
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

TABLE_SCHEMA = 1
TABLE_FILE = "table.json"
MAX_JSON_DEPTH = 160  # deeper than any file hatch-autotune writes (expression trees included)


def sha256_hex(data: bytes) -> str:
    """The digest the table records for each shipped binary (and the module for the table)."""
    digest: str = _sha256(data).hexdigest()  # hashlib's sha256 where the private modules are unknown to typeshed
    return digest


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

    __slots__ = ("bucket", "variant", "tuned", "provenance", "median_ms", "default_ms", "reason", "default_variant")
    bucket: tuple[int, ...]  # one declared bucket per key dim
    variant: str
    tuned: bool
    provenance: Mapping[str, Any]  # where it was tuned: gpu, cc, driver, nvrtc, date...; {} if untuned
    median_ms: float | None  # the winner's median time, when the lock has it
    default_ms: float | None  # the default config's median time, when measured
    reason: str  # why an untuned entry took its config (unused for a tuned one)
    # where the entry runs a winner (tuned, or the plain arch's inherited): the kernel's default
    # config at this bucket (or the config that replaces it where it may not run here), shipped
    # for a run-time pin (pins.py); None where the entry runs it already or it did not compile
    default_variant: str | None

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
        out = {"bucket": list(self.bucket), "variant": self.variant, "tuned": self.tuned, "provenance": self.provenance_json()}
        if self.default_variant is not None:
            out["default"] = self.default_variant
        return out

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
            default_variant=None if data.get("default") is None else str(data["default"]),
        )


class BinaryRef(Record):
    """A variant's binary for one arch: its file in the package and its sha256; for PTX also
    the ISA version and the NVRTC that made it (a driver JIT-compiles PTX only up to its ISA)."""

    __slots__ = ("file", "sha256", "ptx_isa", "nvrtc")
    file: str
    sha256: str
    ptx_isa: str | None
    nvrtc: str | None

    def to_json(self) -> dict[str, Any]:
        out = {"file": self.file, "sha256": self.sha256}
        if self.ptx_isa is not None:
            out["ptx_isa"] = self.ptx_isa
        if self.nvrtc is not None:
            out["nvrtc"] = self.nvrtc
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BinaryRef:
        isa, nvrtc = data.get("ptx_isa"), data.get("nvrtc")
        return cls(str(data["file"]), str(data["sha256"]), None if isa is None else str(isa), None if nvrtc is None else str(nvrtc))


class Variant(Record):
    """One variant a wheel ships: its config, its type instance, its index in the space, its
    binaries by arch, and ptxas' resource counts by arch (shown by the command; the runtime
    never reads them, so they stay as written)."""

    __slots__ = ("config", "types", "index", "binaries", "resources")
    config: Mapping[str, Any]
    types: Mapping[str, Any]
    index: int
    binaries: Mapping[str, BinaryRef]  # arch ('sm_90' or 'compute_90') -> its binary
    resources: Mapping[str, Any]  # arch -> ptxas' counts by name, as written

    def to_json(self) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "types": dict(self.types),
            "index": self.index,
            "binaries": {arch: b.to_json() for arch, b in self.binaries.items()},
            "resources": dict(self.resources),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Variant:
        return cls(
            config=dict(data["config"]),
            types=dict(data.get("types") or {}),
            index=int(data.get("index", 0)),
            binaries={str(arch): BinaryRef.from_json(b) for arch, b in (data.get("binaries") or {}).items()},
            resources=dict(data.get("resources") or {}),
        )


class KernelTable:
    """One kernel's part of table.json: its declaration, the variants shipped, and per type
    instance and arch the entry of each bucket (each entry read at its first use, so loading a
    table of many buckets stays quick)."""

    __slots__ = ("decl", "variants", "_rows")

    def __init__(
        self,
        decl: KernelDecl,
        variants: Mapping[str, Variant],
        select: Mapping[str, Mapping[str, Sequence[TableEntry | Mapping[str, Any]]]],
    ):
        self.decl = decl
        self.variants = variants
        # (types key, table arch) -> {bucket: the entry, or its JSON until it is read}
        self._rows: dict[tuple[str, str], dict[tuple[int, ...], TableEntry | Mapping[str, Any]]] = {
            (tkey, arch): {_bucket_of(e): e for e in entries} for tkey, per_arch in select.items() for arch, entries in per_arch.items()
        }

    @property
    def name(self) -> str:
        return self.decl.name

    def entry(self, tkey: str, arch: str, bucket: tuple[int, ...]) -> TableEntry:
        """The entry of a bucket; KeyError where the table has none."""
        rows = self._rows[(tkey, arch)]
        found = rows[bucket]
        if not isinstance(found, TableEntry):
            found = rows[bucket] = TableEntry.from_json(found)
        return found

    def row_variants(self, tkey: str, arch: str) -> list[str]:
        """The variants an instance's buckets choose on an arch, in bucket order, each once."""
        rows = self._rows[(tkey, arch)]
        return list(dict.fromkeys(self.entry(tkey, arch, b).variant for b in sorted(rows)))

    def entries(self) -> Iterator[tuple[str, str, TableEntry]]:
        """(types key, arch, entry) of every bucket, sorted by types key, arch and bucket."""
        for tkey, arch in sorted(self._rows):
            for bucket in sorted(self._rows[(tkey, arch)]):
                yield tkey, arch, self.entry(tkey, arch, bucket)

    def to_json(self) -> dict[str, Any]:
        select: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for (tkey, arch), rows in self._rows.items():
            select.setdefault(tkey, {})[arch] = [self.entry(tkey, arch, b).to_json() for b in rows]
        return {**self.decl.to_json(), "variants": {vid: v.to_json() for vid, v in self.variants.items()}, "select": select}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> KernelTable:
        """A kernel's table from its JSON; KeyError, TypeError or ValueError for a malformed one."""
        variants = {str(vid): Variant.from_json(v) for vid, v in data["variants"].items()}
        return cls(KernelDecl.from_json(name, data), variants, data["select"])


def _bucket_of(entry: TableEntry | Mapping[str, Any]) -> tuple[int, ...]:
    return entry.bucket if isinstance(entry, TableEntry) else tuple(int(b) for b in entry["bucket"])
