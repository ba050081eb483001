"""NVRTC's automatic precompiled headers, as the compile path uses them for kernels with header
sets: where each process writes its PCH files, how many it keeps, the PCH heap's size, and the
notes NVRTC logs about them, which must not reach a variant's log."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from ..runtime import check_cuda

# NVRTC's automatic precompiled headers: the first compile of a header-heavy source in a process
# writes a PCH of its leading #includes, and later ones with the same includes and options load
# it (measured: a CUB + bf16 variant 3.2 s, the next ones 0.6 s; the cubins are byte-identical).
# The PCH heap is process-wide, and resizing it makes every PCH written before unusable, so it
# is sized once, before the first PCH, for the toolkit's headers (CUB with cuda/std needs about
# 420 MiB; the default is 256 MiB), and grown only when a PCH asks for more. It is used on the
# main thread only (the serial path and the pool's worker processes), never by compile threads.
# A PCH file is about 300 MB, one per (leading #includes, options: the arch among them), and
# NVRTC's own folder (/tmp/__nvrtc_auto_pch_<pid>_0) is left behind by a process that ends
# without its destructors (a pool worker): 4 GB per worker in a six-arch build. So compile_all
# gives each process a folder of its own inside one it removes when the batch is done, keeps
# at most MAX_PCH_FILES in it, and asks for PCH only for jobs that have a sibling to reuse it.
PCH_HEAP_BYTES = 512 << 20
MAX_PCH_FILES = 2  # per process: the newest ones (NVRTC writes a missing one again when asked)
# NVRTC's diagnostics about its PCH files, which name a per-process folder: EDG's #626-#639 (a
# PCH made with other options (#629) or other leading #includes (#630), a heap too small (#639)...)
# and #20282 (a PCH made before the heap was resized). Whether a PCH served a compile must not
# show in its log.
PCH_DIAGNOSTICS = "--diag-suppress=" + ",".join(map(str, [*range(626, 640), 20282]))
_PCH_NOTE = re.compile(r'^"[^"\n]*": (?:creating|using) precompiled header file "[^"\n]*"\n?', re.MULTILINE)
_pch_heap_sized = False


def pch_allowed() -> bool:
    """On the main thread only: the heap is process-wide (whether a batch uses PCH at all,
    HATCH_AUTOTUNE_PCH, compile_all decides once, by handing compile_one a folder or not)."""
    return threading.current_thread() is threading.main_thread()


def process_pch_dir(root: str) -> str:
    """This process's PCH folder inside `root` (one per process: NVRTC names its files by the
    program's name and a counter, which two processes would both use)."""
    folder = os.path.join(root, str(os.getpid()))
    os.makedirs(folder, exist_ok=True)
    return folder


def prune_pch(folder: str) -> None:
    """Keep the MAX_PCH_FILES newest PCH files of a process's folder."""
    try:
        files = sorted((os.path.join(folder, f) for f in os.listdir(folder)), key=os.path.getmtime)
        for path in files[:-MAX_PCH_FILES]:
            os.unlink(path)
    except OSError:  # one went away meanwhile: nothing to keep small
        pass


def size_pch_heap(nvrtc: Any) -> None:
    """Give the PCH heap its size once per process, before the first PCH is written."""
    global _pch_heap_sized
    if not _pch_heap_sized:
        current = check_cuda(nvrtc.nvrtcGetPCHHeapSize(), "nvrtcGetPCHHeapSize")
        if int(current) < PCH_HEAP_BYTES:
            check_cuda(nvrtc.nvrtcSetPCHHeapSize(PCH_HEAP_BYTES), "nvrtcSetPCHHeapSize")
        _pch_heap_sized = True


def grow_pch_heap(nvrtc: Any, prog: Any) -> None:
    """When a PCH did not fit the heap, make the heap as large as it asked for, so that the next
    compile in this process writes it (the PCHs written before are then unusable: rare, since
    the heap starts at PCH_HEAP_BYTES)."""
    status = nvrtc.nvrtcGetPCHCreateStatus(prog)[0]
    if status == nvrtc.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
        required = check_cuda(nvrtc.nvrtcGetPCHHeapSizeRequired(prog), "nvrtcGetPCHHeapSizeRequired")
        check_cuda(nvrtc.nvrtcSetPCHHeapSize(int(required) + (16 << 20)), "nvrtcSetPCHHeapSize")


def without_pch_notes(log: str) -> str:
    """The log without NVRTC's notes on its precompiled headers, which name a per-process
    folder: the log of a variant is the same whether or not a PCH served it."""
    return _PCH_NOTE.sub("", log).strip()


@contextlib.contextmanager
def pch_folder(wanted: bool) -> Iterator[str | None]:
    """A folder for a batch's precompiled headers, removed afterwards with every process's PCH
    files in it; None when the batch compiles without."""
    if not wanted:
        yield None
        return
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="hatch-autotune-pch-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
