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

`open_compile_cache` is the one place that reads the cache's settings from the environment: the
store's directory and, with HATCH_AUTOTUNE_CACHE_URL, a shared tier in Redis behind it
(remote_cache.py) that a local miss consults and every fresh compile fills.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..runtime import load_json

if TYPE_CHECKING:
    from .remote_cache import RemoteCache

CACHE_SCHEMA = 1

# What `_paths` and `atomic_write` put in the store: <2 hex>/<64 hex>.json|.bin, and the temp
# file `.<name>.<random>.tmp` of a write in progress (or one a killed process left behind).
_SHARD = re.compile(r"[0-9a-f]{2}")
_STORE_FILE = re.compile(r"([0-9a-f]{64}\.(json|bin)|\.[0-9a-f]{64}\.(json|bin)\.[^/]*\.tmp)")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_RECORD_KEYS = frozenset({"schema", "key", "ok", "log", "label", "resources", "binary_size", "binary_sha256", "metadata_sha256"})
MAX_METADATA_BYTES = 4 << 20  # a compile log is kilobytes; a larger file is not an entry and is not read


def _resource_fields() -> frozenset[str]:
    """The field names of compile.Resources, which owns them (it imports this module, so the
    import waits until an entry is checked)."""
    from .compile import Resources

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


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """HATCH_AUTOTUNE_CACHE_DIR (of `env`, default os.environ), else the platform's user cache
    directory."""
    value = (os.environ if env is None else env).get("HATCH_AUTOTUNE_CACHE_DIR")
    if value:
        return Path(value)
    import platformdirs

    return Path(platformdirs.user_cache_dir("hatch-autotune"))


def open_compile_cache(env: Mapping[str, str] | None = None) -> CompileCache:
    """The compile cache a build uses, as the environment (`env`, default os.environ) sets it:
    the store in default_cache_dir(), in front of the Redis that HATCH_AUTOTUNE_CACHE_URL names,
    if any. BuildError for a bad setting (remote_cache.RemoteCache.from_env)."""
    from .remote_cache import RemoteCache

    env = os.environ if env is None else env
    return CompileCache(default_cache_dir(env), remote=RemoteCache.from_env(env))


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes files 0600; a lock file is meant to be shared and committed
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
