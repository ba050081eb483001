"""Compiling ahead of the measurements: an instance's variants compiled for one arch in a
background thread, in the order the search will ask for them, so that the GPU measures one
variant while the next compiles."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..compile import nvrtc as compile_mod
from ..compile.cache import CompileCache
from ..plan.planner import Instance


class VariantBinaries:
    """One instance's variants compiled for one arch on demand, in a background thread: what the
    search asks for first (`request`), then its likely next configs (`prefetch`), so that the
    next binary is usually ready when the current one has been measured. Shared by the
    instance's buckets; compile errors reach `get`."""

    def __init__(self, inst: Instance, arch: str, cache: CompileCache):
        self.inst, self.arch, self.cache = inst, arch, cache
        self.workers = compile_mod.default_workers()
        self.chunk = 2 * self.workers
        self._results: dict[int, compile_mod.CompileResult | BaseException] = {}
        self._queued: set[int] = set()  # asked for or compiling or compiled: never compiled twice
        self._todo: list[int] = []  # asked for: compiled first
        self._guesses: list[int] = []  # the latest prefetch, not asked for yet
        self._running = False
        self._cond = threading.Condition()

    def request(self, indices: Sequence[int]) -> None:
        with self._cond:
            new = [i for i in indices if i not in self._queued]
            self._queued.update(new)
            self._todo.extend(new)
            self._guesses = [i for i in self._guesses if i not in self._queued]  # asked for now: not twice
            self._start()

    def prefetch(self, indices: Sequence[int]) -> None:
        """Compile these when nothing asked for waits; they replace the previous guesses."""
        with self._cond:
            self._guesses = [i for i in indices if i not in self._queued]
            self._start()

    def _start(self) -> None:  # with self._cond held
        if (self._todo or self._guesses) and not self._running:
            self._running = True
            threading.Thread(target=self._work, daemon=True, name="hatch-autotune-compile").start()

    def get(self, index: int) -> compile_mod.CompileResult:
        self.request([index])
        with self._cond:
            self._cond.wait_for(lambda: index in self._results)
            result = self._results[index]
        if isinstance(result, BaseException):
            raise result
        return result

    def file(self, index: int, tmp: Path) -> str:
        """The compiled variant's cubin written where the worker can read it (once per source)."""
        result = self.get(index)
        path = tmp / f"{self.inst.variants[index].source_hash[:16]}.cubin"
        if not path.exists():
            assert result.binary is not None
            path.write_bytes(result.binary)
        return str(path)

    def _work(self) -> None:
        while True:
            with self._cond:
                if self._todo:
                    chunk, self._todo = self._todo[: self.chunk], self._todo[self.chunk :]
                elif self._guesses:  # one round of the pool, so that a request soon gets its turn
                    chunk, self._guesses = self._guesses[: self.workers], self._guesses[self.workers :]
                    self._queued.update(chunk)
                else:
                    self._running = False
                    return
            try:
                results: list[Any] = compile_mod.compile_all([self.inst.compile_job(i, self.arch) for i in chunk], self.cache, self.workers)
            except BaseException as exc:
                results = [exc] * len(chunk)
            with self._cond:
                self._results.update(zip(chunk, results))
                self._cond.notify_all()


class InstanceBinaries:
    """Each (instance, arch)'s VariantBinaries, made once and shared by every slot of this machine."""

    def __init__(self, cache: CompileCache):
        self.cache = cache
        self._made: dict[tuple[int, str], VariantBinaries] = {}
        self._lock = threading.Lock()

    def __call__(self, inst: Instance, arch: str) -> VariantBinaries:
        with self._lock:
            key = (id(inst), arch)
            if key not in self._made:
                self._made[key] = VariantBinaries(inst, arch, self.cache)
            return self._made[key]


class CompareBinaries:
    """The compare kernels (device_verify) for one arch, compiled once per run in a background
    thread from the moment the run starts (NVRTC's content-addressed cache makes a later run's
    compile a lookup), and written once where the worker reads them. A compare kernel that
    does not compile is our bug, not the user's: the bucket then verifies on the host, and the
    log says so once."""

    def __init__(self, arch: str, cache: CompileCache, got_dtypes: Sequence[str], log: Any = None):
        from .device_verify import PAIRS

        self.arch, self.cache, self.log = arch, cache, log
        self.pairs = tuple(p for p in PAIRS if p[0] in set(got_dtypes))  # each output dtype against itself and any wider reference
        self._files: dict[tuple[str, str], str] | None = None
        self._error: str | None = None
        self._done = threading.Event()
        threading.Thread(target=self._compile, daemon=True, name="hatch-autotune-compare").start()

    def _compile(self) -> None:
        from .device_verify import compare_binaries

        try:
            self._binaries = compare_binaries(self.arch, self.pairs, self.cache)
        except Exception as exc:
            self._binaries, self._error = {}, f"{type(exc).__name__}: {exc}"
        self._done.set()

    def files(self, tmp: Path, got_dtypes: Sequence[str]) -> dict[str, str]:
        """'got/expected' -> the cubin file, for the pairs whose `got` is one of `got_dtypes`
        (empty when they did not compile: the worker verifies on the host)."""
        self._done.wait()
        if self._error is not None:
            if self.log is not None:
                self.log(f"warning: the compare kernels do not compile for {self.arch} ({self._error}); verifying on the host")
                self.log = None  # once
            return {}
        out = {}
        for (got, expected), binary in self._binaries.items():
            if got in got_dtypes:
                path = tmp / f"compare-{self.arch}-{got}-{expected}.cubin"
                if not path.exists():
                    path.write_bytes(binary)
                out[f"{got}/{expected}"] = str(path)
        return out
