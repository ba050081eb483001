"""Content-addressed on-disk store for compiled binaries.

The store is `<root>/v<schema>/<first 2 hex of key>/`; an entry there is `<key>.bin` (the
binary) plus `<key>.json` (metadata: the binary's size and sha256, and a sha256 of its own),
both written atomically (temp file + os.replace), the JSON last so that its presence commits
the entry. `CacheEntry` is the one definition of an entry: what `put` writes and what `get`
accepts. `get` returns exactly what was put, or None (a miss) for anything else: absent, not a
regular file, truncated, corrupt, foreign, of another schema or key, a field missing, unknown or
of the wrong type, metadata or a binary whose size or sha256 differs from the one recorded (an
entry written before the metadata carried its own sha256 is a miss too). It reads no more than
an entry can hold and never raises; the caller compiles again and `put` overwrites the entry.
Anything else in the store was not written here (`foreign_path`), and `clear` deletes nothing
while it is there.

The entry itself is entry.py's; tiers.py puts this store in front of the shared Redis tier.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write
from ..runtime import load_json
from .entry import CACHE_SCHEMA, MAX_METADATA_BYTES, CacheEntry

if TYPE_CHECKING:
    from .remote_cache import RemoteCache

# What `_paths` and `atomic_write` put in the store: <2 hex>/<64 hex>.json|.bin, and the temp
# file `.<name>.<random>.tmp` of a write in progress (or one a killed process left behind).
_SHARD = re.compile(r"[0-9a-f]{2}")
_STORE_FILE = re.compile(r"([0-9a-f]{64}\.(json|bin)|\.[0-9a-f]{64}\.(json|bin)\.[^/]*\.tmp)")


def _read_file(path: Path, limit: int, exact: bool = False) -> bytes:
    """A regular file's bytes; ValueError for anything else (a directory, a FIFO, which would
    block, a device) and for a file of more than `limit` bytes (with `exact`: not of `limit`
    bytes), which is refused before it is read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        wrong_size = (lambda n: n != limit) if exact else (lambda n: n > limit)
        if wrong_size(info.st_size):
            raise ValueError(f"{path} has {info.st_size} bytes, expected {'' if exact else 'at most '}{limit}")
        data = f.read(limit + 1)  # the file may have changed since fstat
        if wrong_size(len(data)):
            raise ValueError(f"{path} changed while it was read")
        return data


class CompileCache:
    """get/put of (metadata, binary) by a hex key; see the module docstring for the layout.
    `remote`: a shared tier that a local miss consults (a hit there is written here too) and
    that every put fills as well."""

    def __init__(self, root: Path, remote: RemoteCache | None = None):
        self.root = Path(root) / f"v{CACHE_SCHEMA}"
        self.remote = remote
        self.write_error: str | None = None  # set (and writing stops) when the store is not writable

    def warnings(self) -> list[str]:
        """What the build log should say, once, about the cache: a store it could not write, a
        shared tier that switched itself off."""
        return [w for w in (self.write_error, self.remote.error if self.remote else None) if w]

    def _paths(self, key: str) -> tuple[Path, Path]:
        d = self.root / key[:2]
        return d / f"{key}.json", d / f"{key}.bin"

    def get(self, key: str) -> CacheEntry | None:
        """The entry put under `key`, from the store or else the shared tier, or None (a miss);
        never raises, whatever the files or the server hold."""
        entry = self._get_local(key)
        if entry is None and self.remote is not None:
            entry = self.remote.get(key)
            if entry is not None:
                self._put_local(key, entry)
        return entry

    def put(self, key: str, entry: CacheEntry) -> None:
        """Store an entry here and in the shared tier. Neither failing fails the build: each
        keeps its first error as a warning (`warnings`) and skips later writes."""
        self._put_local(key, entry)
        if self.remote is not None:
            self.remote.put(key, entry)

    def _get_local(self, key: str) -> CacheEntry | None:
        meta_path, bin_path = self._paths(key)
        try:
            record = load_json(_read_file(meta_path, MAX_METADATA_BYTES))
            return CacheEntry.from_record(record, key, lambda size: _read_file(bin_path, size, exact=True))
        except (OSError, ValueError):  # load_json: ValueError for any text that is not JSON
            return None

    def _put_local(self, key: str, entry: CacheEntry) -> None:
        """A store that cannot be written (read-only, full) is a warning, not a failed build:
        the first error is kept in `write_error` and later writes are skipped."""
        if self.write_error is not None:
            return
        meta_path, bin_path = self._paths(key)
        try:
            if entry.binary is not None:
                atomic_write(bin_path, entry.binary)
            atomic_write(meta_path, entry.metadata(key))
        except OSError as exc:
            self.write_error = f"cannot write the compile cache at {self.root} ({exc}); going on without it"

    def foreign_path(self) -> Path | None:
        """The first path in the store that hatch-autotune did not write (the store itself when
        it is a symbolic link or not a directory), or None: an absent store, or one holding only
        entries and temp files. Never delete someone's files."""
        if self.root.is_symlink() or (self.root.exists() and not self.root.is_dir()):
            return self.root
        if not self.root.exists():
            return None
        for d in self.root.iterdir():
            if d.is_symlink() or not d.is_dir() or not _SHARD.fullmatch(d.name):
                return d
            for f in d.iterdir():
                if f.is_symlink() or not f.is_file() or not _STORE_FILE.fullmatch(f.name):
                    return f
        return None

    def clear(self) -> Path | None:
        """Delete the store, unless `foreign_path` finds something hatch-autotune did not
        write: then delete nothing and return that path."""
        foreign = self.foreign_path()
        if foreign is None and self.root.exists():
            shutil.rmtree(self.root)
        return foreign

    def info(self) -> tuple[int, int]:
        """(number of entries, total bytes) of the store."""
        entries = size = 0
        if self.root.is_dir():
            for p in self.root.rglob("*"):
                if p.is_file():
                    size += p.stat().st_size
                    entries += p.suffix == ".json"
        return entries, size
