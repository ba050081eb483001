"""Content-addressed on-disk store for compiled binaries.

The store is `<root>/v<schema>/<first 2 hex of key>/`; an entry there is `<key>.bin` (the
binary) plus `<key>.json` (metadata with the binary's sha256), both written atomically (temp
file + os.replace), the JSON last so that its presence commits the entry. A missing, truncated,
corrupt or foreign entry is a miss, never an error. Anything else in the store was not written
here (`foreign_path`), and `clear` deletes nothing while it is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..runtime import load_json

CACHE_SCHEMA = 1

# What `_paths` and `atomic_write` put in the store: <2 hex>/<64 hex>.json|.bin, and the temp
# file `.<name>.<random>.tmp` of a write in progress (or one a killed process left behind).
_SHARD = re.compile(r"[0-9a-f]{2}")
_STORE_FILE = re.compile(r"([0-9a-f]{64}\.(json|bin)|\.[0-9a-f]{64}\.(json|bin)\.[^/]*\.tmp)")


def default_cache_dir() -> Path:
    """HATCH_AUTOTUNE_CACHE_DIR, else the platform's user cache directory."""
    env = os.environ.get("HATCH_AUTOTUNE_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("hatch-autotune"))


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
    """get/put of (metadata, binary) by a hex key; see the module docstring for the layout."""

    def __init__(self, root: Path):
        self.root = Path(root) / f"v{CACHE_SCHEMA}"
        self.write_error: str | None = None  # set (and writing stops) when the store is not writable

    def _paths(self, key: str) -> tuple[Path, Path]:
        d = self.root / key[:2]
        return d / f"{key}.json", d / f"{key}.bin"

    def get(self, key: str) -> tuple[dict[str, Any], bytes | None] | None:
        meta_path, bin_path = self._paths(key)
        try:
            meta = load_json(meta_path.read_bytes())
            if not isinstance(meta, dict) or meta.get("schema") != CACHE_SCHEMA or meta.get("key") != key:
                return None
            digest = meta.get("binary_sha256")
            if digest is None:
                return meta, None
            binary = bin_path.read_bytes()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(binary).hexdigest() != digest:
            return None
        return meta, binary

    def put(self, key: str, meta: dict[str, Any], binary: bytes | None) -> None:
        """Store an entry; a store that cannot be written (read-only, full) is a warning, not a
        failed build: the first error is kept in `write_error` and later puts are skipped."""
        if self.write_error is not None:
            return
        meta_path, bin_path = self._paths(key)
        record = dict(meta, schema=CACHE_SCHEMA, key=key)
        record["binary_sha256"] = hashlib.sha256(binary).hexdigest() if binary is not None else None
        try:
            if binary is not None:
                atomic_write(bin_path, binary)
            atomic_write(meta_path, json.dumps(record, sort_keys=True).encode())
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
