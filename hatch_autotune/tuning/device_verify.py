"""Verification on the GPU: compare.cu's kernel applies verify.py's rule where the outputs are.

A variant's outputs can be hundreds of MB and every config is verified; downloading them for the
host comparison costs more than the kernel itself. The compare kernel reads the variant's output
and the reference on the device and leaves a 40-byte record (counts, first indices, worst error);
only a failing comparison downloads two more elements, for the message. The result is the same
`Mismatch` that `verify.compare_host` gives on the same data, so the reason a variant is rejected
does not depend on where it was compared.

One small NVRTC program per (output dtype, reference dtype) pair, compiled once per arch and
kept in the content-addressed compile cache like any variant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, NamedTuple

from ..compile.cache import CompileCache
from ..compile.nvrtc import CompileJob, compile_all
from ..declare.args import DTYPES
from ..errors import BuildError
from ..runtime import check_cuda
from .dtypes import dtype_name, kind, numpy_dtype
from .verify import Mismatch

Pair = tuple[str, str]  # (dtype of the variant's output, dtype of the reference)

# Every dtype against itself, and a reference wider than the output (a user's float64 reference
# for a float32 kernel, a float32 one for a bfloat16 or FP8 kernel, say). Not the other way round:
# a narrower reference has lost the digits that the tolerance is about. Any other pair is
# compared on the host (verify.compare_host), which takes every pair it can judge.
_NARROW = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
PAIRS: tuple[Pair, ...] = (
    *tuple((d, d) for d in DTYPES),
    *tuple((d, wide) for d in _NARROW for wide in ("float32", "float64")),
    ("float32", "float64"),
    ("complex64", "complex128"),
)

# The record a launch leaves (compare.cu's CompareRecord): five little-endian uint64, in order.
# Before each launch the firsts are set to all-ones bytes (no index) and the rest to zero bytes.
RECORD_FIELDS = ("first_unwritten", "first_differ", "unwritten", "differ", "worst_error_bits")
RESULT_BYTES = 8 * len(RECORD_FIELDS)
FIRSTS_BYTES = 16  # the two firsts lead the record
NO_INDEX = (1 << 64) - 1

BLOCK = 256  # threads per block: a multiple of 32, as the kernel's warp reduction needs
ELEMENTS_PER_THREAD = 4  # before the grid is capped
MAX_BLOCKS = 65535  # past this the grid-stride loop takes over

OPTIONS = ("--fmad=false", "--ftz=false")  # NumPy rounds rtol * |e| before adding atol; float32 subnormals count
HOST_ENTRY_PREFIX = "hatch_autotune_compare_host_"


def entry_name(got_dtype: str, expected_dtype: str) -> str:
    """The kernel's extern "C" name for a pair."""
    return f"hatch_autotune_compare_{got_dtype}_{expected_dtype}"


def host_entry_name(got_dtype: str, expected_dtype: str) -> str:
    """The name of the same rule as a serial host function, when compare.cu is compiled as C++."""
    return f"{HOST_ENTRY_PREFIX}{got_dtype}_{expected_dtype}"


def supports(got_dtype: str, expected_dtype: str) -> bool:
    return (got_dtype, expected_dtype) in PAIRS


def source(pairs: Sequence[Pair]) -> str:
    """compare.cu with an entry for each pair: one kernel each under NVRTC, one host function
    each under a host C++ compiler."""
    for pair in pairs:
        if not supports(*pair):
            raise ValueError(f"no compare kernel for {pair[0]} outputs against {pair[1]} references")
    text = resources.files(__package__).joinpath("compare.cu").read_text(encoding="utf-8")
    return text + "\n" + "".join(f"HATCH_AUTOTUNE_COMPARE({g}, {e})\n" for g, e in pairs)


def compile_job(arch: str, got_dtype: str, expected_dtype: str) -> CompileJob:
    return CompileJob(
        source([(got_dtype, expected_dtype)]),
        arch,
        entry_name(got_dtype, expected_dtype),
        OPTIONS,
        label=f"compare kernel ({got_dtype} output, {expected_dtype} reference)",
    )


def compare_binaries(arch: str, pairs: Sequence[Pair], cache: CompileCache | None) -> dict[Pair, bytes]:
    """The compare kernel's cubin for each pair (`arch`: the worker's device's, e.g. 'sm_90'),
    through the compile cache. BuildError when one does not compile: that is a bug of hatch-autotune, not the user's."""
    wanted = list(dict.fromkeys(pairs))
    results = compile_all([compile_job(arch, g, e) for g, e in wanted], cache)
    out: dict[Pair, bytes] = {}
    for pair, result in zip(wanted, results):
        if not result.ok or result.binary is None:
            raise BuildError(
                f"hatch-autotune: the compare kernel for {pair[0]} outputs against {pair[1]} references did not compile for "
                f"{arch} (a bug in hatch-autotune; please report it with this log):\n{result.log}"
            )
        out[pair] = result.binary
    return out


class Record(NamedTuple):
    """A launch's record, decoded: indices are -1 where there is none."""

    first_unwritten: int
    first_differ: int
    unwritten: int
    differ: int
    worst_error: float


def decode_record(raw: bytes) -> Record:
    import struct

    first_unwritten, first_differ, unwritten, differ, worst_bits = struct.unpack("<5Q", raw[:RESULT_BYTES])
    (worst,) = struct.unpack("<d", worst_bits.to_bytes(8, "little"))
    return Record(
        -1 if first_unwritten == NO_INDEX else first_unwritten,
        -1 if first_differ == NO_INDEX else first_differ,
        unwritten,
        differ,
        worst,
    )


def grid_blocks(n: int) -> int:
    """Blocks for n elements: about ELEMENTS_PER_THREAD per thread, capped (the loop strides)."""
    return max(1, min(-(-n // (BLOCK * ELEMENTS_PER_THREAD)), MAX_BLOCKS))


class DeviceComparer:
    """Compares outputs already on the device (the tuning worker's process; its device current).

    `cuda`: the runtime's CudaApi; `cubins`: compare_binaries' for this device's arch. Kernels are
    loaded on first use; the record lives as long as the comparer (free() releases it)."""

    def __init__(self, cuda: Any, cubins: Mapping[Pair, bytes]):
        import numpy as np

        self._cuda = cuda
        self._cubins = dict(cubins)
        self._kernels: dict[Pair, Any] = {}
        self._configs: dict[int, Any] = {}  # blocks -> LaunchConfig (building one costs microseconds)
        self._record = check_cuda(cuda.driver.cuMemAlloc(RESULT_BYTES), "cuMemAlloc (compare record)")
        self._host = np.empty(RESULT_BYTES, np.uint8)

    def compare(
        self,
        name: str,
        got_ptr: int,
        expected_ptr: int,
        shape: tuple[int, ...],
        got_dtype: Any,
        expected_dtype: Any,
        rtol: float,
        atol: float,
        stream: Any,
    ) -> Mismatch:
        """What `verify.compare_host(name, got, expected, rtol, atol)` gives for the arrays at the
        two device addresses (C-contiguous, `shape`); `stream`: a cuda.core Stream that orders the
        comparison after the variant's launch. Waits for the stream."""
        import numpy as np

        pair = (dtype_name(got_dtype), dtype_name(expected_dtype))
        if not supports(*pair):
            raise ValueError(f"no compare kernel for {pair[0]} outputs against {pair[1]} references")
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape)
        found = Record(-1, -1, 0, 0, 0.0)
        if n:
            kernel = self._kernel(pair)
            driver, handle = self._cuda.driver, stream.handle
            record = int(self._record)
            check_cuda(driver.cuMemsetD8Async(record, 0xFF, FIRSTS_BYTES, handle), "cuMemsetD8Async (compare record)")
            check_cuda(
                driver.cuMemsetD8Async(record + FIRSTS_BYTES, 0, RESULT_BYTES - FIRSTS_BYTES, handle), "cuMemsetD8Async (compare record)"
            )
            args = (int(got_ptr), int(expected_ptr), np.uint64(n), np.float64(rtol), np.float64(atol), record)
            self._cuda.launch(stream, self._config(grid_blocks(n)), kernel, *args)
            stream.sync()
            check_cuda(driver.cuMemcpyDtoH(self._host.ctypes.data, record, RESULT_BYTES), "cuMemcpyDtoH (compare record)")
            found = decode_record(self._host.tobytes())
        got_at = expected_at = None
        if found.differ:
            got_at = self._element(got_ptr, pair[0], found.first_differ)
            expected_at = self._element(expected_ptr, pair[1], found.first_differ)
        return Mismatch(
            name,
            shape,
            found.unwritten,
            found.first_unwritten,
            found.differ,
            found.first_differ,
            found.worst_error,
            got_at,
            expected_at,
            rtol,
            atol,
            pair[0],
            pair[1],
        )

    def free(self) -> None:
        if self._record is not None:
            check_cuda(self._cuda.driver.cuMemFree(self._record), "cuMemFree (compare record)")
            self._record = None

    def _kernel(self, pair: Pair) -> Any:
        kernel = self._kernels.get(pair)
        if kernel is None:
            if pair not in self._cubins:
                have = ", ".join(f"{g}/{e}" for g, e in self._cubins) or "none"
                raise ValueError(f"no compare kernel loaded for {pair[0]} outputs against {pair[1]} references (loaded: {have})")
            kernel = self._cuda.ObjectCode.from_cubin(self._cubins[pair]).get_kernel(entry_name(*pair))
            self._kernels[pair] = kernel
        return kernel

    def _config(self, blocks: int) -> Any:
        config = self._configs.get(blocks)
        if config is None:
            config = self._configs[blocks] = self._cuda.LaunchConfig(grid=blocks, block=BLOCK)
        return config

    def _element(self, ptr: int, name: str, index: int) -> float | complex | int:
        """One element from the device, as compare_host reports it: a float for real floats, a
        complex for complex, an int for integers and for a bool's byte."""
        import numpy as np

        what = kind(name)
        dtype = np.dtype(np.uint8) if what == "bool" else numpy_dtype(name)
        one = np.empty(1, dtype)
        check_cuda(self._cuda.driver.cuMemcpyDtoH(one.ctypes.data, int(ptr) + index * dtype.itemsize, dtype.itemsize), "cuMemcpyDtoH")
        return float(one[0]) if what == "float" else complex(one[0]) if what == "complex" else int(one[0])
