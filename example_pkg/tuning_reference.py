"""NumPy references that the tuner verifies every measured variant against (`reference = ...` in
pyproject.toml). Why: without one, variants are checked against the default config's outputs, and
a mistake the whole template shares (a wrong fragment layout, a swizzle off by one) would pass.

They compute in float32 from the same bfloat16/float16 inputs (ml_dtypes arrays, strided views as
the declared layout makes them), as the kernels do; the tuner compares in float32 with the output
dtype's tolerance. Used only while tuning: not part of the wheel.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def gemm(A: np.ndarray, B: np.ndarray, **_: Any) -> dict[str, np.ndarray]:
    return {"C": A.astype(np.float32) @ B.astype(np.float32)}


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    mean_square = np.mean(np.square(x), axis=1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(mean_square + np.float32(eps)) * w.astype(np.float32)).astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: Any, **_: Any) -> dict[str, np.ndarray]:
    return {"y": _rmsnorm(x.astype(np.float32), w, float(eps))}


def add_rmsnorm(x: np.ndarray, residual: np.ndarray, w: np.ndarray, eps: Any, **_: Any) -> dict[str, np.ndarray]:
    # the kernel stores the sum in the input type and normalises what it stored
    summed = (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
    return {"y": _rmsnorm(summed.astype(np.float32), w, float(eps)), "residual_out": summed.astype(np.float32)}
