"""Scalars: a caller's number as the exact C value a kernel parameter holds (float32 stays
float32; float16, bfloat16 and FP8 as their raw bits; complex; bool), range-checked, and the
exact constants a call names. A wrong one is a TypeError or ValueError that names the argument."""

from __future__ import annotations

from .errors import short_repr
from .values import COMPLEX_DTYPES, FLOAT_RANGES, INT_RANGES, ML_DTYPES

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any

    import numpy


def integral_types() -> tuple[type[int | numpy.integer[Any]], ...]:
    """What an integer argument may be: a Python int, or a numpy integer when numpy is there."""
    try:
        import numpy

        return (int, numpy.integer)
    except ImportError:  # pragma: no cover - numpy is a dependency of every generated wheel
        return (int,)


# The float dtypes without infinity: a value beyond their range becomes NaN, and inf has no code.
_NO_INFINITY = ("float8_e4m3fn", "float8_e8m0fnu")
_E8M0 = "float8_e8m0fnu"  # unsigned exponent-only: powers of two from 2**-127 to 2**127, and NaN
# narrow dtype -> the bits that are all set in its inf and NaN codes (its exponent field; all
# bits but the sign for float8_e4m3fn's only NaN, all for float8_e8m0fnu's)
_NOT_FINITE = {"bfloat16": 0x7F80, "float8_e4m3fn": 0x7F, "float8_e5m2": 0x7C, "float8_e8m0fnu": 0xFF}


def c_scalar(value: Any, dtype: str, kernel: str, arg: str) -> Any:
    """A Python or NumPy number as the exact C value that the kernel's parameter holds,
    range-checked: float32 stays float32; float16, bfloat16 and FP8 are their raw bits (uint16,
    uint8), which is what cuda.core's launch and the parameter buffer pack; complex is NumPy's
    complex64/complex128; bool is numpy.bool_."""
    import numpy

    if dtype == "bool":
        if not isinstance(value, (bool, numpy.bool_)):
            raise TypeError(f"{kernel}(): argument {arg!r} must be a bool (True or False), got {short_repr(value)}")
        return numpy.bool_(value)
    real = isinstance(value, (int, float, numpy.number)) or type(value).__name__ in ML_DTYPES  # ml_dtypes' scalars
    if isinstance(value, (bool, numpy.bool_)) or not (real or isinstance(value, complex)):
        raise TypeError(f"{kernel}(): argument {arg!r} must be a number ({dtype}), got {type(value).__name__}")
    if dtype in INT_RANGES:
        if not isinstance(value, (int, numpy.integer)):
            raise TypeError(f"{kernel}(): argument {arg!r} must be an integer ({dtype}), got {value!r}")
        lo, hi = INT_RANGES[dtype]
        if not lo <= int(value) <= hi:
            raise ValueError(f"{kernel}(): argument {arg!r}={value} does not fit in {dtype} [{lo}, {hi}]")
        return numpy.dtype(dtype).type(int(value))
    if dtype in COMPLEX_DTYPES:
        part = "float32" if dtype == "complex64" else "float64"
        try:
            number = complex(value)
        except OverflowError:  # an int beyond any float: refused
            _check_float(value, float("inf"), part, kernel, arg, f"the real part of {dtype}", finite=True)
            raise
        _check_float(value, number.real, part, kernel, arg, f"the real part of {dtype}")
        _check_float(value, number.imag, part, kernel, arg, f"the imaginary part of {dtype}")
        return numpy.complex64(number) if dtype == "complex64" else numpy.complex128(number)
    if isinstance(value, (complex, numpy.complexfloating)):
        raise TypeError(f"{kernel}(): argument {arg!r} must be a real number ({dtype}), got {short_repr(value)}")
    try:
        number = float(value)  # exact for numpy floats
    except OverflowError:  # an int beyond any float: refused
        _check_float(value, float("inf"), dtype, kernel, arg, dtype, finite=True)
        raise
    _check_float(value, number, dtype, kernel, arg, dtype)
    if dtype == "float16":
        return numpy.float16(number).view(numpy.uint16)  # the kernel sees at_half: 16 raw bits
    if dtype in ML_DTYPES:
        # rounded to float32 first, then to nearest even in the narrow type: as PyTorch and
        # ml_dtypes' array conversion do, so a scalar and a tensor of the same value agree
        narrow = numpy.float32(number)
        bits = bfloat16_bits(narrow) if dtype == "bfloat16" else _fp8_bits(narrow, dtype, kernel, arg)
        mask = _NOT_FINITE[dtype]
        if number - number == 0 and int(bits) & mask == mask:  # finite, yet rounded (twice) onto inf or NaN
            _check_float(value, float("inf"), dtype, kernel, arg, dtype, finite=True)
        return bits
    return numpy.dtype(dtype).type(number)


def _check_float(value: Any, number: float, dtype: str, kernel: str, arg: str, what: str, finite: bool = False) -> None:
    """A ValueError naming the argument when `number` (a part of `value`) does not fit `dtype`:
    finite, yet it would become inf (or NaN, where the type has no infinity); inf where the type
    has none; for float8_e8m0fnu anything but a power of two in its range. `finite`: `value` is
    finite although `number` is not (an int beyond any float)."""
    largest, limit = FLOAT_RANGES[dtype]
    is_finite = finite or number - number == 0
    if dtype == _E8M0:
        import math

        if number == number and not (is_finite and number > 0 and math.frexp(number)[0] == 0.5 and 2.0**-127 <= number <= largest):
            raise ValueError(
                f"{kernel}(): argument {arg!r}={short_repr(value)} is not a {_E8M0} value: that type (a scale) holds only "
                "powers of two from 2**-127 to 2**127 (and NaN), not zero, negative numbers, infinity or other values"
            )
        return
    if is_finite and not -limit < number < limit:
        bounds = f"[{-largest:.8g}, {largest:.8g}]"
        if dtype in _NO_INFINITY:
            raise ValueError(
                f"{kernel}(): argument {arg!r}={short_repr(value)} does not fit in {what} {bounds}: it would become NaN ({dtype} has no infinity)"
            )
        raise ValueError(
            f"{kernel}(): argument {arg!r}={short_repr(value)} does not fit in {what} {bounds}: "
            "it would become inf (pass inf itself if that is meant)"
        )
    if not is_finite and number == number and dtype in _NO_INFINITY:
        raise ValueError(f"{kernel}(): argument {arg!r}={short_repr(value)}: {dtype} has no infinity; pass a finite value or NaN")


def bfloat16_bits(number: Any) -> Any:
    """A float32 as the 16 bits of the nearest bfloat16 (round to nearest, ties to even; NaN
    becomes the quiet NaN of its sign), as numpy.uint16. NumPy's integer arithmetic, so that
    a wheel's runtime needs no ml_dtypes for bfloat16; the same bits as ml_dtypes gives."""
    import numpy

    bits = int(numpy.float32(number).view(numpy.uint32))
    if bits & 0x7FFFFFFF > 0x7F800000:  # NaN: the quiet NaN of its sign, as ml_dtypes makes it
        return numpy.uint16(0x7FC0 | (bits >> 16 & 0x8000))
    return numpy.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)


def _fp8_bits(number: Any, dtype: str, kernel: str, arg: str) -> Any:
    """A float32 as the 8 bits of the nearest value of an FP8 type, through ml_dtypes."""
    import numpy

    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            f"{kernel}(): argument {arg!r} is a {dtype} scalar, whose conversion needs ml_dtypes: pip install ml_dtypes"
        ) from None
    return numpy.array(number, numpy.float32).astype(getattr(ml_dtypes, dtype)).view(numpy.uint8)[()]


def as_constant(value: Any, kind: type) -> Any:
    """`value` as an exact int or bool of `kind` (numpy's too), else None: True is not 1."""
    import numpy

    is_bool = isinstance(value, (bool, numpy.bool_))
    if kind is bool:
        return bool(value) if is_bool else None
    return int(value) if not is_bool and isinstance(value, integral_types()) else None
