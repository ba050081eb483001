"""The lock file (tuning database): per kernel, type instance, arch and bucket, the chosen config,
every measurement, the provenance, and a checksum of everything that makes the entry valid.

A package author tunes on a GPU builder and commits this file; a builder without a GPU then
takes the winners from entries whose checksum still matches and produces the same wheel byte
for byte. JSON with a schema version, sorted keys, atomic replace. A corrupt or foreign file is
a warning and a miss, never a crash, never silently trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .declare.config import KernelSpec
from .errors import BuildError
from .files import UnreadableFile, atomic_write, one_writer, read_regular, replaced_file
from .runtime import MAX_SIZE, load_json, short_repr

LOCK_SCHEMA = 1
# The largest lock file read (the build, `tune` and the command alike): far above any real one
# (an entry is about 10 KB with a hundred measurements: some 25,000 such entries), small enough
# that a huge file or a link to a device cannot fill the reader's memory.
LOCK_FILE_LIMIT = 256 << 20


class LockFormatError(BuildError):
    """A lock file or entry that a strict reader refuses; the message names the file and why."""


# fullmatch: no trailing newline; ASCII digits only, and at most MAX_SIZE's 19 of them, so that a
# huge number is refused here rather than by int() (whose limit is 4300 digits, as a ValueError)
_BUCKET_ITEM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9]{1,19})")


@dataclass(frozen=True)
class Bucket:
    """A point of a kernel's key space where tuning happens: each key dim's value, in the
    kernel's key order. The one type of a bucket in the lock, the plan, the tuner and the
    worker; its other forms are conversions: `as_dict` (what expressions and inputs read),
    `values` (the selection table's row and the plan's key), `str` ('m=1024,n=64', the entry
    id's part, read back by `parse`)."""

    dims: tuple[tuple[str, int], ...]  # ((name, value), ...), in key order

    @classmethod
    def of(cls, values: "Bucket | Mapping[str, int]") -> "Bucket":
        """The bucket of a {dim: value} mapping (in its order), or the bucket itself."""
        if isinstance(values, Bucket):
            return values
        return cls(tuple((k, int(v)) for k, v in values.items()))

    @classmethod
    def from_values(cls, names: Sequence[str], values: Sequence[int]) -> "Bucket":
        """The bucket of the key dims `names` at `values` (the table's and the planner's form)."""
        if len(names) != len(values):
            raise ValueError(f"{len(values)} bucket values for {len(names)} key dims ({', '.join(names)})")
        return cls(tuple((k, int(v)) for k, v in zip(names, values)))

    @classmethod
    def parse(cls, text: str) -> "Bucket":
        """'m=1024,n=64' back to its bucket; LockFormatError if it is not that form, or a value
        is beyond a key's range (MAX_SIZE either way)."""
        items = [_BUCKET_ITEM.fullmatch(item) for item in text.split(",")]
        dims = tuple((m.group(1), int(m.group(2))) for m in items if m)
        if len(dims) != len(items) or any(abs(v) > MAX_SIZE for _, v in dims):
            raise LockFormatError(f"bucket {short_repr(text)} is not 'dim=value,...' with integer values from -{MAX_SIZE} to {MAX_SIZE}")
        return cls(dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.dims)

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(v for _, v in self.dims)

    def as_dict(self) -> dict[str, int]:
        return dict(self.dims)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.dims)


@dataclass(frozen=True)
class EntryId:
    """Where an entry sits in the lock: kernel, type instance, arch and bucket. Written as
    'saxpy|T=float32|sm_90|n=4096' (readable, and sorts by kernel); `parse` is its one reader."""

    kernel: str
    types: str  # types key: 'T=float32', or '-' for a kernel without type parameters
    arch: str
    bucket: Bucket

    @classmethod
    def of(cls, kernel: str, types: str, arch: str, bucket: Bucket | Mapping[str, int]) -> "EntryId":
        return cls(kernel, types, arch, Bucket.of(bucket))

    @property
    def instance(self) -> str:
        """'saxpy|T=float32|sm_90': the type instance on an arch, for messages about all its buckets."""
        return f"{self.kernel}|{self.types}|{self.arch}"

    def __str__(self) -> str:
        return f"{self.instance}|{self.bucket}"

    @classmethod
    def parse(cls, text: Any) -> "EntryId":
        parts = text.split("|") if isinstance(text, str) else []
        if len(parts) == 4 and all(parts[:3]):
            try:
                return cls(parts[0], parts[1], parts[2], Bucket.parse(parts[3]))
            except LockFormatError:
                pass
        raise LockFormatError(f"entry id {short_repr(text)} is not 'kernel|types|arch|dim=value,...'")


def entry_checksum(
    spec: KernelSpec,
    types_key: str,
    source_hashes: Sequence[str],
    arch: str,
    bucket: Bucket | Mapping[str, int],
) -> str:
    """Hash of what a measurement and its winner depend on: the variant sources (so the template
    and the space), the compile options, the arguments, how key dims are read, the launch
    geometry, what verification compares against, the search, the arch and bucket.
    Expressions enter as parsed trees, so reformatting one does not invalidate the lock; the
    bucket mapping does not enter (it decides which bucket a call uses, not what was measured).
    Nor does the NVRTC version: the dependency allows any 13.x, and a builder that resolved
    another one must not lose every winner; NvrtcPolicy decides what a version change does."""
    from .compile.nvrtc import CompileJob

    blob = {
        "kernel": spec.name,
        "entry": spec.entry,
        "types": types_key,
        "sources": list(source_hashes),
        "options": CompileJob("", arch, spec.entry, spec.nvrtc_options).full_options(),
        "args": [
            [a.name, a.dtype, [e.tree for e in a.shape] if a.shape else None, a.intent, a.value.tree if a.value else None]
            for a in spec.args
        ],
        "key": [[k.name, k.source, k.axis] for k in spec.key],
        "launch": [[e.tree for e in spec.grid], [e.tree for e in spec.block], spec.shared.tree],
        "verification": [spec.reference, spec.inputs, list(spec.tolerance) if spec.tolerance else None],
        "search": spec.search.checksum_fields(),
        "arch": arch,
        "bucket": Bucket.of(bucket).as_dict(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


TIMED = ("ok", "eliminated")  # measurement statuses that carry a median time
RECORDED_DIGITS = 6  # times are kept to 1 ns (in ms)


def recorded(ms: float | None) -> float | None:
    """A time as the lock keeps it: to 1 ns."""
    return None if ms is None else round(ms, RECORDED_DIGITS)


def _number(value: Any) -> float | None:
    """The number as written (an int stays an int, so a re-written file keeps its bytes)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: Any) -> int | None:
    """The integer as written; None for anything else (a bool is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Measurement:
    """What happened to one config in one bucket, as the lock records it: the tuner makes it,
    the lock keeps it, the planner, the warm starts and the inspection read it. `from_json`
    and `to_json` are its one reader and writer; the reader takes what a lenient lock reader
    accepted (a field that is absent or of the wrong type reads as not recorded)."""

    index: int | None  # the config's position in the instance's canonical config list
    config: Mapping[str, Any]
    status: str  # ok | eliminated | rejected | failed | pruned | skipped ("" if not recorded)
    samples: int | None = 0  # how many timings the median is of (None: not recorded)
    median_ms: float | None = None
    spread_ms: float | None = None  # half the interquartile range of the timings
    reason: str = ""  # why it was not timed, or a note (the reference)

    @property
    def timed(self) -> bool:
        """Whether it carries a median time (ok, or eliminated early)."""
        return self.status in TIMED and self.median_ms is not None

    def as_recorded(self) -> "Measurement":
        """The record as the lock file keeps it: its times rounded to 1 ns."""
        return dataclasses.replace(self, median_ms=recorded(self.median_ms), spread_ms=recorded(self.spread_ms))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Measurement":
        index, samples, status, reason = raw.get("index"), raw.get("samples"), raw.get("status"), raw.get("reason")
        return cls(
            index=_integer(index),
            config=dict(raw["config"]),
            status=status if isinstance(status, str) else "",
            samples=_integer(samples),
            median_ms=_number(raw.get("median_ms")),
            spread_ms=_number(raw.get("spread_ms")),
            reason=reason if isinstance(reason, str) else "",
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.index is None else {"index": self.index}
        out.update(config=dict(self.config), status=self.status)
        if self.samples is not None:
            out["samples"] = self.samples
        if self.median_ms is not None:
            out["median_ms"] = self.median_ms
        if self.spread_ms is not None:
            out["spread_ms"] = self.spread_ms
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Contender:
    """A config the search could not tell apart from its leader, timed again in the runoff
    (tuning/choice.py): its median in the search and over the runoff's rounds."""

    index: int | None
    search_ms: float | None
    median_ms: float | None
    spread_ms: float | None = None
    samples: int | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Contender":
        index, samples = raw.get("index"), raw.get("samples")
        return cls(
            index=_integer(index),
            search_ms=_number(raw.get("search_ms")),
            median_ms=_number(raw.get("median_ms")),
            spread_ms=_number(raw.get("spread_ms")),
            samples=_integer(samples),
        )

    def to_json(self) -> dict[str, Any]:
        out = {"index": self.index, "search_ms": recorded(self.search_ms), "median_ms": recorded(self.median_ms)}
        if self.spread_ms is not None:
            out["spread_ms"] = recorded(self.spread_ms)
        if self.samples is not None:
            out["samples"] = self.samples
        return out


@dataclass(frozen=True)
class Runoff:
    """How a bucket's winner was chosen among its contenders: the rounds of interleaved timing,
    each contender (fastest first), and the margin: the runner-up's median over the winner's,
    minus one (0.01: the runner-up is 1% slower; below 0 where the canonical config of a
    near-tie was chosen over a marginally faster one)."""

    rounds: int
    contenders: tuple[Contender, ...]
    margin: float | None
    rounds_won: int | None = None  # rounds in which the winner's median was the fastest

    @classmethod
    def from_json(cls, raw: Any) -> "Runoff | None":
        """The record, or None for one this reader cannot use (a lenient reader: the runoff is
        an explanation, the winner stands without it)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("contenders"), list):
            return None
        rounds, won = raw.get("rounds"), raw.get("rounds_won")
        return cls(
            rounds=_integer(rounds) or 0,
            contenders=tuple(Contender.from_json(c) for c in raw["contenders"] if isinstance(c, dict)),
            margin=_number(raw.get("margin")),
            rounds_won=_integer(won),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rounds": self.rounds, "contenders": [c.to_json() for c in self.contenders]}
        out["margin"] = recorded(self.margin)
        if self.rounds_won is not None:
            out["rounds_won"] = self.rounds_won
        return out


@dataclass(frozen=True)
class LockEntry:
    """One tuned point: the winning config, every measurement, where it was measured, and the
    checksum of what it depends on. `from_json` and `to_json` are its one reader and writer."""

    checksum: str
    config: Mapping[str, Any]
    tuned: bool
    index: int | None = None  # the winner's position in the canonical config list
    default: Mapping[str, Any] | None = None  # the kernel's default config when it was tuned
    default_ms: float | None = None  # the default's median time
    measurements: tuple[Measurement, ...] = ()  # one per config, in canonical order
    provenance: Mapping[str, Any] = field(default_factory=dict)
    runoff: Runoff | None = None  # how the winner was chosen among near-ties (None: no runoff)
    read_from: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # the JSON it was read from

    @classmethod
    def from_json(cls, raw: Any) -> "LockEntry":
        """The entry, or LockFormatError saying what is malformed."""
        problem = _entry_problem(raw)
        if problem:
            raise LockFormatError(problem)
        return cls(
            checksum=raw["checksum"],
            config=dict(raw["config"]),
            tuned=raw["tuned"],
            index=raw.get("index"),
            default=dict(raw["default"]) if isinstance(raw.get("default"), dict) else None,
            default_ms=_number(raw.get("default_ms")),
            measurements=tuple(Measurement.from_json(m) for m in raw.get("measurements", [])),
            provenance=dict(raw.get("provenance", {})),
            runoff=Runoff.from_json(raw.get("runoff")),
            read_from=raw,
        )

    def to_json(self) -> dict[str, Any]:
        """The entry's JSON; an entry read from a file and not changed since is written back as
        it was read (keys a newer writer added, and number formats, survive a re-save)."""
        if self.read_from is not None and LockEntry.from_json(self.read_from) == self:
            return json.loads(json.dumps(self.read_from))
        out: dict[str, Any] = {"checksum": self.checksum, "config": dict(self.config), "tuned": self.tuned}
        if self.index is not None:
            out["index"] = self.index
        if self.default is not None:
            out["default"] = dict(self.default)
        if self.default is not None or self.default_ms is not None:
            out["default_ms"] = self.default_ms
        if self.measurements:
            out["measurements"] = [m.to_json() for m in self.measurements]
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        if self.runoff is not None:
            out["runoff"] = self.runoff.to_json()
        return out

    def time_of(self, config: Mapping[str, Any]) -> float | None:
        """The median time measured for `config` (a fully timed run before an eliminated one)."""
        times = [
            (m.status != "ok", m.median_ms) for m in self.measurements if m.timed and m.median_ms is not None and m.config == dict(config)
        ]
        return min(times)[1] if times else None

    @property
    def winner_ms(self) -> float | None:
        return self.time_of(self.config)


def _entry_problem(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return "not an object"
    if not isinstance(raw.get("checksum"), str):
        return "no checksum"
    if not isinstance(raw.get("config"), dict):
        return "no config"
    if not isinstance(raw.get("tuned"), bool):
        return "no tuned flag"
    if raw.get("index") is not None and (not isinstance(raw["index"], int) or isinstance(raw["index"], bool)):
        return "index is not an integer"
    if raw.get("default") is not None and not isinstance(raw["default"], dict):
        return "default is not an object"
    if not isinstance(raw.get("provenance", {}), dict):
        return "provenance is not an object"
    if raw.get("runoff") is not None and Runoff.from_json(raw["runoff"]) is None:
        return "runoff is not an object with a list of contenders"
    ms = raw.get("measurements", [])
    if not isinstance(ms, list) or not all(isinstance(m, dict) and isinstance(m.get("config"), dict) for m in ms):
        return "measurements are not a list of objects with a config"
    if raw.get("default_ms") is not None and _number(raw["default_ms"]) is None:
        return "default_ms is not a number"
    return None


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

    def problem(self, entry: LockEntry) -> str | None:
        """Why exact-nvrtc refuses this (tuned, checksum-valid) entry; None if it does not."""
        version = tuned_with(entry.provenance)
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
    """The entries of a lock file by id, plus the warnings met while reading it. `load` is the
    build's reader (a corrupt or foreign file or entry is a warning and a miss); `parse` with
    strict=True is the command's (anything malformed is a LockFormatError; the command reads
    the file itself, as it does every JSON file it is given). Both refuse a newer schema, which
    a build must not overwrite with an older one."""

    entries: dict[str, LockEntry] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> "LockFile":
        """The build's reader: a regular file of at most LOCK_FILE_LIMIT bytes (a pipe would hang
        the build, a device fill its memory); any other is a warning and no entries."""
        if not path.exists():
            return cls()
        try:
            data = load_json(read_regular(path, LOCK_FILE_LIMIT))
        except UnreadableFile as exc:
            return cls(warnings=[f"{path}: lock file {exc}; ignoring it"])
        except (OSError, ValueError) as exc:
            return cls(warnings=[f"{path}: lock file is unreadable or not JSON ({exc}); ignoring it"])
        return cls.parse(data, str(path), strict=False)

    @classmethod
    def parse(cls, data: Any, label: str, strict: bool = True) -> "LockFile":
        """Decoded JSON to entries. Strict: the first problem is a LockFormatError; else each
        problem is a warning, and the file or entry it concerns is ignored."""
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or "schema" not in data:
            return _refuse(f'{label}: not a hatch-autotune lock file (expected a JSON object with "schema" and "entries")', strict)
        schema = data["schema"]
        if not isinstance(schema, int) or isinstance(schema, bool):
            return _refuse(f"{label}: lock file has no valid schema version (got {schema!r})", strict)
        if schema > LOCK_SCHEMA:
            from . import __version__

            raise LockFormatError(
                f"{label}: lock file schema {schema} is newer than this hatch-autotune {__version__} reads "
                f"(schema {LOCK_SCHEMA}); upgrade hatch-autotune (the file is left as it is)"
            )
        if schema != LOCK_SCHEMA:
            return _refuse(f"{label}: lock file schema {schema} is not supported (this hatch-autotune reads schema {LOCK_SCHEMA})", strict)
        out = cls()
        for eid, raw in data["entries"].items():
            try:
                EntryId.parse(eid)
                out.entries[eid] = LockEntry.from_json(raw)
            except LockFormatError as exc:
                message = f"{label}: entry {short_repr(eid)} is malformed ({exc})"
                if strict:
                    raise LockFormatError(message) from None
                out.warnings.append(f"{message}; ignoring it")
        return out

    def to_json(self) -> bytes:
        entries = {eid: e.to_json() for eid, e in self.entries.items()}
        return (json.dumps({"schema": LOCK_SCHEMA, "entries": entries}, sort_keys=True, indent=1) + "\n").encode()

    def save(self, path: Path) -> None:
        """Replace the file (a symlink's target: the link stays a link)."""
        atomic_write(replaced_file(path), self.to_json())

    @classmethod
    def save_entries(cls, path: Path, entries: Mapping[str, LockEntry]) -> None:
        """Put `entries` into the lock file at `path` over what it holds now: re-read, merged
        and replaced under the writers' lock (files.one_writer), so that two runs tuning one
        lock (two kernels, two terminals) each keep what the other wrote meanwhile. A file on
        disk that is not a readable lock file of this schema is a LockFormatError and is left as
        it is (corrupt mid-run, by a merge conflict or a half copy: this run's entries alone
        would replace all of its); a malformed entry in it is dropped, as a build ignores it."""
        target = replaced_file(path)
        with one_writer(target):
            lock = cls._merged_into(target)
            lock.entries.update(entries)
            atomic_write(target, lock.to_json())

    @classmethod
    def _merged_into(cls, path: Path) -> "LockFile":
        if not path.exists():
            return cls()
        try:
            data = load_json(read_regular(path, LOCK_FILE_LIMIT))
        except (OSError, ValueError) as exc:
            raise LockFormatError(f"{path}: lock file is unreadable or not JSON ({exc}); not overwriting it") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise LockFormatError(f"{path}: not a hatch-autotune lock file any more; not overwriting it")
        cls.parse({**data, "entries": {}}, str(path))  # its schema, strictly
        return cls.parse(data, str(path), strict=False)

    def problem(self, eid: str, checksum: str, policy: NvrtcPolicy | None = None) -> str | None:
        """Why the entry cannot be used (absent, stale, untuned, or refused by exact-nvrtc), or
        None when it can: the one validity rule of the build, `tune` and `show`."""
        entry = self.entries.get(eid)
        if entry is None:
            return "no lock entry"
        if entry.checksum != checksum:
            return "stale lock entry (checksum mismatch)"
        if not entry.tuned:
            return "lock entry is untuned"
        return policy.problem(entry) if policy else None

    def valid(self, eid: str, checksum: str, policy: NvrtcPolicy | None = None) -> LockEntry | None:
        """The entry if it can be used (see problem); else None."""
        return None if self.problem(eid, checksum, policy) else self.entries[eid]


def _refuse(message: str, strict: bool) -> LockFile:
    if strict:
        raise LockFormatError(message)
    return LockFile(warnings=[f"{message}; ignoring it"])


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
