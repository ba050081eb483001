"""The layout a bucket's array is tuned in (issue #52): an argument declared with strides is
tuned on an array that has them, so that the template's stride arithmetic is what gets run,
verified and timed, not only its contiguous case.

- `strides = "inner"`: rows padded to the next multiple of PAD_BYTES bytes past the row (a
  sliced or padded matrix: the leading-dimension form); a vector has no outer stride to pad;
- `strides = "any"`: transposed (column-major) from two dims on, every other element for one
  dim; with `align` (vector loads) the padded rows of "inner" instead, which keep each row aligned;
- with `unit-stride-variants`, the variant for a unit innermost stride gets the padded rows of
  "inner", the other (NON_UNIT) a transposed matrix from two dims on (the non-unit layout kernels
  meet most: `W.T` of a row-major weight, a column-major operand, which their fast paths serve)
  and every other element for one dim.

The host array is a NumPy view into a larger buffer whose other elements are the poison byte (a
kernel that reads outside its view reads NaN or an unlikely integer, and fails verification);
the worker uploads the buffer whole (worker_memory.DeviceArray) and the kernel gets the view's
pointer and strides. Written arrays never overlap: each layout gives every element its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..declare.args import ArgSpec
from ..runtime.values import DTYPE_SIZES

PAD_BYTES = 256  # "inner" rows start on this boundary: the alignment of a pitched allocation
# The layout of an array's variant for a non-unit innermost stride (`unit-stride-variants`):
# column-major from two dims on, every other element for one dim.
NON_UNIT = "non-unit"


def tuning_layout(a: ArgSpec, types: Mapping[str, Any]) -> str:
    """The layout an array is tuned in: its declared one, or with unit-stride variants the one
    of the instance's variant (a unit innermost stride, or NON_UNIT)."""
    constant = a.unit_stride_constant
    if constant is None:
        return a.strides
    return "inner" if types.get(constant, True) else NON_UNIT


def tuning_strides(shape: Sequence[int], dtype: str, layout: str, align: int | None = None) -> tuple[int, ...] | None:
    """The element strides a strided argument's array is tuned with; None: C-contiguous (a
    "contiguous" argument, an empty array, or one whose layout has nothing to vary)."""
    if layout == "contiguous" or not shape or 0 in shape:
        return None
    if layout == NON_UNIT or (layout == "any" and not align):
        if len(shape) == 1:
            return (2,)
        strides, step = [], 1
        for size in shape:  # column-major: the first dim is the innermost
            strides.append(step)
            step *= size
        return tuple(strides)
    if len(shape) == 1:
        return None
    size = DTYPE_SIZES[dtype]
    boundary = max(PAD_BYTES, align or 1)
    row = -(-(shape[-1] * size + 1) // boundary) * boundary  # past the row: never dense
    strides, step = [1], row // size
    for i in range(len(shape) - 2, -1, -1):
        strides.append(step)
        step *= shape[i]
    return tuple(reversed(strides))


def span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """The elements from a view's first to its last (what its buffer must hold)."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def laid_out(values: Any, strides: Sequence[int] | None) -> Any:
    """`values` (a NumPy array) as a view with these element strides into a buffer of its own,
    whose elements outside the view are the poison byte; `values` itself when strides is None."""
    import numpy as np

    from .verify import poison_byte

    if strides is None:
        return values
    buffer = np.empty(span(values.shape, strides), values.dtype)
    buffer.view(np.uint8)[:] = poison_byte(values.dtype)
    view = np.lib.stride_tricks.as_strided(buffer, values.shape, tuple(s * values.itemsize for s in strides))
    view[...] = values
    return view


def buffer_bytes(host: Any) -> int:
    """The bytes behind a host array from its first element on: its own for a C-contiguous
    one, its buffer's span for a laid-out view (non-negative strides, first element first)."""
    if host.flags.c_contiguous or 0 in host.shape:
        return int(host.nbytes)
    return int(host.itemsize + sum((n - 1) * s for n, s in zip(host.shape, host.strides)))


def element_strides(host: Any) -> tuple[int, ...] | None:
    """A laid-out host array's strides in elements; None for a C-contiguous one."""
    if host.flags.c_contiguous:
        return None
    return tuple(s // host.itemsize for s in host.strides)
