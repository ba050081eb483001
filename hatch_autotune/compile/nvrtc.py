"""Compiling: NVRTC through cuda-python, per variant and arch, in parallel, with a disk cache.

NVRTC needs no GPU. Through cuda-bindings it only partly releases the GIL (measured here on
2 cores, 40 SGEMM variants: serial 4.4 s, 2 threads 3.1 s, 2 processes 2.4 s), so large batches
go to a pool of processes and small ones run in-process. The pool forks while no CUDA driver is
loaded here; once it is (the build hook on a GPU builder calls cuInit first), forking is unsafe
and the workers come from a forkserver (or are spawned), started so that they do not re-run the
caller's __main__ (missing under `python -`, unguarded in some scripts). ptxas's `-v`
output gives each variant's registers, shared memory and spills, which tuning uses to prune
variants that cannot run. Failures are results (with their log), not exceptions: one broken
branch of a template must not stop the build.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ..declare.settings import read_jobs, read_pch
from ..errors import BuildError
from ..runtime import check_cuda, parse_arch
from . import pch
from .cache import CompileCache
from .entry import CacheEntry, Resources
from .header_set import ResolvedHeaderSet

BASE_OPTIONS = ("--std=c++17",)
# The NVRTC majors a build compiles with: 13 through cuda-bindings (the default), 12 through
# ctypes (nvrtc12.py) for wheels whose cubins must load on CUDA 12 drivers.
NVRTC_MAJORS = (12, 13)
DEFAULT_NVRTC = 13
# What makes two jobs one binary: source, arch, entry, options, headers, header sets' identities
# (CompileJob.binary_key).
BinaryKey = tuple[str, str, str, tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]]


@dataclass(frozen=True)
class CompileJob:
    source: str
    arch: str  # 'sm_90' -> cubin, 'compute_90' -> PTX
    entry: str
    options: tuple[str, ...] = ()
    label: str = ""
    # (name, source) of each header a `#include "name"` of the source (or of a header) reaches:
    # NVRTC gets them by name, so they are part of the cache key like the source itself
    headers: tuple[tuple[str, str], ...] = ()
    # The header sets its `#include <...>` may reach (compile/headers.py), in search order: their
    # identities enter the keys, their include options (paths) only NVRTC's command line.
    header_sets: tuple[ResolvedHeaderSet, ...] = ()
    nvrtc: int = DEFAULT_NVRTC  # the major of the NVRTC that compiles it (the project's `min-cuda`)

    @property
    def is_ptx(self) -> bool:
        return self.arch.startswith("compute_")

    def full_options(self) -> list[str]:
        """The options that decide the binary: what the cache key and the lock checksum hash."""
        opts = [f"--gpu-architecture={self.arch}", *BASE_OPTIONS, *self.options]
        if not self.is_ptx:
            opts.append("--ptxas-options=-v")
        return opts

    def command_line(self, precompiled: bool = False) -> list[str]:
        """What NVRTC is given: full_options() and the header sets' include options (the same
        headers found in another folder make the same binary, so paths stay out of the keys),
        and `-pch` (automatic precompiled headers: the same binary, made faster)."""
        include = [o for s in self.header_sets for o in s.options]
        return [*self.full_options(), *include, *(["-pch", pch.PCH_DIAGNOSTICS] if precompiled and self.header_sets else [])]

    @property
    def header_set_ids(self) -> tuple[str, ...]:
        return tuple(s.identity for s in self.header_sets)

    @property
    def binary_key(self) -> BinaryKey:
        """What makes two jobs one binary (configs that render the same source share it): the
        cache key's fields but the compiler, which one build does not vary."""
        return (self.source, self.arch, self.entry, self.options, self.headers, self.header_set_ids)

    def cache_key(self, compiler: str) -> str:
        blob = json.dumps(
            # entry: the cached resource usage is parsed for this entry's ptxas section
            {"source": self.source, "options": self.full_options(), "compiler": compiler, "arch": self.arch, "entry": self.entry}
            | ({"headers": [list(h) for h in self.headers]} if self.headers else {})  # the keys of header-less jobs stay as they were
            | ({"header_sets": list(self.header_set_ids)} if self.header_sets else {}),
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CompileResult:
    job: CompileJob
    ok: bool
    binary: bytes | None
    log: str
    resources: Resources | None
    cached: bool


_NVRTC_SONAMES = ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
_nvrtc_ready = False


def ensure_nvrtc() -> None:
    """Make libnvrtc loadable where cuda-pathfinder does not look.

    cuda-pathfinder searches site.getsitepackages(); pip's isolated build environments (pip < 24)
    put their packages on sys.path only, so the NVRTC wheel installed there is not found. Loading
    it by path first lets pathfinder find it "already loaded".
    """
    global _nvrtc_ready
    if _nvrtc_ready:
        return
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvrtc")
    except Exception as exc:
        import ctypes
        import sys

        for entry in sys.path:
            for rel in _NVRTC_SONAMES:
                candidate = os.path.join(entry or ".", rel)
                if os.path.isfile(candidate):
                    ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
                    _nvrtc_ready = True
                    return
        raise RuntimeError(
            "hatch-autotune: NVRTC (libnvrtc) not found; install it with `pip install cuda-toolkit[nvrtc]==13.*` "
            f"(it is a dependency of hatch-autotune): {exc}"
        ) from None
    _nvrtc_ready = True


def binding(major: int = DEFAULT_NVRTC) -> Any:
    """The NVRTC of a major, as cuda.bindings.nvrtc's functions: NVRTC 13 through cuda-bindings,
    NVRTC 12 through ctypes (nvrtc12.py); BuildError where it is not installed."""
    if major == 12:
        from . import nvrtc12

        return nvrtc12.load()
    if major != DEFAULT_NVRTC:
        raise BuildError(f"hatch-autotune: no NVRTC {major} (it compiles with NVRTC {' or '.join(map(str, NVRTC_MAJORS))})")
    ensure_nvrtc()
    from cuda.bindings import nvrtc

    return nvrtc


def nvrtc_build(major: int = DEFAULT_NVRTC) -> str:
    """The installed NVRTC wheel's full version (nvrtcVersion() gives only major.minor)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-cuda-nvrtc-cu12",) if major == 12 else ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown-build"


def nvrtc_version(major: int = DEFAULT_NVRTC) -> str:
    """'13.4': this build's compiler, in every cache key, provenance and the table."""
    found, minor = check_cuda(binding(major).nvrtcVersion(), "nvrtcVersion")
    return f"{found}.{minor}"


@functools.cache
def supported_archs(major: int = DEFAULT_NVRTC) -> tuple[int, ...]:
    """The archs the NVRTC of a major compiles for, as numbers (75, 80, ..., 120)."""
    return tuple(check_cuda(binding(major).nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def check_archs(archs: Iterable[str], major: int = DEFAULT_NVRTC) -> None:
    """BuildError, before anything compiles, for a target arch this NVRTC cannot compile for:
    otherwise every variant fails and the build reads as "the default config does not compile"."""
    supported = supported_archs(major)
    unsupported = [a for a in dict.fromkeys(archs) if _arch_number(a) not in supported]
    if unsupported:
        floor = ' (`min-cuda = "12"`: NVRTC 12 knows fewer archs than 13)' if major == 12 else ""
        raise BuildError(
            f"hatch-autotune: NVRTC {nvrtc_version(major)} does not support {', '.join(unsupported)} (a target arch: the table's "
            f"`archs`, HATCH_AUTOTUNE_ARCHS or a GPU here){floor}; it supports {', '.join(f'sm_{n}' for n in supported)}"
        )


def _arch_number(arch: str) -> int | None:
    """'sm_90a' -> 90, 'compute_80' -> 80; None for what is not an arch."""
    try:
        _, major, minor, _ = parse_arch(arch)
    except ValueError:
        return None
    return major * 10 + minor


_PTXAS_PATTERNS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "barriers": re.compile(r"used (\d+) barriers"),
}


def parse_ptxas_log(log: str, entry: str) -> Resources:
    """Resource usage of `entry` from ptxas -v output (the section after its 'Function properties')."""
    start = log.find(f"Function properties for {entry}")
    if start < 0:
        start = log.find(f"Compiling entry function '{entry}'")
    section = log[start:] if start >= 0 else log
    nxt = section.find("Function properties for", 1)
    if nxt > 0 and f"for {entry}" not in section[nxt : nxt + 40 + len(entry)]:
        section = section[:nxt]
    values = {}
    for field, pattern in _PTXAS_PATTERNS.items():
        m = pattern.search(section)
        values[field] = int(m.group(1)) if m else 0
    return Resources(**values)


def _may_use_pch(job: CompileJob) -> bool:
    """A cubin job with header sets. Not PTX: a compile that loads a PCH declares the globals of
    the headers' templates in another order than one that makes it, so which sibling made the
    PCH would show in the PTX's bytes, and a cache key would not say what its PTX is. A cubin's
    symbol table shows the same order (its code does not: seen for llm_kit's staged_scale on
    sm_90a), an equivalent binary that the cache then holds for later builds."""
    return bool(job.header_sets) and not job.is_ptx


def _pch_group(job: CompileJob) -> tuple[tuple[str, ...], str, tuple[str, ...], str]:
    """What jobs share a PCH by: their header sets, arch and options, and the kernel (whose
    variants begin with the same #includes)."""
    return (job.header_set_ids, job.arch, job.options, job.entry)


def compile_one(job: CompileJob, pch_root: str | None = None) -> tuple[bool, bytes | None, str]:
    """Run NVRTC once: (ok, binary, log). Never raises for a compile error. `pch_root`: a folder
    for this process's precompiled headers (compile_all's), None to compile without."""
    nvrtc = binding(job.nvrtc)
    names = [name.encode() for name, _ in job.headers]
    sources = [text.encode() for _, text in job.headers]
    prog = check_cuda(
        nvrtc.nvrtcCreateProgram(job.source.encode(), f"{job.entry}.cu".encode(), len(names), sources, names), "nvrtcCreateProgram"
    )
    try:
        pch_dir = pch.process_pch_dir(pch_root) if pch_root is not None and job.header_sets and pch.pch_allowed() else None
        if pch_dir is not None:
            pch.size_pch_heap(nvrtc)
        opts = [o.encode() for o in job.command_line(pch_dir is not None)]
        if pch_dir is not None:
            opts.append(f"--pch-dir={pch_dir}".encode())
        # Not check_cuda: a compile error is a result (with its log), not an exception.
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if pch_dir is not None:
            pch.grow_pch_heap(nvrtc, prog)
            pch.prune_pch(pch_dir)
        # Output buffers are bytearrays: NVRTC writes into them, and `b" " * 1` (an empty log) is
        # Python's shared one-byte object, which would then read b"\x00" in the whole process.
        log_buf = bytearray(check_cuda(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize"))
        check_cuda(nvrtc.nvrtcGetProgramLog(prog, log_buf), "nvrtcGetProgramLog")
        log = log_buf.rstrip(b"\x00").decode(errors="replace").strip()
        if pch_dir is not None:
            log = pch.without_pch_notes(log)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, None, log or str(result)
        if job.is_ptx:
            buf = bytearray(check_cuda(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize"))
            check_cuda(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            binary = buf.rstrip(b"\x00")
        else:
            binary = bytearray(check_cuda(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize"))
            check_cuda(nvrtc.nvrtcGetCUBIN(prog, binary), "nvrtcGetCUBIN")
        if not binary:  # e.g. a compute_ arch asked for a cubin: NVRTC returns nothing, no error
            return False, None, f"{log}\nNVRTC produced an empty binary for {job.arch}".strip()
        return True, bytes(binary), log
    finally:
        destroyed = nvrtc.nvrtcDestroyProgram(prog)
        if sys.exc_info()[0] is None:  # a failure above is the one to report, not the cleanup's
            check_cuda(destroyed, "nvrtcDestroyProgram")


def compile_all(
    jobs: Sequence[CompileJob],
    cache: CompileCache | None,
    workers: int | None = None,
    on_result: Callable[[CompileResult], None] | None = None,
) -> list[CompileResult]:
    """Compile every job (identical jobs once), taking what the cache has; results in job order.
    BuildError for a job's arch that NVRTC does not support, before anything compiles."""
    majors = sorted({j.nvrtc for j in jobs})
    for major in majors:
        check_archs((j.arch for j in jobs if j.nvrtc == major), major)
    # the patch release too: its binaries may differ
    compilers = {major: f"{nvrtc_version(major)} {nvrtc_build(major)}" for major in majors}
    keys = [j.cache_key(compilers[j.nvrtc]) for j in jobs]
    unique: dict[str, CompileJob] = {}
    for key, job in zip(keys, jobs):
        unique.setdefault(key, job)
    done: dict[str, CompileResult] = {}
    todo: list[tuple[str, CompileJob]] = []
    for key, job in unique.items():
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            resources = Resources(**hit.resources) if hit.resources is not None else None
            done[key] = CompileResult(job, hit.ok, hit.binary, hit.log, resources, True)
            if on_result:
                on_result(done[key])
        else:
            todo.append((key, job))

    n = min(workers or default_workers(), len(todo))
    on_main = threading.current_thread() is threading.main_thread()
    # Precompiled headers for the jobs that have a sibling to reuse one (a kernel's variants for
    # one arch), in a folder removed when the batch is done; siblings side by side, so that a
    # worker's chunk of jobs shares its PCH.
    groups = collections.Counter(_pch_group(job) for _, job in todo if _may_use_pch(job))
    with pch.pch_folder(on_main and read_pch() and any(c > 1 for c in groups.values())) as pch_root:
        if pch_root is not None:
            todo.sort(key=lambda item: (bool(item[1].header_sets), _pch_group(item[1])))
        todo_jobs = [job for _, job in todo]
        pch_roots = [pch_root if _may_use_pch(job) and groups[_pch_group(job)] > 1 else None for job in todo_jobs]
        if n > 1 and len(todo) >= PARALLEL_THRESHOLD and on_main:
            method = start_method()
            with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context(method)) as pool:
                # The workers start inside map(), as it submits the chunks.
                with contextlib.nullcontext() if method == "fork" else _main_left_alone():
                    outputs = pool.map(compile_one, todo_jobs, pch_roots, chunksize=max(1, min(8, len(todo) // (4 * n))))
                _collect(todo, outputs, cache, done, on_result)
        elif n > 1:
            # Forking while other threads hold locks can deadlock the children (seen here when the
            # tuner compiles in its producer thread): off the main thread, use threads, which cost
            # little to start, so even a few jobs (the tuner's next guesses) compile side by side.
            with ThreadPoolExecutor(max_workers=n) as pool:
                _collect(todo, pool.map(compile_one, todo_jobs), cache, done, on_result)
        else:
            _collect(todo, map(compile_one, todo_jobs, pch_roots), cache, done, on_result)
    return [done[k] for k in keys]


def default_workers() -> int:
    """How many compiles run at once for a caller that passes no count: the environment's
    HATCH_AUTOTUNE_JOBS, else one per core (declare/settings.py)."""
    return read_jobs()


def cuda_driver_loaded(maps: str | None = None) -> bool:
    """Whether the CUDA driver (libcuda) is mapped into this process; `maps`: /proc/self/maps' text.

    A process that has called cuInit (the build hook does on a GPU builder, to find the arch) must
    not fork: the child inherits driver state it cannot use. Without /proc (not Linux) there is no
    CUDA driver that fork could break (macOS has none; Windows cannot fork).
    """
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return False
    return "/libcuda.so" in maps


def start_method(maps: str | None = None) -> str:
    """fork while it is safe (fastest: no interpreter start), else forkserver, else spawn."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and not cuda_driver_loaded(maps):
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


@contextlib.contextmanager
def _main_left_alone() -> Iterator[None]:
    """Start workers as if from `python -c`: a forkserver or spawned child re-runs the caller's
    __main__ file, which does not exist under `python -` ('<stdin>') and re-runs the whole build
    when a script has no `if __name__ == "__main__"` guard. The workers only need compile_one."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


PARALLEL_THRESHOLD = 16  # below this, starting worker processes costs more than it saves


def _collect(
    todo: list[tuple[str, CompileJob]],
    outputs: Iterable[tuple[bool, bytes | None, str]],
    cache: CompileCache | None,
    done: dict[str, CompileResult],
    on_result: Callable[[CompileResult], None] | None,
) -> None:
    """Turn NVRTC outputs into results, in order, caching each as soon as it arrives."""
    for (key, job), (ok, binary, log) in zip(todo, outputs):
        resources = parse_ptxas_log(log, job.entry) if ok and not job.is_ptx else None
        if cache is not None:
            cache.put(key, CacheEntry(ok=ok, log=log, label=job.label, resources=asdict(resources) if resources else None, binary=binary))
        done[key] = CompileResult(job, ok, binary, log, resources, False)
        if on_result:
            on_result(done[key])


def count(results: Iterable[CompileResult]) -> dict[str, int]:
    """How many distinct binaries NVRTC compiled (and succeeded), came from the cache (and had
    compiled), and failed (now, or in the build that filled the cache): each binary in exactly
    one of the three, so the counts add up. Configs that render the same source share a
    binary; one compiled now and found in the cache later counts as compiled."""
    seen: dict[BinaryKey, CompileResult] = {}
    for r in results:
        key = r.job.binary_key
        if key not in seen or (seen[key].cached and not r.cached):
            seen[key] = r
    return {
        "compiled": sum(1 for r in seen.values() if r.ok and not r.cached),
        "cached": sum(1 for r in seen.values() if r.ok and r.cached),
        "failed": sum(1 for r in seen.values() if not r.ok),
    }
