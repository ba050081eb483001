"""The lock written as a tuning run goes: each bucket's entry is on disk soon after it is tuned,
so that an interrupted run resumes where it stopped, without the GPUs waiting for the disk."""

from __future__ import annotations

import threading
from pathlib import Path

from ..files import replaced_file
from ..lock import LockEntry, LockFile
from .errors import TuningError


class LockSaver:
    """Saves the lock as results arrive without holding up the GPUs: the slot that finished a
    bucket goes on at once, and this thread writes the newest state (results that arrive during
    a write go into the next one, so it never falls behind by more than one write). `close`
    waits for the last write; a write that failed is raised there, and `put` raises it too, so
    that the run stops rather than tune what it cannot keep.

    Each write puts this run's own entries over the file as it is then (LockFile.save_entries,
    under a file lock), not the whole lock as the run read it: another run tuning other kernels
    of the same lock at the same time keeps its entries, whichever run writes last."""

    def __init__(self, lock: LockFile, path: Path):
        try:
            replaced_file(path)  # a pipe or device in the lock's place: refused before any GPU time
        except OSError as exc:
            raise TuningError(f"cannot save {path}: it {exc}") from None
        self.lock, self.path = lock, path
        self._mine: dict[str, LockEntry] = {}  # the entries this run put
        self._cond = threading.Condition()
        self._changes = self._saved = 0
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="hatch-autotune-lock", daemon=True)
        self._thread.start()

    def put(self, eid: str, entry: LockEntry) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            self.lock.entries[eid] = entry
            self._mine[eid] = entry
            self._changes += 1
            self._cond.notify_all()

    def _write(self) -> None:
        while True:
            with self._cond:
                while self._changes == self._saved and not self._closing:
                    self._cond.wait()
                if self._changes == self._saved:
                    return
                changes, mine = self._changes, dict(self._mine)
            try:
                LockFile.save_entries(self.path, mine)
            except BaseException as exc:
                with self._cond:
                    self._error = TuningError(f"cannot save {self.path}: {exc}")
                return
            with self._cond:
                self._saved = changes

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
