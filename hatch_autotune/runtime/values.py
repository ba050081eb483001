"""Dtypes and the values that name a kernel instance: sizes and integer ranges per dtype, the
names an instance gives expressions, and how type parameters and constants are spelled in the
selection table. The build side imports these, so the wheel and the build agree."""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping
    from typing import Any

MAX_SIZE = 2**63 - 1  # the largest array size or key value: what an int64 index can reach

# dtype name -> the __cuda_array_interface__ typestr without its byte-order character, for the
# dtypes a typestr names unambiguously. bfloat16 and the FP8 types have none: PyTorch says '<V2'
# for bfloat16 and ml_dtypes '<V1' for four different one-byte types, so a CAI typestr alone never
# identifies them (DLPACK_CODES and the array library's own dtype object do).
TYPESTRS = {
    "float16": "f2", "float32": "f4", "float64": "f8",
    "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8",
    "complex64": "c8", "complex128": "c16", "bool": "b1",
}  # fmt: skip
# dtype name -> (DLPack type code, bits): DLPack names every dtype of the field (dlpack.h v1.1:
# kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6, kDLFloat8_e4m3fn 10,
# kDLFloat8_e5m2 12, kDLFloat8_e8m0fnu 14). The dtype names are PyTorch's, NumPy's and ml_dtypes'.
DLPACK_CODES = {
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "bfloat16": (4, 16), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8), "float8_e8m0fnu": (14, 8),
    "complex64": (5, 64), "complex128": (5, 128), "bool": (6, 8),
}  # fmt: skip
DTYPE_SIZES = {name: bits // 8 for name, (_, bits) in DLPACK_CODES.items()}  # bytes
# The dtypes whose values are real floating-point numbers (ml_dtypes' for the narrow ones): what
# random inputs are drawn as and what a tolerance applies to.
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
COMPLEX_DTYPES = ("complex64", "complex128")
# The dtypes NumPy itself has no type for: ml_dtypes provides them (the build side depends on it;
# a wheel's runtime uses it only when the caller passes such a dtype through NumPy).
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
# integer dtype -> (min, max): what a scalar of that type holds (the config check and the call agree)
INT_RANGES = {
    name: (-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if name[0] == "i" else (0, (1 << (8 * size)) - 1)
    for name, size in DTYPE_SIZES.items()
    if name.startswith(("int", "uint"))
}
# float dtype -> (largest finite value, the magnitude from which a value rounds to infinity):
# a finite scalar at or beyond the second is refused rather than silently turned into inf
FLOAT_RANGES = {
    "float16": (65504.0, 65520.0),  # 2**16 - 2**5, 2**16 - 2**4
    "float32": (3.4028234663852886e38, 3.4028235677973366e38),  # 2**128 - 2**104, 2**128 - 2**103
    "float64": (1.7976931348623157e308, float("inf")),  # 2**1024 - 2**970 exceeds a float: inf
    "bfloat16": (float(2**128 - 2**120), float(2**128 - 2**119)),  # 3.3895e38, and 3.3962e38 from which it rounds to inf
    "float8_e4m3fn": (448.0, 464.0),  # no infinity: a finite value past 464 rounds to NaN
    "float8_e5m2": (57344.0, 61440.0),
    "float8_e8m0fnu": (1.7014118346046923e38, 2.5521177519070385e38),  # 2**127; powers of two only
}


def instance_env(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The names an instance gives expressions: `<T>_size` in bytes per type parameter (whose
    value is a dtype name) and each constant by name (an int or bool). The build side's spec
    imports this, so the wheel and the build evaluate the same shapes and geometry."""
    return {(f"{name}_size" if type(v) is str else name): (DTYPE_SIZES[v] if type(v) is str else v) for name, v in instance.items()}


def types_key(types: Mapping[str, Any]) -> str:
    """'T=float32' or 'CAUSAL=true,RADIUS=2,T=float16': an instance's type parameters and
    constants (sorted, comma-joined), or '-' for a kernel with neither."""
    return ",".join(f"{k}={value_text(types[k])}" for k in sorted(types)) or "-"


def value_text(value: Any) -> str:
    """A dtype name or a constant's value as TOML and C++ write it: `true`, not `True`."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
