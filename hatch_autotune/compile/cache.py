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
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write, read_regular
from ..runtime import load_json
from .entry import CACHE_SCHEMA, MAX_METADATA_BYTES, CacheEntry

if TYPE_CHECKING:
    from .remote_cache import RemoteCache

# What `_paths` and `atomic_write` put in the store: <2 hex>/<64 hex>.json|.bin, and the temp
# file `.<name>.<random>.tmp` of a write in progress (or one a killed process left behind).
_SHARD = re.compile(r"[0-9a-f]{2}")
_STORE_FILE = re.compile(r"([0-9a-f]{64}\.(json|bin)|\.[0-9a-f]{64}\.(json|bin)\.[^/]*\.tmp)")
_ASIDE_PREFIX = ".cleared-"  # `clear` renames <root>/v<schema> to <root>/.cleared-v<schema>-<pid>-<random>, then deletes it
_WRITE_ATTEMPTS = 3  # a put that `clear` interrupts is written again, into the new store


def _delete_tree(path: Path) -> None:
    """Delete a store renamed aside. A write that had begun in it before the rename may still
    add a temp file while it is deleted: try again a few times; what then remains is no race
    (a permission, say) and raises."""
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05)
    shutil.rmtree(path)


def _read_binary(path: Path, size: int) -> bytes:
    """An entry's binary: a regular file of exactly `size` bytes (its record says how many);
    OSError (files.read_regular) or ValueError otherwise."""
    data = read_regular(path, size)
    if len(data) != size:
        raise ValueError(f"{path} has {len(data)} bytes, expected {size}")
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
            record = load_json(read_regular(meta_path, MAX_METADATA_BYTES))
            return CacheEntry.from_record(record, key, lambda size: _read_binary(bin_path, size))
        except (OSError, ValueError):  # load_json: ValueError for any text that is not JSON
            return None

    def _put_local(self, key: str, entry: CacheEntry) -> None:
        """A store that cannot be written (read-only, full) is a warning, not a failed build:
        the first error is kept in `write_error` and later writes are skipped."""
        if self.write_error is not None:
            return
        meta_path, bin_path = self._paths(key)
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                if entry.binary is not None:
                    atomic_write(bin_path, entry.binary)
                atomic_write(meta_path, entry.metadata(key))  # (its folder made anew if `clear` moved the store)
                if entry.binary is None or bin_path.exists():
                    return
                # `cache clear` moved the store between the two writes: the binary went with it,
                # and the record alone (a miss to every reader) is in a new store; write both there
            except (FileNotFoundError, FileExistsError) as exc:
                # `cache clear` moved the store away mid-write: write it into a new one. (mkdir says
                # "File exists" when the shard it found is moved away before it looks again.)
                if attempt + 1 == _WRITE_ATTEMPTS:
                    self.write_error = f"cannot write the compile cache at {self.root} ({exc}); going on without it"
            except OSError as exc:
                self.write_error = f"cannot write the compile cache at {self.root} ({exc}); going on without it"
                return

    def foreign_path(self) -> Path | None:
        """The first path in the store that hatch-autotune did not write (the store itself when
        it is a symbolic link or not a directory), or None: an absent store, or one holding only
        entries and temp files. Never delete someone's files."""
        return CompileCache._foreign_in(self.root)

    @staticmethod
    def _foreign_in(store: Path) -> Path | None:
        """`foreign_path` of the store at `store`. What vanishes while it looks (a write's temp
        file renamed into place, a shard another clear took) was no one's file."""
        try:
            if not stat.S_ISDIR(store.lstat().st_mode):
                return store
            shards = list(store.iterdir())
        except FileNotFoundError:
            return None
        for d in shards:
            try:
                if not stat.S_ISDIR(d.lstat().st_mode) or not _SHARD.fullmatch(d.name):
                    return d
                files = list(d.iterdir())
            except FileNotFoundError:
                continue
            for f in files:
                try:
                    mode = f.lstat().st_mode
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(mode) or not _STORE_FILE.fullmatch(f.name):
                    return f
        return None

    def clear(self) -> Path | None:
        """Delete the store, unless `foreign_path` finds something hatch-autotune did not
        write: then delete nothing and return that path. The store is renamed aside first, in
        one step, and deleted there: a build writing meanwhile starts a new store instead of
        refilling the one being deleted (which made the deletion fail half done). Stores that
        an interrupted clear left aside go too."""
        foreign = self.foreign_path()
        if foreign is not None:
            return foreign
        aside = self.root.with_name(f"{_ASIDE_PREFIX}{self.root.name}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.root, aside)
        except FileNotFoundError:
            pass  # no store (or another clear took it)
        else:
            foreign = CompileCache._foreign_in(aside)  # appeared since the first look: put it all back
            if foreign is not None:
                try:
                    os.rename(aside, self.root)
                    return self.root / foreign.relative_to(aside)
                except OSError:  # a build has started a new store meanwhile: leave this one aside, named
                    return foreign
        for old in self.root.parent.glob(f"{_ASIDE_PREFIX}{self.root.name}-*"):
            if CompileCache._foreign_in(old) is None:  # one left holding someone's files stays, as the store would
                _delete_tree(old)
        return None

    def info(self) -> tuple[int, int]:
        """(number of entries, total bytes) of the store, as it is while a build may write to
        it: a temp file renamed, or the store cleared, while counting is not counted."""
        entries = size = 0
        for folder, _, names in os.walk(self.root):  # a folder gone while it is walked is skipped, not the rest
            for name in names:
                try:
                    info = os.stat(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    size += info.st_size
                    entries += name.endswith(".json")
        return entries, size
