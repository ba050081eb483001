"""Tensor-map arguments (TMA descriptors): a `CUtensorMap` that the call encodes from one of its
arrays with cuTensorMapEncodeTiled and passes by value (128 bytes). The driver's rules are checked
here first, so that a wrong box or layout is a ValueError naming the argument rather than the
driver's bare CUDA_ERROR_INVALID_VALUE; what the driver is given is documented in `encode`.

The layout part of a map (dtype, shape, strides, box, options) is fixed for a call signature; only
the array's pointer changes from call to call. A `TensorMapEncoder` holds the checked layout and
the maps it encoded per pointer, so a call with a pointer seen before costs one dict lookup;
encoders live in the GpuState (a stand-in driver's maps never reach the real one), both bounded."""

from __future__ import annotations

from .cuda_seam import check_cuda
from .params import TENSOR_MAP_BYTES
from .values import DTYPE_SIZES

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Sequence
    from typing import Any

    from .cuda_seam import GpuState
    from .declaration import TensorMapDecl

# our dtype -> the CUtensorMapDataType that moves its bytes (TMA copies bits: the one-byte types
# as UINT8; int16 has no type of its own and is refused, as complex and the rest are)
TMA_DTYPES = {
    "uint8": "UINT8", "int8": "UINT8", "bool": "UINT8",
    "float8_e4m3fn": "UINT8", "float8_e5m2": "UINT8", "float8_e8m0fnu": "UINT8",
    "uint16": "UINT16", "uint32": "UINT32", "int32": "INT32", "uint64": "UINT64", "int64": "INT64",
    "float16": "FLOAT16", "float32": "FLOAT32", "float64": "FLOAT64", "bfloat16": "BFLOAT16",
}  # fmt: skip
# the dtypes whose out-of-bounds elements may be filled with NaN (the driver's floating-point types)
NAN_FILLABLE = frozenset({"float16", "float32", "float64", "bfloat16"})
# the declaration's option names -> the driver's enum member suffixes
SWIZZLE = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}
SWIZZLE_SPAN = {"32B": 32, "64B": 64, "128B": 128}  # the inner box bytes a swizzle allows at most
L2_PROMOTION = {"none": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"}
OOB_FILL = {"zero": "NONE", "nan": "NAN_REQUEST_ZERO_FMA"}
MAX_RANK, MAX_BOX, MAX_DIM, MAX_STRIDE = 5, 256, 2**32, 2**40
GLOBAL_ALIGN = 16  # the global address and every outer stride: multiples of 16 bytes
ENCODERS_LIMIT, MAPS_PER_ENCODER = 256, 256  # the caches' bounds (cleared when full)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """A C-contiguous array's strides in elements, outermost first."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


class TensorMapEncoder:
    """The maps of one layout: `encoder(ptr)` is the 128 bytes of the CUtensorMap of the array at
    `ptr`, encoded at its first use (on `device`'s primary context) and kept per pointer."""

    __slots__ = ("gpu", "device", "what", "args", "by_ptr")

    def __init__(self, gpu: GpuState, device: int, what: str, args: tuple[Any, ...]):
        self.gpu, self.device, self.what, self.args = gpu, device, what, args
        self.by_ptr: dict[int, bytes] = {}

    def __call__(self, ptr: int) -> bytes:
        data = self.by_ptr.get(ptr)
        return data if data is not None else self.encode(ptr)

    def encode(self, ptr: int) -> bytes:
        """cuTensorMapEncodeTiled for the array at `ptr` (its pointer checked first)."""
        import ctypes

        if type(ptr) is not int or ptr <= 0 or ptr % GLOBAL_ALIGN:
            got = f"{ptr:#x}, offset by {ptr % GLOBAL_ALIGN} bytes" if type(ptr) is int and ptr > 0 else repr(ptr)
            raise ValueError(f"{self.what}: the array's address must be {GLOBAL_ALIGN}-byte aligned and not null (TMA); got {got}")
        gpu = self.gpu
        driver = gpu.driver
        with gpu.on_device(self.device):
            result = encode_tiled(driver, self.args, ptr)
        tensor_map = check_cuda(result, f"cuTensorMapEncodeTiled ({self.what})")
        data = ctypes.string_at(int(tensor_map.getPtr()), TENSOR_MAP_BYTES)
        if len(self.by_ptr) >= MAPS_PER_ENCODER:
            self.by_ptr.clear()
        self.by_ptr[ptr] = data
        return data


def encode_tiled(driver: Any, args: tuple[Any, ...], ptr: int) -> Any:
    """cuTensorMapEncodeTiled's result (error, CUtensorMap) for tensor_map_args' `args` and the address."""
    dtype, rank, dims, strides, box, swizzle, l2, oob = args
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t  # the bindings take these, not ints, in the arrays
    return driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{dtype}"),
        rank,
        ptr,
        [u64(d) for d in dims],
        [u64(s) for s in strides],
        [u32(b) for b in box],
        [u32(1)] * rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
        getattr(driver.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{l2}"),
        getattr(driver.CUtensorMapFloatOOBfill, f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{oob}"),
    )


def tensor_map_args(
    what: str, decl: TensorMapDecl, dtype: str | None, shape: Sequence[int], strides: Sequence[int], box: Sequence[int]
) -> tuple[Any, ...]:
    """cuTensorMapEncodeTiled's arguments but the address, in the driver's order (innermost dim
    first), after the driver's rules; a ValueError naming `what` (the kernel and argument) for
    the first one broken. `shape`, `strides` (elements) and `box` are outermost first."""
    source = f"array {decl.array!r}"
    if getattr(decl, "order", "declared") == "memory":
        shape, strides, box = memory_order(what, source, shape, strides, box)
    if dtype not in TMA_DTYPES:
        raise ValueError(f"{what}: {source} has dtype {dtype}, which TMA cannot copy; TMA types: {', '.join(TMA_DTYPES)}")
    size = DTYPE_SIZES[dtype]
    rank = len(shape)
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"{what}: {source} has {rank} dimensions; a tensor map has 1 to {MAX_RANK}")
    if len(box) != rank:
        raise ValueError(f"{what}: the box {tuple(box)} has {len(box)} dims; {source} has {rank}")
    if any(not 1 <= d <= MAX_DIM for d in shape):
        raise ValueError(f"{what}: {source} has shape {tuple(shape)}; each dim of a tensor map must be 1 to 2**32")
    if any(not 1 <= b <= MAX_BOX for b in box):
        raise ValueError(f"{what}: the box {tuple(box)} (outermost first) has a dim outside 1..{MAX_BOX}")
    inner_bytes = box[-1] * size
    if inner_bytes % 16:
        raise ValueError(
            f"{what}: the box's innermost dim is {box[-1]} x {size} bytes ({dtype}) = {inner_bytes} bytes; TMA needs a multiple of 16 bytes"
        )
    span = SWIZZLE_SPAN.get(decl.swizzle)
    if span is not None and inner_bytes > span:
        raise ValueError(f"{what}: the box's innermost dim is {inner_bytes} bytes; swizzle {decl.swizzle} allows at most {span}")
    if shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(f"{what}: {source} has innermost stride {strides[-1]} elements; TMA reads the innermost dim densely (stride 1)")
    outer = []
    for axis in range(rank - 1):
        nbytes = strides[axis] * size
        if nbytes <= 0 or nbytes % GLOBAL_ALIGN or nbytes >= MAX_STRIDE:
            raise ValueError(
                f"{what}: {source} has stride {strides[axis]} elements ({nbytes} bytes) on dim {axis}; TMA needs each outer "
                f"stride a positive multiple of {GLOBAL_ALIGN} bytes below 2**40"
            )
        outer.append(nbytes)
    if decl.oob_fill == "nan" and dtype not in NAN_FILLABLE:
        raise ValueError(f"{what}: oob-fill 'nan' needs a floating-point array (float16, bfloat16, float32, float64); {source} is {dtype}")
    return (
        TMA_DTYPES[dtype],
        rank,
        tuple(int(d) for d in reversed(shape)),
        tuple(reversed(outer)),
        tuple(int(b) for b in reversed(box)),
        SWIZZLE[decl.swizzle],
        L2_PROMOTION[decl.l2_promotion],
        OOB_FILL[decl.oob_fill],
    )


def memory_order(
    what: str, source: str, shape: Sequence[int], strides: Sequence[int], box: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """shape, strides and box (outermost first) with the array's unit-stride axis moved innermost,
    the others in their declared order (`order = "memory"`): of several axes of stride one (size-1
    axes), the longest. A ValueError where no axis has stride one."""
    units = [i for i, s in enumerate(strides) if s == 1]
    if not units:
        raise ValueError(
            f"{what}: {source} has strides {tuple(strides)} (elements); a tensor map in memory order needs an axis of stride 1"
        )
    inner = max(units, key=lambda i: (shape[i], i))
    order = [i for i in range(len(shape)) if i != inner] + [inner]
    return tuple(shape[i] for i in order), tuple(strides[i] for i in order), tuple(box[i] for i in order)


def encoder(
    gpu: GpuState,
    device: int,
    what: str,
    decl: TensorMapDecl,
    dtype: str | None,
    shape: Sequence[int],
    strides: Sequence[int] | None,
    box: Sequence[int],
) -> TensorMapEncoder:
    """The encoder of a layout on a device (made and checked once; kept in the GpuState)."""
    strides = contiguous_strides(shape) if strides is None else tuple(strides)
    key = (what, device, dtype, tuple(shape), strides, tuple(box), decl.swizzle, decl.l2_promotion, decl.oob_fill)
    cache = gpu.tensor_maps
    found = cache.get(key)
    if found is None:
        args = tensor_map_args(what, decl, dtype, shape, strides, box)
        if len(cache) >= ENCODERS_LIMIT:
            cache.clear()
        found = cache[key] = TensorMapEncoder(gpu, device, what, args)
    return found
