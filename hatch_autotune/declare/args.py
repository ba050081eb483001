"""A kernel's arguments (`args`, an array of tables) and the dtypes they may have."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..runtime import DTYPE_SIZES, LAYOUTS, stride_name, unit_stride_constant
from ..runtime.declaration import L2_PROMOTIONS, MAP_ORDERS, OOB_FILLS, SWIZZLES
from .expr import Expr
from .validate import BAD, Table, problems_since, v_bool, v_choice, v_expr, v_ident, v_int, v_list

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
class TensorMapSpec:
    """A TMA descriptor the call encodes from one of its arrays (`tensor-map = {...}`)."""

    array: str
    box: tuple[Expr, ...]  # one per dim of the array, outermost first
    swizzle: str = "none"
    l2_promotion: str = "none"
    oob_fill: str = "zero"
    when: Expr | None = None  # over the config, constants, <T>_size and the arch: the variants that read it (None: all)
    order: str = "declared"  # MAP_ORDERS: the map's dims in the declared order, or the unit-stride axis innermost


@dataclass(frozen=True)
class ArgSpec:
    """A kernel argument: an array (shape over key dims, intent), a scalar, or a tensor map."""

    name: str
    dtype: str  # a dtype name, or the name of one of the kernel's type parameters; "" for a tensor map
    shape: tuple[Expr, ...] | None = None  # None for scalars
    intent: str | None = None  # arrays only
    value: Expr | None = None  # scalars computed from the call (the caller does not pass them)
    align: int | None = None  # arrays: required byte alignment of the pointer (vector loads)
    strides: str = "contiguous"  # arrays: one of LAYOUTS
    optional: bool = False  # arrays: the caller may pass None (a null pointer)
    tensor_map: TensorMapSpec | None = None
    unit_stride_variants: bool = False  # strides "any": variants for a unit and a non-unit innermost stride

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    @property
    def computed(self) -> bool:
        """Not passed by the caller: a computed scalar or a tensor map."""
        return self.value is not None or self.tensor_map is not None

    @property
    def unit_stride_constant(self) -> str | None:
        """The constant whose value says whether a call's innermost stride is one element (set
        from the call's layout, never passed): with `unit-stride-variants = true` only."""
        return unit_stride_constant(self.name) if self.unit_stride_variants else None

    def stride_names(self) -> tuple[str, ...]:
        """The names its strides have in computed scalars' values (none for a C-contiguous one)."""
        if self.shape is None or self.strides == "contiguous":
            return ()
        return tuple(stride_name(self.name, i) for i in range(len(self.shape)))


def parse_args(
    t: Table,
    raw_args: list[Any],
    key_names: set[str],
    constant_names: set[str],
    types: Mapping[str, tuple[str, ...]],
    dim_names: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[ArgSpec]:
    """Every argument of `args` (already checked to be a non-empty array), then their names
    distinct. Computed scalars may read the strides of the arrays declared with strides."""
    stride_names = _declared_stride_names(raw_args)
    args: list[ArgSpec] = []
    for i, raw in enumerate(raw_args):
        arg = parse_arg(Table(raw, f"{t.sub('args')}[{i}]", t.errors), key_names, constant_names, types, dim_names, stride_names)
        if arg is not None:
            args.append(arg)
    seen_names: set[str] = set()
    for i, a in enumerate(args):
        if a.name in seen_names:
            t.errors.append(f"{t.sub('args')}[{i}].name: duplicate argument name {a.name!r}")
        seen_names.add(a.name)
    return args


def _declared_stride_names(raw_args: list[Any]) -> set[str]:
    """`<array>_stride<i>` of every array declared with strides other than C-contiguous, read
    from the raw tables (each is checked as it is parsed)."""
    names: set[str] = set()
    for raw in raw_args:
        declared = isinstance(raw, dict) and isinstance(raw.get("name"), str) and isinstance(raw.get("shape"), list)
        if declared and raw.get("strides", "contiguous") in LAYOUTS[1:]:
            names.update(stride_name(raw["name"], i) for i in range(len(raw["shape"])))
    return names


def parse_arg(
    t: Table,
    key_names: set[str],
    constant_names: set[str],
    types: Mapping[str, tuple[str, ...]],
    dim_names: set[str] = frozenset(),  # type: ignore[assignment]
    stride_names: set[str] = frozenset(),  # type: ignore[assignment]
) -> ArgSpec | None:
    if not t.ok:  # not a table: reported when the Table was made
        return None
    errors = t.errors
    n = len(errors)
    names = key_names | constant_names | dim_names
    name = t.get("name", v_ident, required=True)
    if "tensor-map" in t.data:
        return _parse_tensor_map_arg(t, name, n)
    dtype = t.get("dtype", v_choice(tuple(DTYPES) + tuple(types)), required=True)
    shape = t.get(
        "shape", v_list(v_expr(names, "shapes may use the key dims, free dims (`dims`) and constants"), nonempty=True), default=None
    )
    intent = t.get("intent", v_choice(INTENTS), default=None)
    where = "a scalar's value may use the key dims, free dims, constants and the strides of strided arrays (<array>_stride<i>)"
    value = t.get("value", v_expr(names | stride_names, where), default=None)
    align = t.get("align", v_int(1), default=None)
    strides = t.get("strides", v_choice(LAYOUTS), default="contiguous")
    optional = t.get("optional", v_bool, default=False)
    unit_variants = t.get("unit-stride-variants", v_bool, default=False)
    t.finish()
    if unit_variants is True and strides != "any":
        errors.append(
            f'{t.sub("unit-stride-variants")}: only an array declared with strides = "any" has variants per innermost stride '
            f"(its strides are {strides!r})"
        )
    if align not in (None, BAD) and (align & (align - 1)):
        errors.append(f"{t.sub('align')}: expected a power of two (bytes), got {align}")
    if shape is None:
        for key, what in (
            ("align", "an alignment"),
            ("intent", "an intent"),
            ("strides", "strides"),
            ("optional", "`optional`"),
            ("unit-stride-variants", "`unit-stride-variants`"),
        ):
            if key in t.data:
                errors.append(f"{t.sub(key)}: only arrays (with a shape) have {what}")
    else:
        if intent is None and t.ok and "intent" not in t.data:
            errors.append(f"{t.sub('intent')}: required for arrays; expected one of 'in', 'out', 'inout'")
        if value is not None:
            errors.append(f"{t.sub('value')}: only scalars may be computed from the call")
    if problems_since(errors, n):  # an unknown key alone leaves the argument usable
        return None
    return ArgSpec(
        name=name,
        dtype=dtype,
        shape=shape,
        intent=intent,
        value=value,
        align=align,
        strides=strides,
        optional=optional,
        unit_stride_variants=unit_variants is True,
    )


def _parse_tensor_map_arg(t: Table, name: Any, n: int) -> ArgSpec | None:
    """`{ name, tensor-map = { array, box, swizzle?, l2-promotion?, oob-fill?, when?, order? } }`:
    the box's and `when`'s names are checked with the launch geometry's (layout.py), the array
    by layout.py."""
    errors = t.errors
    for key in ("dtype", "shape", "intent", "value", "align", "strides", "optional", "unit-stride-variants"):
        if key in t.data:
            t.seen.add(key)
            errors.append(f"{t.sub(key)}: a tensor map has no {key}: the call encodes it from the array it names")
    map_t = t.table("tensor-map")
    t.finish()
    if map_t is None or not map_t.ok:
        return None
    array = map_t.get("array", v_ident, required=True)
    box = map_t.get("box", v_list(v_expr(None), nonempty=True), required=True)
    swizzle = map_t.get("swizzle", v_choice(SWIZZLES), default="none")
    l2 = map_t.get("l2-promotion", v_choice(L2_PROMOTIONS), default="none")
    oob = map_t.get("oob-fill", v_choice(OOB_FILLS), default="zero")
    when = map_t.get("when", v_expr(None), default=None)
    order = map_t.get("order", v_choice(MAP_ORDERS), default="declared")
    map_t.finish()
    if box not in (None, BAD) and len(box) > 5:
        errors.append(f"{map_t.sub('box')}: a tensor map has 1 to 5 dims, got {len(box)}")
    if problems_since(errors, n):
        return None
    return ArgSpec(
        name=name,
        dtype="",
        tensor_map=TensorMapSpec(array=array, box=tuple(box), swizzle=swizzle, l2_promotion=l2, oob_fill=oob, when=when, order=order),
    )
