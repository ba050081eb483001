"""Files written so that readers see the old content or the new, never a mix (the lock, the
compile cache, the command's outputs), and files read so that a pipe, a device or a huge file
cannot hang the reader or fill its memory."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class UnreadableFile(OSError):
    """A file `read_regular` refuses: not a regular file, or larger than the reader's bound.
    An OSError, so that every reader's existing "cannot read it" path reports it."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file (after symlinks) of at most `limit` bytes.

    Opened without blocking, so that a named pipe with no writer does not hang the open; the
    kind and size are checked on the opened descriptor (no race with a swap of the name), and
    the read stops at `limit` + 1 bytes in case the file grows meanwhile."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise UnreadableFile(f"is {kind}, expected a regular file")
        if st.st_size > limit:
            raise UnreadableFile(f"is {st.st_size} bytes, more than the {limit} bytes read from such a file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableFile(f"grew past {limit} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


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
