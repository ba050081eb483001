"""Our dtype names as NumPy dtypes, and what kind of number each one holds.

NumPy has no bfloat16 or FP8 type: ml_dtypes provides them (a build-side dependency), so
`np.dtype("bfloat16")` works only once ml_dtypes is imported. Every tuning module turns a dtype
name into a NumPy dtype here, so that the import happens where it is needed and nowhere else.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from ..runtime.values import COMPLEX_DTYPES, DTYPE_SIZES, FLOAT_DTYPES, ML_DTYPES

Kind = Literal["float", "complex", "bool", "int"]


@cache
def numpy_dtype(name: str) -> Any:
    """The NumPy dtype of one of our dtype names (ml_dtypes' for bfloat16 and FP8); ValueError
    for a name that is none of ours."""
    import numpy as np

    if name not in DTYPE_SIZES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_SIZES)}")
    if name in ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError as exc:  # a build-side dependency: only a broken environment lacks it
            raise ImportError(f"dtype {name} needs the ml_dtypes package (pip install ml_dtypes)") from exc
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype_name(dtype: Any) -> str:
    """Our name of a NumPy dtype (or of a name): ml_dtypes' dtypes are named as we name them."""
    import numpy as np

    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def kind(name: str) -> Kind:
    """What a dtype's values are: real floats (ml_dtypes' included), complex, bool or integers.
    NumPy's dtype.kind cannot say it: ml_dtypes' bfloat16 is kind 'V', its float8_e5m2 kind 'f'."""
    if name in FLOAT_DTYPES:
        return "float"
    if name in COMPLEX_DTYPES:
        return "complex"
    if name == "bool":
        return "bool"
    if name in DTYPE_SIZES:
        return "int"
    raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_SIZES)}")


def part_dtype(name: str) -> str:
    """The dtype of a complex dtype's real and imaginary parts."""
    return {"complex64": "float32", "complex128": "float64"}[name]
