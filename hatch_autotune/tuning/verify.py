"""Verification: is a variant's output the reference's, within a tolerance that fits the dtype?

Outputs are poisoned before every verification run (NaN for floats, a fixed pattern for
integers) so that an element the kernel forgot to write is caught, not inherited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime.values import DTYPE_SIZES, ML_DTYPES
from .dtypes import dtype_name, kind, numpy_dtype

# (rtol, atol) per dtype: loose enough for a different summation order or one rounding step more
# or less, tight enough to catch a wrong index (off by O(1) on the N(0, 1) inputs).
# - float16/32/64: what verification has always used (float16: ~10 ulps; float32, float64:
#   a summation order's error on large reductions).
# - bfloat16 and FP8 with m explicit mantissa bits: adjacent values differ by at most 2^-m |e|,
#   so rtol = k * 2^-m passes any k-ulp difference. bfloat16 (m = 7): k = 2, rtol 2^-6, for a
#   kernel that rounds more than once (accumulating in bfloat16); FP8 (e4m3fn m = 3, e5m2 m = 2):
#   k = 1, rtol 2^-3 and 2^-2, as FP8 outputs are a float32 result rounded once, and two float32
#   results that differ a little round to the same or adjacent values. atol: one unit roundoff of
#   an O(1) value, 2^-(m+1), the rounding error left where O(1) terms cancel to about zero.
# - float8_e8m0fnu (powers of two, no mantissa): exact; its values are scales computed by exponent
#   extraction, and its next value is twice as large, which is never rounding noise.
# - complex: the tolerance of its parts' dtype, on |got - expected| and |expected|.
# - bool and integers: exact.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-3),
    "float32": (1e-4, 1e-5),
    "float64": (1e-10, 1e-12),
    "bfloat16": (2.0**-6, 2.0**-8),
    "float8_e4m3fn": (2.0**-3, 2.0**-4),
    "float8_e5m2": (2.0**-2, 2.0**-3),
    "float8_e8m0fnu": (0.0, 0.0),
    "complex64": (1e-4, 1e-5),
    "complex128": (1e-10, 1e-12),
    **{name: (0.0, 0.0) for name in DTYPE_SIZES if kind(name) in ("int", "bool")},
}
INT_POISON = 0x5A  # every byte of an integer output


def tolerance(dtype: str, override: tuple[float, float] | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs of `dtype` (the kernel's `tolerance` when it declares
    one); integers and bool compare exactly."""
    if override is not None:
        return override
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {dtype!r}; expected one of {', '.join(TOLERANCES)}")
    return TOLERANCES[dtype]


def poison_byte(dtype: Any) -> int:
    """The byte that poisoned outputs are filled with: all ones is a NaN at every float width
    (float16/32/64, bfloat16, every FP8 format, both parts of a complex); integers and bool get
    INT_POISON (0x5A is no bool: an unwritten bool is a byte that is neither 0 nor 1)."""
    return 0xFF if kind(dtype_name(dtype)) in ("float", "complex") else INT_POISON


CHUNK = 1 << 18  # elements compared per pass: the temporaries stay in cache, not in DRAM


@dataclass(frozen=True)
class Mismatch:
    """What comparing one output found, on the host (compare_host) or on the device
    (device_verify.DeviceComparer): the same record either way, so that the reason a variant is
    rejected does not depend on where it was compared. Indices are flat (C order), -1 for none."""

    name: str
    shape: tuple[int, ...]
    unwritten: int  # NaN where the reference has a number (poison left in place, or a NaN made)
    first_unwritten: int
    differ: int  # outside the tolerance
    first_differ: int
    worst_error: float  # the largest |got - expected| of the differing ones (inf for NaN); 0.0 if none
    got_at: float | complex | int | None  # the values at first_differ (floats as float, complex as complex,
    expected_at: float | complex | int | None  # integers and a bool's byte as int)
    rtol: float
    atol: float
    got_dtype: str = ""  # NumPy names: the message shows integers as their dtype's scalars
    expected_dtype: str = ""

    def message(self) -> str | None:
        """None when the output matches; else a one-line reason naming the first bad element."""
        if self.unwritten:
            at = self._index(self.first_unwritten)
            return f"{self.name}: {self.unwritten} element(s) are NaN or unwritten, first at {at}"
        if self.differ:
            at = self._index(self.first_differ)
            got, expected = self._shown(self.got_at, self.got_dtype), self._shown(self.expected_at, self.expected_dtype)
            return (
                f"{self.name}: {self.differ} element(s) differ (first at {at}: got {got}, expected {expected}; "
                f"rtol={self.rtol}, atol={self.atol}; worst |error| {self.worst_error:.6g})"
            )
        return None

    def _index(self, flat: int) -> tuple[int, ...]:
        index = []
        for extent in reversed(self.shape):
            flat, i = divmod(flat, extent)
            index.append(i)
        return tuple(reversed(index))

    @staticmethod
    def _shown(value: float | complex | int | None, dtype: str) -> str:
        """As the reason has always shown a value: a float64 scalar for floats, a complex128 one
        for complex, a scalar of its own dtype for integers (NumPy's repr: np.float64(7.0),
        np.int32(7)); a bool's byte, which may be neither 0 nor 1 (poison), as np.True_ or 0x5a."""
        import numpy as np

        if isinstance(value, float):
            return repr(np.float64(value))
        if isinstance(value, complex):
            return repr(np.complex128(value))
        if dtype == "bool" and value is not None:
            return repr(np.bool_(value)) if value in (0, 1) else f"{value:#04x} (not a bool)"
        return repr(numpy_dtype(dtype).type(value)) if dtype and value is not None else repr(value)


def compare(name: str, got: Any, expected: Any, rtol: float, atol: float) -> str | None:
    """None when `got` matches `expected`; else a one-line reason naming the first bad element."""
    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    return compare_host(name, got, expected, rtol, atol).message()


def comparison(got_dtype: str, expected_dtype: str) -> str:
    """How outputs of `got_dtype` are compared with a reference of `expected_dtype`: "float"
    (real floats, ml_dtypes' included), "complex" or "exact" (integers, bool). ValueError for a
    complex reference of a real output: its imaginary parts would be ignored."""
    got, expected = kind(got_dtype), kind(expected_dtype)
    if expected == "complex" and got != "complex":
        raise ValueError(f"a {expected_dtype} reference cannot verify a {got_dtype} output: the imaginary parts would be ignored")
    return "exact" if got in ("int", "bool") else got


def work_dtype(got_dtype: str, expected_dtype: str) -> Any:
    """The dtype real floats are compared in: NumPy's result_type(got, expected, float32), with
    float32 for bfloat16 and FP8 (each of their values is a float32): float32 unless float64 (or
    an integer reference) is involved, as compare.cu's work_type."""
    import numpy as np

    def stand_in(name: str) -> Any:
        return np.float32 if name in ML_DTYPES else numpy_dtype(name)

    return np.result_type(stand_in(got_dtype), stand_in(expected_dtype), np.float32)


def compare_host(name: str, got: Any, expected: Any, rtol: float, atol: float) -> Mismatch:
    """Compare two host arrays of one shape. The rule, element by element (compare.cu applies
    the same one on the device):

    - an element bitwise equal to the reference's (same dtype) matches: NaN bits included;
    - real floats are compared in W = work_dtype(got, expected) (float32 for float16/32,
      bfloat16 and FP8: exact enough against any tolerance above 1e-6), rtol and atol cast to
      W as well;
    - complex are compared in float64, on magnitudes: |d| = sqrt(re(d)^2 + im(d)^2), each step
      rounded (no hypot: libm's and CUDA's differ in the last bit); a complex is NaN when a part
      is, infinite when a part is and none is NaN; a real reference is a complex one with zero
      imaginary parts;
    - NaN where the reference has a number is *unwritten* (counted apart, reported first);
    - |g - e| > atol + rtol * |e| differs (NaN compares false: a finite value where the
      reference is NaN is not a difference), and so does anything but the same value where
      the reference is infinite;
    - integers differ when they are not equal; bools when their bytes are not (an unwritten
      bool holds the poison byte 0x5A).

    Every variant of a bucket is verified, so this runs once per config on outputs of hundreds of
    MB: it goes chunk by chunk and skips the arithmetic where a chunk is bitwise the reference."""
    import numpy as np

    g_flat, e_flat = np.ravel(got), np.ravel(expected)
    if g_flat.size != e_flat.size:
        raise ValueError(f"{name}: {g_flat.size} elements against {e_flat.size}")
    g_name, e_name = dtype_name(got.dtype), dtype_name(expected.dtype)
    try:
        rule = comparison(g_name, e_name)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if g_name == e_name == "bool":  # bytes, not truth values: the poison byte is no bool
        g_flat, e_flat = g_flat.view(np.uint8), e_flat.view(np.uint8)
    same_layout = got.dtype == expected.dtype
    if rule == "float":
        work: Any = work_dtype(g_name, e_name)
    elif rule == "complex":
        work = np.dtype(np.float64)
    if rule != "exact":
        with np.errstate(over="ignore"):  # a tolerance past float32's range is inf there, as on the device
            rtol_w, atol_w = work.type(rtol), work.type(atol)
    # Bitwise-equal elements match; the arithmetic agrees unless a tolerance is negative (0 > tol).
    exact_needs_mask = rule != "exact" and same_layout and not (rtol >= 0 and atol >= 0)
    unwritten = [0, -1]  # count, first flat index: NaN where the reference has a number
    differ = [0, -1]
    worst = 0.0
    for lo in range(0, g_flat.size, CHUNK):
        gc, ec = g_flat[lo : lo + CHUNK], e_flat[lo : lo + CHUNK]
        if same_layout and np.array_equal(gc.view(np.uint8), ec.view(np.uint8)):
            continue  # bitwise identical (NaN where the reference has NaN included)
        if rule == "exact":
            bad = gc != ec
        else:
            judge = _judge_float if rule == "float" else _judge_complex
            nan_g, bad, err = judge(gc, ec, work, rtol_w, atol_w)
            _tally(unwritten, nan_g, lo)
            if exact_needs_mask:
                bad &= ~_bits_equal(gc, ec)
        if _tally(differ, bad, lo):
            if rule != "exact":
                errors = err[bad]
                errors[np.isnan(errors)] = np.inf  # NaN against an infinite reference: infinitely wrong
            else:
                errors = np.abs(gc[bad].astype(np.float64) - ec[bad].astype(np.float64))
            worst = max(worst, float(errors.max()))
    got_at: float | complex | int | None = None
    expected_at: float | complex | int | None = None
    if differ[0]:
        i = differ[1]
        scalar = {"float": float, "complex": complex, "exact": int}[rule]
        got_at, expected_at = scalar(g_flat[i]), scalar(e_flat[i])
    return Mismatch(
        name,
        tuple(int(s) for s in got.shape),
        unwritten[0],
        unwritten[1],
        differ[0],
        differ[1],
        worst,
        got_at,
        expected_at,
        rtol,
        atol,
        g_name,
        e_name,
    )


def _judge_float(gc: Any, ec: Any, work: Any, rtol: Any, atol: Any) -> tuple[Any, Any, Any]:
    """(unwritten, differing, |g - e|) for a chunk of real floats, in the work dtype."""
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 0 * inf: NaN, which compares false
        g, e = gc.astype(work, copy=False), ec.astype(work, copy=False)
        unwritten = np.isnan(g) & ~np.isnan(e)
        err = np.abs(g - e)
        bad = err > atol + rtol * np.abs(e)  # NaN compares false: NaNs are counted apart
        bad |= np.isinf(e) & (g != e)  # an infinite reference is matched exactly or not at all
    return unwritten, bad, err


def _parts(chunk: Any) -> tuple[Any, Any]:
    """The real and imaginary parts of a chunk as float64 (zeros for a real chunk)."""
    import numpy as np

    if kind(dtype_name(chunk.dtype)) == "complex":
        return np.real(chunk).astype(np.float64), np.imag(chunk).astype(np.float64)
    real = chunk.astype(np.float64)
    return real, np.zeros_like(real)


def _judge_complex(gc: Any, ec: Any, work: Any, rtol: Any, atol: Any) -> tuple[Any, Any, Any]:
    """(unwritten, differing, |g - e|) for a chunk of complex outputs, in float64 (`work`)."""
    import numpy as np

    (gr, gi), (er, ei) = _parts(gc), _parts(ec)
    with np.errstate(invalid="ignore", over="ignore"):
        nan_e = np.isnan(er) | np.isnan(ei)
        unwritten = (np.isnan(gr) | np.isnan(gi)) & ~nan_e
        dr, di = gr - er, gi - ei
        err = np.sqrt(dr * dr + di * di)
        magnitude = np.sqrt(er * er + ei * ei)
        bad = err > atol + rtol * magnitude
        infinite = (np.isinf(er) | np.isinf(ei)) & ~nan_e
        bad |= infinite & ((gr != er) | (gi != ei))
    return unwritten, bad, err


def _bits_equal(gc: Any, ec: Any) -> Any:
    """Per element: the same bits (a complex128 is two 8-byte words)."""
    import numpy as np

    width = min(gc.itemsize, 8)
    per = gc.itemsize // width
    g, e = gc.view(f"u{width}").reshape(gc.size, per), ec.view(f"u{width}").reshape(ec.size, per)
    return np.all(g == e, axis=1)


def _tally(acc: list[int], mask: Any, offset: int) -> int:
    """Add `mask`'s true elements to acc = [count, first flat index]; how many there were."""
    import numpy as np

    n = int(np.count_nonzero(mask))
    if n:
        if acc[0] == 0:
            acc[1] = offset + int(np.argmax(mask))
        acc[0] += n
    return n
