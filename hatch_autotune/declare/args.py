"""A kernel's arguments (`args`, an array of tables) and the dtypes they may have."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..runtime import DTYPE_SIZES
from .expr import Expr
from .validate import BAD, Table, problems_since, v_choice, v_expr, v_ident, v_int, v_list

# dtype name -> (C type in a template without the toolkit's headers, C type with them: a kernel
# that declares the `cuda` header set). Without the toolkit's headers float16 is `at_half`, a
# two-byte struct of templates/_dtypes.cuh, and the dtypes that only the toolkit's headers define
# (bfloat16, FP8, complex) are not available (None): the template must #include <cuda_bf16.h>,
# <cuda_fp8.h> or <cuda/std/complex> for them, as it includes what it uses.
_CTYPES: dict[str, tuple[str | None, str]] = {
    "float16": ("at_half", "__half"),
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "int8": ("signed char", "signed char"),
    "int16": ("short", "short"),
    "int32": ("int", "int"),
    "int64": ("long long", "long long"),
    "uint8": ("unsigned char", "unsigned char"),
    "uint16": ("unsigned short", "unsigned short"),
    "uint32": ("unsigned int", "unsigned int"),
    "uint64": ("unsigned long long", "unsigned long long"),
    "bool": ("bool", "bool"),
    "bfloat16": (None, "__nv_bfloat16"),
    "float8_e4m3fn": (None, "__nv_fp8_e4m3"),
    "float8_e5m2": (None, "__nv_fp8_e5m2"),
    "float8_e8m0fnu": (None, "__nv_fp8_e8m0"),
    "complex64": (None, "cuda::std::complex<float>"),
    "complex128": (None, "cuda::std::complex<double>"),
}
# dtype name -> (C type without the toolkit's headers, size in bytes); the sizes are the runtime's,
# which the wheel uses too. TOOLKIT_CTYPES: the C type with them.
DTYPES: dict[str, tuple[str | None, int]] = {name: (bare, DTYPE_SIZES[name]) for name, (bare, _) in _CTYPES.items()}
TOOLKIT_CTYPES: dict[str, str] = {name: toolkit for name, (_, toolkit) in _CTYPES.items()}
TOOLKIT_ONLY = tuple(name for name, (bare, _) in _CTYPES.items() if bare is None)  # need the `cuda` header set


def c_type(dtype: str, toolkit_headers: bool) -> str:
    """The C type a template sees for a dtype; `toolkit_headers`: the kernel declares the `cuda`
    header set (its checks refuse a toolkit-only dtype without it)."""
    bare = DTYPES[dtype][0]
    if toolkit_headers:
        return TOOLKIT_CTYPES[dtype]
    assert bare is not None, f"{dtype} needs the `cuda` header set"
    return bare


INTENTS = ("in", "out", "inout")


@dataclass(frozen=True)
class ArgSpec:
    """A kernel argument: an array (shape over key dims, intent) or a scalar."""

    name: str
    dtype: str  # a dtype name, or the name of one of the kernel's type parameters
    shape: tuple[Expr, ...] | None = None  # None for scalars
    intent: str | None = None  # arrays only
    value: Expr | None = None  # scalars computed from key dims (the caller does not pass them)
    align: int | None = None  # arrays: required byte alignment of the pointer (vector loads)

    @property
    def is_array(self) -> bool:
        return self.shape is not None


def parse_args(
    t: Table, raw_args: list[Any], key_names: set[str], constant_names: set[str], types: Mapping[str, tuple[str, ...]]
) -> list[ArgSpec]:
    """Every argument of `args` (already checked to be a non-empty array), then their names distinct."""
    args: list[ArgSpec] = []
    for i, raw in enumerate(raw_args):
        arg = parse_arg(Table(raw, f"{t.sub('args')}[{i}]", t.errors), key_names, constant_names, types)
        if arg is not None:
            args.append(arg)
    seen_names: set[str] = set()
    for i, a in enumerate(args):
        if a.name in seen_names:
            t.errors.append(f"{t.sub('args')}[{i}].name: duplicate argument name {a.name!r}")
        seen_names.add(a.name)
    return args


def parse_arg(t: Table, key_names: set[str], constant_names: set[str], types: Mapping[str, tuple[str, ...]]) -> ArgSpec | None:
    if not t.ok:  # not a table: reported when the Table was made
        return None
    errors = t.errors
    n = len(errors)
    names = key_names | constant_names
    name = t.get("name", v_ident, required=True)
    dtype = t.get("dtype", v_choice(tuple(DTYPES) + tuple(types)), required=True)
    shape = t.get("shape", v_list(v_expr(names, "shapes may use the key dims and constants"), nonempty=True), default=None)
    intent = t.get("intent", v_choice(INTENTS), default=None)
    value = t.get("value", v_expr(names, "a scalar's value may use the key dims and constants"), default=None)
    align = t.get("align", v_int(1), default=None)
    t.finish()
    if align not in (None, BAD) and (align & (align - 1)):
        errors.append(f"{t.sub('align')}: expected a power of two (bytes), got {align}")
    if align not in (None, BAD) and shape is None:
        errors.append(f"{t.sub('align')}: only arrays have an alignment")
    if shape is None:
        if intent is not None:
            errors.append(f"{t.sub('intent')}: only arrays (with a shape) have an intent")
    else:
        if intent is None and t.ok and "intent" not in t.data:
            errors.append(f"{t.sub('intent')}: required for arrays; expected one of 'in', 'out', 'inout'")
        if value is not None:
            errors.append(f"{t.sub('value')}: only scalars may be computed from the key")
    if problems_since(errors, n):  # an unknown key alone leaves the argument usable
        return None
    return ArgSpec(name=name, dtype=dtype, shape=shape, intent=intent, value=value, align=align)
