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


def poison(host: Any) -> Any:
    """A buffer like `host` that no correct kernel leaves as it is."""
    import numpy as np

    if np.issubdtype(host.dtype, np.floating):
        return np.full_like(host, np.nan)
    out = np.empty_like(host)
    out.view(np.uint8)[...] = INT_POISON
    return out


def compare(name: str, got: Any, expected: Any, rtol: float, atol: float) -> str | None:
    """None when `got` matches `expected`; else a one-line reason naming the worst element."""
    import numpy as np

    if got.shape != expected.shape:
        return f"{name}: shape {got.shape}, expected {expected.shape}"
    g = got.astype(np.float64) if np.issubdtype(got.dtype, np.floating) else got
    e = expected.astype(np.float64) if np.issubdtype(expected.dtype, np.floating) else expected
    if np.issubdtype(got.dtype, np.floating):
        nan_g, nan_e = np.isnan(g), np.isnan(e)
        if np.any(nan_g & ~nan_e):
            idx = np.unravel_index(int(np.argmax(nan_g & ~nan_e)), g.shape)
            count = int(np.count_nonzero(nan_g & ~nan_e))
            return f"{name}: {count} element(s) are NaN or unwritten, first at {tuple(int(i) for i in idx)}"
        err = np.abs(g - e)
        limit = atol + rtol * np.abs(e)
        bad = (err > limit) & ~nan_e & ~(np.isinf(e) & (g == e))
    else:
        bad = g != e
    if np.any(bad):
        idx = np.unravel_index(int(np.argmax(bad)), g.shape)
        count = int(np.count_nonzero(bad))
        at = tuple(int(i) for i in idx)
        return f"{name}: {count} element(s) differ (first at {at}: got {g[idx]!r}, expected {e[idx]!r}; rtol={rtol}, atol={atol})"
    return None
