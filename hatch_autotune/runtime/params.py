"""A kernel's parameters in one buffer that is reused call after call. cuLaunchKernel reads each
parameter through an array of pointers (`kernelParams`), so the buffer and that array are made
once per kernel instance; a call writes only what it changes (its pointers and scalars) with one
`struct.pack_into` and hands the driver the same address. Packing by struct also converts and
range-checks a call's scalars in C: a value its type cannot hold raises, and the call takes the
checked path, which names it."""

from __future__ import annotations

import struct

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Sequence
    from typing import Any

POINTER = "pointer"
# A CUtensorMap (TMA descriptor) passed by value: 128 bytes, 64-byte aligned as CUDA declares the
# type; the call writes its encoded bytes per launch (ParamBuffer.map_offsets), no struct packs it.
TENSOR_MAP = "tensor_map"
TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN = 128, 64
BYTES16 = "bytes16"  # a 16-byte C value given as its bytes (complex128), at a 16-byte aligned offset
# dtype -> struct code of a caller's value: struct converts it as numpy does (round to nearest,
# float16 included), and refuses what numpy would turn into inf or wrap around
CONVERT = {
    "float16": "e", "float32": "f", "float64": "d",
    "int8": "b", "int16": "h", "int32": "i", "int64": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    POINTER: "q",  # signed: a pointer from 2**63 on (none is; a mistake) is refused, as the checked path does
    BYTES16: "16s",
}  # fmt: skip
# dtype -> struct code of a value that is already a C value (scalars.c_scalar: float16 as its raw bits)
EXACT = {**CONVERT, "float16": "H"}
# what struct raises for a value it cannot pack as the code asks
PACK_ERRORS = (struct.error, OverflowError, TypeError, ValueError)


class ParamBuffer:
    """The parameters of one kernel instance, each at an offset aligned to its size: first the
    caller's values, one per argument in call order (array pointers and scalars, which one
    Struct packs: `convert` for a caller's values, `exact` for C values), then the fixed ones
    (scalars computed from the key), packed once, then the tensor maps (TENSOR_MAP), 64-byte
    aligned in memory, whose bytes the call writes at `map_offsets` (one per TENSOR_MAP
    parameter, in C order). `address` is what cuLaunchKernel takes as `kernelParams`; `pack` is
    convert.pack_into. The driver reads the buffer during the launch, so one buffer serves one
    launch at a time (launching.FastPlan hands them out); `launch_config` is the plan's
    CUlaunchConfig of this buffer (a cluster launch), None otherwise."""

    __slots__ = (
        "convert", "exact", "pack", "storage", "address", "map_offsets", "launch_config", "_layout", "_keep",
        "kept_address", "context_out", "context_ref", "stream_value", "kept_stream",
    )  # fmt: skip

    def __init__(self, layout: Sequence[tuple[str, int | None, Any]]):
        """`layout`: per C parameter in the kernel's order, (dtype, POINTER or TENSOR_MAP; the
        caller's argument index or None; the fixed value for a parameter no caller gives)."""
        import numpy

        self._layout = tuple(layout)
        self.launch_config: Any = None
        # for a driver through ctypes (libcuda.py; set by launching.FastPlan.fresh): the address,
        # the current context's answer and the last stream as the ctypes objects its raw calls take
        self.kept_address: Any = None
        self.context_out: Any = None
        self.context_ref: Any = None
        self.stream_value: int | None = None
        self.kept_stream: Any = None
        user = sorted((index, dtype, c) for c, (dtype, index, _) in enumerate(layout) if index is not None)
        fixed = [(dtype, value, c) for c, (dtype, index, value) in enumerate(layout) if index is None and dtype != TENSOR_MAP]
        maps = [c for c, (dtype, index, _) in enumerate(layout) if index is None and dtype == TENSOR_MAP]
        offsets = [0] * len(layout)
        convert, exact, end = ["="], ["="], 0
        for _, dtype, c in user:
            size = struct.calcsize("=" + CONVERT[dtype])
            pad = -end % size
            convert.append(f"{pad}x{CONVERT[dtype]}" if pad else CONVERT[dtype])
            exact.append(f"{pad}x{EXACT[dtype]}" if pad else EXACT[dtype])
            offsets[c] = end + pad
            end += pad + size
        self.convert, self.exact = struct.Struct("".join(convert)), struct.Struct("".join(exact))
        fixed_at = []
        for dtype, value, c in fixed:
            size = struct.calcsize("=" + EXACT[dtype])
            end += -end % size
            offsets[c] = end
            fixed_at.append((end, dtype, value))
            end += size
        for c in maps:
            end += -end % TENSOR_MAP_ALIGN
            offsets[c] = end
            end += TENSOR_MAP_BYTES
        self.map_offsets = tuple(offsets[c] for c in maps)
        # numpy's views pin the bytearray (it cannot be resized while they exist) and tell its
        # address; with tensor maps, the storage is the view of it that starts 64-byte aligned
        raw = bytearray(max(end, 1) + (TENSOR_MAP_ALIGN - 1 if maps else 0))
        data = numpy.frombuffer(raw, numpy.uint8)
        base = data.__array_interface__["data"][0]
        shift = -base % TENSOR_MAP_ALIGN if maps else 0
        base += shift
        self.storage: bytearray | memoryview = memoryview(raw)[shift : shift + max(end, 1)] if maps else raw
        for offset, dtype, value in fixed_at:
            struct.pack_into("=" + EXACT[dtype], self.storage, offset, value)
        pointers = numpy.array([base + offset for offset in offsets], numpy.uint64)
        self.address = pointers.__array_interface__["data"][0] if len(offsets) else 0
        self._keep = (data, pointers)
        self.pack = self.convert.pack_into  # bound once: the call path's lookups are what it costs

    def fresh(self) -> ParamBuffer:
        """A buffer of the same layout and fixed values, for a call that finds this one in use."""
        return ParamBuffer(self._layout)

    def values(self) -> tuple[Any, ...]:
        """The caller's values as the exact struct reads them back (for tests and messages)."""
        return self.exact.unpack_from(self.storage, 0)
