"""Files written so that readers see the old content or the new, never a mix (the lock, the
compile cache, the command's outputs), and files read so that a pipe, a device or a huge file
cannot hang the reader or fill its memory."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: writers are not serialised there
    fcntl = None  # type: ignore[assignment]


class UnreadableFile(OSError):
    """A file `read_regular` refuses: not a regular file, or larger than the reader's bound.
    An OSError, so that every reader's existing "cannot read it" path reports it. `found`: what
    the path is when it is no regular file ('a named pipe'), for a reader to say what it expected."""

    def __init__(self, message: str, found: str | None = None):
        super().__init__(message)
        self.found = found


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file (after symlinks) of at most `limit` bytes.

    Opened without blocking, so that a named pipe with no writer does not hang the open; the
    kind and size are checked on the opened descriptor (no race with a swap of the name), and
    the read stops at `limit` + 1 bytes in case the file grows meanwhile."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _kind(st.st_mode)
            raise UnreadableFile(f"is {kind}, expected a regular file", found=kind)
        if st.st_size > limit:
            raise UnreadableFile(f"is {st.st_size} bytes, more than the {limit} bytes read from such a file")
        data = read_capped(lambda n: os.read(fd, n), limit)
        if data is None:
            raise UnreadableFile(f"grew past {limit} bytes while it was read")
        return data
    finally:
        os.close(fd)


def read_capped(read: Callable[[int], bytes], limit: int) -> bytes | None:
    """What `read(n)` gives until its end, in chunks, or None as soon as that is more than
    `limit` bytes: a reader whose size was checked beforehand, but may have grown or lied (a
    file written meanwhile, an archive member's header), never holds more than limit + 1."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = read(min(1 << 20, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


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


def replaced_file(path: Path) -> Path:
    """The file a write to `path` replaces: a symlink's target, so that a linked file stays a
    link (a lock kept elsewhere, or shared by two checkouts); a regular file or none, since a
    pipe or device put in a file's place is the user's and never replaced by a regular file."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        raise UnreadableFile(f"is {kind}, expected a regular file (it is not replaced)", found=kind)
    return target


WRITER_WAIT_S = 120.0  # how long a writer waits for another to finish before giving up
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}  # a filesystem without flock


@contextmanager
def one_writer(path: Path, wait_s: float = WRITER_WAIT_S) -> Iterator[None]:
    """Hold the writers' lock of `path` (of a read, merge and replace that must not interleave
    with another process's): an exclusive flock on a sidecar, `.NAME.writer`, beside the file.
    The file itself cannot carry the lock, as each write replaces it with a new inode; the
    sidecar is in the file's directory, which every writer must be able to write to anyway, and
    is removed by its holder before it lets go, so that none is left beside a committed file. A
    waiter that then finds its sidecar gone, or another in its place, takes the lock anew.
    Raises OSError when another writer holds it for `wait_s` (a writer holds it for one write).
    Where there is no flock (Windows, some network filesystems) writers are not serialised."""
    sidecar = path.with_name(f".{path.name}.writer")
    fd = _lock_sidecar(sidecar, time.monotonic() + wait_s, wait_s) if fcntl is not None else None
    try:
        yield
    finally:
        if fd is not None:
            try:
                os.unlink(sidecar)  # while still holding it: a waiter on this inode sees it gone
            finally:
                os.close(fd)


def _lock_sidecar(sidecar: Path, deadline: float, wait_s: float) -> int | None:
    """The descriptor of `sidecar`, flocked, and still the file of that name; None without flock."""
    while True:
        fd = os.open(sidecar, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(f"another process has been writing it for {wait_s:g} s (it holds {sidecar})") from None
                    time.sleep(0.01)
                except OSError as exc:
                    if exc.errno not in _NO_FLOCK:
                        raise
                    os.close(fd)
                    with suppress(OSError):
                        os.unlink(sidecar)
                    return None
            held = os.fstat(fd)
            if _identity(sidecar) == (held.st_dev, held.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before removed this sidecar: lock the current one


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
