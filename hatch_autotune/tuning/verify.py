"""Verification: is a variant's output the reference's, within a tolerance that fits the dtype?

Outputs are poisoned before every verification run (NaN for floats, a fixed pattern for
integers) so that an element the kernel forgot to write is caught, not inherited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# (rtol, atol) per dtype: loose enough for a different summation order, tight enough to catch
# a wrong index (which is off by O(1)).
TOLERANCES = {
    "float16": (1e-2, 1e-3),
    "float32": (1e-4, 1e-5),
    "float64": (1e-10, 1e-12),
}
INT_POISON = 0x5A  # every byte of an integer output


def tolerance(dtype: str, override: tuple[float, float] | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs of `dtype`; integers compare exactly."""
    if override is not None:
        return override
    return TOLERANCES.get(dtype, (0.0, 0.0))


def poison_byte(dtype: Any) -> int:
    """The byte that poisoned outputs are filled with: all ones is a NaN at every float width."""
    import numpy as np

    return 0xFF if np.issubdtype(dtype, np.floating) else INT_POISON


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
    got_at: float | int | None  # the values at first_differ (floats as float, integers as int)
    expected_at: float | int | None
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
    def _shown(value: float | int | None, dtype: str) -> str:
        """As the reason has always shown a value: a float64 scalar for floats, a scalar of its own
        dtype for integers (NumPy's repr: np.float64(7.0), np.int32(7))."""
        import numpy as np

        if isinstance(value, float):
            return repr(np.float64(value))
        return repr(np.dtype(dtype).type(value)) if dtype and value is not None else repr(value)


def compare(name: str, got: Any, expected: Any, rtol: float, atol: float) -> str | None:
    """None when `got` matches `expected`; else a one-line reason naming the first bad element."""
    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    return compare_host(name, got, expected, rtol, atol).message()


def compare_host(name: str, got: Any, expected: Any, rtol: float, atol: float) -> Mismatch:
    """Compare two host arrays of one shape. The rule, element by element (compare.cu applies
    the same one on the device):

    - an element bitwise equal to the reference's (same dtype) matches: NaN bits included;
    - floats are compared in W = result_type(got, expected, float32) (float32 for float16/32:
      exact enough against any tolerance above 1e-6), rtol and atol cast to W as well;
    - NaN where the reference has a number is *unwritten* (counted apart, reported first);
    - |g - e| > atol + rtol * |e| differs (NaN compares false: a finite value where the
      reference is NaN is not a difference), and so does anything but the same infinity where
      the reference is infinite;
    - integers differ when they are not equal.

    Every variant of a bucket is verified, so this runs once per config on outputs of hundreds of
    MB: it goes chunk by chunk and skips the arithmetic where a chunk is bitwise the reference."""
    import numpy as np

    g_flat, e_flat = np.ravel(got), np.ravel(expected)
    if g_flat.size != e_flat.size:
        raise ValueError(f"{name}: {g_flat.size} elements against {e_flat.size}")
    floating = np.issubdtype(got.dtype, np.floating)
    same_layout = got.dtype == expected.dtype
    if floating:
        work: Any = np.result_type(got.dtype, expected.dtype, np.float32)
        with np.errstate(over="ignore"):  # a tolerance past float32's range is inf there, as on the device
            rtol_w, atol_w = work.type(rtol), work.type(atol)
    # Bitwise-equal elements match; the arithmetic agrees unless a tolerance is negative (0 > tol).
    exact_needs_mask = floating and same_layout and not (rtol >= 0 and atol >= 0)
    unwritten = [0, -1]  # count, first flat index: NaN where the reference has a number
    differ = [0, -1]
    worst = 0.0
    for lo in range(0, g_flat.size, CHUNK):
        gc, ec = g_flat[lo : lo + CHUNK], e_flat[lo : lo + CHUNK]
        if same_layout and np.array_equal(gc.view(np.uint8), ec.view(np.uint8)):
            continue  # bitwise identical (NaN where the reference has NaN included)
        if floating:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 0 * inf: NaN, which compares false
                g, e = gc.astype(work, copy=False), ec.astype(work, copy=False)
                nan_e = np.isnan(e)
                _tally(unwritten, np.isnan(g) & ~nan_e, lo)
                err = np.abs(g - e)
                bad = err > atol_w + rtol_w * np.abs(e)  # NaN compares false: NaNs are counted above
                bad |= np.isinf(e) & (g != e)  # an infinite reference is matched exactly or not at all
            if exact_needs_mask:
                bad &= gc.view(f"u{gc.itemsize}") != ec.view(f"u{ec.itemsize}")
        else:
            bad = gc != ec
        if _tally(differ, bad, lo):
            if floating:
                errors = err[bad]
                errors[np.isnan(errors)] = np.inf  # NaN against an infinite reference: infinitely wrong
            else:
                errors = np.abs(gc[bad].astype(np.float64) - ec[bad].astype(np.float64))
            worst = max(worst, float(errors.max()))
    got_at: float | int | None = None
    expected_at: float | int | None = None
    if differ[0]:
        i = differ[1]
        got_at, expected_at = (float(g_flat[i]), float(e_flat[i])) if floating else (int(g_flat[i]), int(e_flat[i]))
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
        got.dtype.name,
        expected.dtype.name,
    )


def _tally(acc: list[int], mask: Any, offset: int) -> int:
    """Add `mask`'s true elements to acc = [count, first flat index]; how many there were."""
    import numpy as np

    n = int(np.count_nonzero(mask))
    if n:
        if acc[0] == 0:
            acc[1] = offset + int(np.argmax(mask))
        acc[0] += n
    return n
