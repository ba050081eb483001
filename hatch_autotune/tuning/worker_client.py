"""The parent's side of the tuning worker: `WorkerClient` starts the child process and speaks to it.

Isolation: variants are measured in a worker subprocess, spoken to in JSON lines. An illegal
memory access poisons a CUDA context for good, an abort kills a process, and a hang never
returns; so the GPU work happens in a child process (worker.py, run as `python -m
hatch_autotune.tuning.worker`, owns one device). The parent turns a crash or a timeout into a
failed measurement with its reason (`WorkerDied`), starts a fresh worker and goes on.

The messages, one JSON object per line each way, are protocol.py's.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any


class WorkerDied(RuntimeError):
    """The worker crashed, hung past its timeout, or reported a fatal CUDA error."""


def worker_command() -> list[str]:
    return [sys.executable, "-m", "hatch_autotune.tuning.worker"]


class WorkerClient:
    """Parent side: one worker process, restarted on demand after it dies."""

    def __init__(self, command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.command = command or worker_command()
        self.env = env
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()  # the worker's reply lines; None: it is gone
        self._stderr: Any = None
        self.restarts = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the client owns it until close())
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
            start_new_session=True,  # its own process group, so a kill takes its children too
            text=True,
            bufsize=1,
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None  # started with stdout=PIPE
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the worker is gone

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; WorkerDied when the worker does not answer."""
        if not self.alive:
            if self._proc is not None:
                self.restarts += 1
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._death_reason()) from None
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self._kill()
            raise WorkerDied(f"timed out after {timeout:g} s (hang?); the worker was killed") from None
        if line is None:
            raise WorkerDied(self._death_reason())
        try:
            reply: dict[str, Any] = json.loads(line)  # one JSON object per line (protocol.py)
        except ValueError:
            self._kill()
            raise WorkerDied(f"sent an unreadable reply: {line[:200]!r}") from None
        if reply.get("fatal"):
            self._kill()
            raise WorkerDied(reply.get("error", "fatal CUDA error"))
        return reply

    def _death_reason(self) -> str:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self._proc.returncode
        if code is not None and code < 0:
            try:
                what = f"signal {signal.Signals(-code).name}"
            except ValueError:
                what = f"signal {-code}"
        else:
            what = f"exit code {code}"
        return f"crashed ({what}){self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f": {tail}" if tail else ""

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self._proc.stdin.close()  # type: ignore[union-attr]
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self._kill()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
