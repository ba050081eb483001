"""Verification: is a variant's output the reference's, within a tolerance that fits the dtype?

Outputs are poisoned before every verification run (NaN for floats, a fixed pattern for
integers) so that an element the kernel forgot to write is caught, not inherited.
"""

from __future__ import annotations

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


def compare(name: str, got: Any, expected: Any, rtol: float, atol: float) -> str | None:
    """None when `got` matches `expected`; else a one-line reason naming the worst element.

    Every variant of a bucket is verified, so this runs once per config on outputs of hundreds of
    MB: it goes chunk by chunk, in float32 for float16/32 outputs (exact enough against any
    tolerance above 1e-6), and skips the arithmetic where a chunk is bitwise the reference."""
    import numpy as np

    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    g_flat, e_flat = np.ravel(got), np.ravel(expected)
    floating = np.issubdtype(got.dtype, np.floating)
    work = np.result_type(got.dtype, expected.dtype, np.float32) if floating else None
    same_layout = got.dtype == expected.dtype
    unwritten = [0, -1]  # count, first flat index: NaN where the reference has a number
    differ = [0, -1]
    for lo in range(0, g_flat.size, CHUNK):
        gc, ec = g_flat[lo : lo + CHUNK], e_flat[lo : lo + CHUNK]
        if same_layout and np.array_equal(gc.view(np.uint8), ec.view(np.uint8)):
            continue  # bitwise identical (NaN where the reference has NaN included)
        if floating:
            g, e = gc.astype(work, copy=False), ec.astype(work, copy=False)
            nan_e = np.isnan(e)
            _tally(unwritten, np.isnan(g) & ~nan_e, lo)
            err = np.abs(g - e)
            bad = err > atol + rtol * np.abs(e)  # NaN compares false: NaNs are counted above
            bad |= np.isinf(e) & (g != e)  # an infinite reference is matched exactly or not at all
        else:
            bad = gc != ec
        _tally(differ, bad, lo)
    if unwritten[0]:
        idx = np.unravel_index(unwritten[1], got.shape)
        return f"{name}: {unwritten[0]} element(s) are NaN or unwritten, first at {tuple(int(i) for i in idx)}"
    if differ[0]:
        idx = np.unravel_index(differ[1], got.shape)
        at = tuple(int(i) for i in idx)
        g0, e0 = (np.float64(got[idx]), np.float64(expected[idx])) if floating else (got[idx], expected[idx])
        return f"{name}: {differ[0]} element(s) differ (first at {at}: got {g0!r}, expected {e0!r}; rtol={rtol}, atol={atol})"
    return None


def _tally(acc: list[int], mask: Any, offset: int) -> None:
    """Add `mask`'s true elements to acc = [count, first flat index]."""
    import numpy as np

    n = int(np.count_nonzero(mask))
    if n:
        if acc[0] == 0:
            acc[1] = offset + int(np.argmax(mask))
        acc[0] += n
