"""The lock file: its schema version, `LockFile` (entries by id), the build's lenient reader and
the command's strict one, the writer, and the validity rule every stage applies to an entry.

JSON with a schema version, sorted keys, atomic replace. A corrupt or foreign file is a warning
and a miss for a build, never a crash, never silently trusted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import UnreadableFile, atomic_write, one_writer, read_regular, replaced_file
from ..runtime import load_json, short_repr
from .entry import LockEntry
from .errors import LockFormatError
from .ids import EntryId
from .nvrtc_policy import NvrtcPolicy

LOCK_SCHEMA = 1
# The largest lock file read (the build, `tune` and the command alike): far above any real one
# (an entry is about 10 KB with a hundred measurements: some 25,000 such entries), small enough
# that a huge file or a link to a device cannot fill the reader's memory.
LOCK_FILE_LIMIT = 256 << 20


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
    def load(cls, path: Path) -> LockFile:
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
    def parse(cls, data: Any, label: str, strict: bool = True) -> LockFile:
        """Decoded JSON to entries. Strict: the first problem is a LockFormatError; else each
        problem is a warning, and the file or entry it concerns is ignored."""
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or "schema" not in data:
            return _refuse(f'{label}: not a hatch-autotune lock file (expected a JSON object with "schema" and "entries")', strict)
        schema = data["schema"]
        if not isinstance(schema, int) or isinstance(schema, bool):
            return _refuse(f"{label}: lock file has no valid schema version (got {schema!r})", strict)
        if schema > LOCK_SCHEMA:
            from .. import __version__

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
    def _merged_into(cls, path: Path) -> LockFile:
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
