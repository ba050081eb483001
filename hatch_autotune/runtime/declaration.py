"""A kernel's declaration as every stage after the build reads it: frozen, typed records
(`KernelDecl` and its `ArgDecl`, `KeyDecl`, `LaunchDecl`), their JSON form in the selection table
and the tuning worker's requests (`from_json`/`to_json`, the one reader and writer), and the prose
that describes a kernel's call, which help() and the generated stubs both show.

The build makes a `KernelDecl` from its validated `KernelSpec` once (declare/kernel_decl.py);
the runtime's Kernel, its PyTorch operators, the tuning worker, the stub writer and the
inspection readers read these records, never the JSON by key.

JSON form (inside table.json's schema 1, per kernel):
  {"entry": str, "doc": str,
   "args": [{"name", "dtype", "kind": "array"|"scalar"|"tensor-map", "shape": [tree], "intent", "align"?,
             "strides"?: "inner"|"any", "optional"?: true, "unit_stride_variants"?: true, "value"?: tree,
             "tensor_map"?: {"array", "box": [tree], "swizzle", "l2_promotion", "oob_fill", "when"?: tree, "order"?: "memory"}}],
   "key": [{"name", "from", "axis": int|null, "buckets": [int], "mapping"}],
   "type_params": {name: [dtype]}, "constants": [{"name", "values": [int|bool]}],
   "dims"?: {name: int}, "key_constraints"?: [tree],
   "launch": {"grid": [tree], "block": [tree], "shared": tree, "cluster"?: [tree]}}
Keys marked ? are written only when they say something (a kernel without them reads as before).
"""

from __future__ import annotations

from .expr import tree_text
from .record import Record
from .values import COMPLEX_DTYPES, ML_DTYPES

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping
    from typing import Any

# The intents of an array argument: read only, written only (its old content is not read), both.
INTENTS = ("in", "out", "inout")
STREAM_DOC = (
    "stream: None (the current stream of the arrays' library, CuPy's or PyTorch's, else the device's "
    "default stream), a cuda.core/CuPy/PyTorch stream, or a raw handle (int)"
)
ARCH_DOC = "arch: 'sm_86', '8.6', 86 or (8, 6); None asks the current CUDA device."
# How a caller passes arrays of bfloat16 and FP8, which a __cuda_array_interface__ cannot name.
NARROW_ARRAYS_DOC = (
    "bfloat16 and FP8 arrays: a PyTorch tensor, a JAX or other DLPack array, or a CuPy array of ml_dtypes' dtype "
    "(a __cuda_array_interface__ typestr cannot name them)"
)


# How an array argument's memory may be laid out (`strides`): C-contiguous (the default); the
# innermost stride one element and the outer ones free (a sliced or padded matrix: the
# leading-dimension form); any strides. Strides are counted in elements.
LAYOUTS = ("contiguous", "inner", "any")
# A tensor map's options, as the TOML spells them (cuTensorMapEncodeTiled's enums: tensor_map.py).
SWIZZLES = ("none", "32B", "64B", "128B")
L2_PROMOTIONS = ("none", "64B", "128B", "256B")
OOB_FILLS = ("zero", "nan")
# A map's dims: the array's axes as declared (the last of unit stride), or in memory order (its
# unit-stride axis innermost, the others as declared: B = W.T, declared [k, n], gives k innermost).
MAP_ORDERS = ("declared", "memory")


def unit_stride_constant(array: str) -> str:
    """The constant that says whether a call's array has a unit innermost stride, for an array
    declared with `unit-stride-variants`: the call sets it from the layout, the template reads it."""
    return f"{array}_unit_stride"


def stride_name(array: str, axis: int) -> str:
    """The name under which a computed scalar's `value` reads an array's stride (in elements)."""
    return f"{array}_stride{axis}"


class TensorMapDecl(Record):
    """A TMA descriptor (CUtensorMap) that the call encodes from one of its arrays: the box is
    the tile one copy moves, one expression per dim of the array, outermost first as `shape`."""

    __slots__ = ("array", "box", "swizzle", "l2_promotion", "oob_fill", "when", "order")
    array: str  # the array argument it describes
    box: tuple[Any, ...]  # expression trees, outermost dim first
    swizzle: str  # SWIZZLES
    l2_promotion: str  # L2_PROMOTIONS
    oob_fill: str  # OOB_FILLS
    when: Any  # an expression tree over the config, constants, <T>_size and the arch; None: every variant reads it
    order: str  # MAP_ORDERS

    def to_json(self) -> dict[str, Any]:
        out = {n: getattr(self, n) for n in ("array", "swizzle", "l2_promotion", "oob_fill")}
        out.update(box=list(self.box), **({"when": self.when} if self.when is not None else {}))
        return out if self.order == "declared" else {**out, "order": self.order}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorMapDecl:
        names = ("array", "swizzle", "l2_promotion", "oob_fill")
        return cls(
            **{n: str(data[n]) for n in names}, box=tuple(data["box"]), when=data.get("when"), order=str(data.get("order", "declared"))
        )


class ArgDecl(Record):
    """One argument of a kernel's C signature, in declared order: an array (a `shape` of
    expression trees over the key dims, free dims and constants), a scalar the caller passes, a
    scalar computed from the call (`value`), or a tensor map the call encodes from one of its
    arrays (`tensor_map`); the caller passes neither of the last two."""

    __slots__ = ("name", "dtype", "shape", "intent", "align", "value", "strides", "optional", "tensor_map", "unit_stride_variants")
    name: str
    dtype: str  # a dtype name, or the name of one of the kernel's type parameters; "" for a tensor map
    shape: tuple[Any, ...] | None  # arrays: one expression tree per dim; None for scalars and tensor maps
    intent: str | None  # arrays: one of INTENTS
    align: int | None  # arrays: the pointer's required alignment in bytes (vector loads)
    value: Any  # a computed scalar's expression tree; None for an argument the caller passes
    strides: str | None  # arrays: one of LAYOUTS; None for the others
    optional: bool  # arrays: the caller may pass None (the kernel gets a null pointer)
    tensor_map: TensorMapDecl | None
    unit_stride_variants: bool  # arrays with strides "any": variants per unit / non-unit innermost stride

    def __init__(
        self,
        name: str,
        dtype: str,
        shape: tuple[Any, ...] | None,
        intent: str | None,
        align: int | None,
        value: Any,
        strides: str | None = None,
        optional: bool = False,
        tensor_map: TensorMapDecl | None = None,
        unit_stride_variants: bool = False,
    ):
        if shape is not None and strides is None:
            strides = "contiguous"
        super().__init__(
            name=name,
            dtype=dtype,
            shape=shape,
            intent=intent,
            align=align,
            value=value,
            strides=strides,
            optional=optional,
            tensor_map=tensor_map,
            unit_stride_variants=unit_stride_variants,
        )

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    @property
    def is_tensor_map(self) -> bool:
        return self.tensor_map is not None

    @property
    def computed(self) -> bool:
        """Not among the caller's arguments: a scalar computed from the call, or a tensor map."""
        return self.value is not None or self.tensor_map is not None

    @property
    def writes(self) -> bool:
        """An array the kernel writes (intent out or inout)."""
        return self.shape is not None and self.intent != "in"

    @property
    def strided(self) -> bool:
        """An array that accepts strides other than C-contiguous: its strides are names."""
        return self.shape is not None and self.strides != "contiguous"

    def to_json(self) -> dict[str, Any]:
        kind = "array" if self.is_array else "tensor-map" if self.tensor_map is not None else "scalar"
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "kind": kind}
        if self.shape is not None:
            out.update(shape=list(self.shape), intent=self.intent)
            if self.align:
                out["align"] = self.align
            if self.strides != "contiguous":
                out["strides"] = self.strides
            if self.optional:
                out["optional"] = True
            if self.unit_stride_variants:
                out["unit_stride_variants"] = True
        if self.value is not None:
            out["value"] = self.value
        if self.tensor_map is not None:
            out["tensor_map"] = self.tensor_map.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArgDecl:
        array = data["kind"] == "array"
        tensor_map = TensorMapDecl.from_json(data["tensor_map"]) if data["kind"] == "tensor-map" else None
        strides = str(data.get("strides", "contiguous")) if array else None
        if strides is not None and strides not in LAYOUTS:
            raise ValueError(f"argument {data['name']!r}: strides {strides!r} is not one of {LAYOUTS}")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(data["shape"]) if array else None,
            intent=str(data["intent"]) if array else None,
            align=int(data["align"]) if array and data.get("align") else None,
            value=data.get("value"),
            strides=strides,
            optional=bool(data.get("optional", False)) if array else False,
            tensor_map=tensor_map,
            unit_stride_variants=bool(data.get("unit_stride_variants", False)) if array else False,
        )


class KeyDecl(Record):
    """A key dim: the size that picks a bucket, read from an array's axis or a scalar argument."""

    __slots__ = ("name", "source", "axis", "buckets", "mapping")
    name: str
    source: str  # the argument it is read from
    axis: int | None  # that array's axis; None when the source is a scalar
    buckets: tuple[int, ...]
    mapping: str  # nearest, floor, ceil or exact (selection.MAPPINGS)

    def source_text(self) -> str:
        """Where a call reads it: `x.shape[0]`, or the scalar's name."""
        return f"{self.source}.shape[{self.axis}]" if self.axis is not None else self.source

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "from": self.source, "axis": self.axis, "buckets": list(self.buckets), "mapping": self.mapping}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeyDecl:
        axis = data["axis"]
        return cls(
            name=str(data["name"]),
            source=str(data["from"]),
            axis=None if axis is None else int(axis),
            buckets=tuple(int(b) for b in data["buckets"]),
            mapping=str(data["mapping"]),
        )


class LaunchDecl(Record):
    """The launch geometry as expression trees over the key, the config and the instance."""

    __slots__ = ("grid", "block", "shared", "cluster")
    grid: tuple[Any, ...]
    block: tuple[Any, ...]
    shared: Any  # dynamic shared memory in bytes
    cluster: tuple[Any, ...] | None  # thread-block cluster dims (x, y, z); None: no cluster

    def __init__(self, grid: tuple[Any, ...], block: tuple[Any, ...], shared: Any, cluster: tuple[Any, ...] | None = None):
        super().__init__(grid=grid, block=block, shared=shared, cluster=cluster)

    def to_json(self) -> dict[str, Any]:
        out = {"grid": list(self.grid), "block": list(self.block), "shared": self.shared}
        if self.cluster is not None:
            out["cluster"] = list(self.cluster)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchDecl:
        cluster = data.get("cluster")
        return cls(
            grid=tuple(data["grid"]), block=tuple(data["block"]), shared=data["shared"], cluster=None if cluster is None else tuple(cluster)
        )


class KernelDecl(Record):
    """What a kernel is to its callers: its entry, arguments, key, type parameters, constants
    and launch geometry. The variants and what each bucket selects are the table's, not this."""

    __slots__ = ("name", "entry", "doc", "args", "key", "type_params", "constants", "launch", "dims", "key_constraints")
    name: str
    entry: str  # the `extern "C"` function's name in every variant's binary
    doc: str
    args: tuple[ArgDecl, ...]  # the C signature's order
    key: tuple[KeyDecl, ...]
    type_params: Mapping[str, tuple[str, ...]]  # name -> the dtypes it may be, in declared order
    constants: Mapping[str, tuple[Any, ...]]  # name -> the values a caller may pass, declared order
    launch: LaunchDecl
    dims: Mapping[str, int]  # free dims (array axes not in the key) -> the size tuning uses
    key_constraints: tuple[Any, ...]  # the constraints that read key dims, as trees: checked at a call's sizes

    def __init__(
        self,
        name: str,
        entry: str,
        doc: str,
        args: tuple[ArgDecl, ...],
        key: tuple[KeyDecl, ...],
        type_params: Mapping[str, tuple[str, ...]],
        constants: Mapping[str, tuple[Any, ...]],
        launch: LaunchDecl,
        dims: Mapping[str, int] | None = None,
        key_constraints: tuple[Any, ...] = (),
    ):
        super().__init__(
            name=name,
            entry=entry,
            doc=doc,
            args=args,
            key=key,
            type_params=type_params,
            constants=constants,
            launch=launch,
            dims=dict(dims or {}),
            key_constraints=tuple(key_constraints),
        )

    @property
    def layout_constants(self) -> dict[str, str]:
        """Constants the call sets from an array's layout (`unit-stride-variants`), never passed:
        constant -> the array it is read from."""
        return {unit_stride_constant(a.name): a.name for a in self.args if a.unit_stride_variants}

    @property
    def call_constants(self) -> dict[str, tuple[Any, ...]]:
        """The constants a caller passes by keyword (the layout constants left out)."""
        layout = self.layout_constants
        return {c: v for c, v in self.constants.items() if c not in layout}

    @property
    def user_args(self) -> tuple[ArgDecl, ...]:
        """The arguments a caller passes, in order (computed scalars and tensor maps left out)."""
        return tuple(a for a in self.args if not a.computed)

    def arg(self, name: str) -> ArgDecl:
        return next(a for a in self.args if a.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "doc": self.doc,
            "args": [a.to_json() for a in self.args],
            "key": [k.to_json() for k in self.key],
            "type_params": {tp: list(values) for tp, values in self.type_params.items()},
            "constants": [{"name": c, "values": list(values)} for c, values in self.constants.items()],  # a list: declared order
            "launch": self.launch.to_json(),
            **({"dims": dict(self.dims)} if self.dims else {}),
            **({"key_constraints": list(self.key_constraints)} if self.key_constraints else {}),
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> KernelDecl:
        """A kernel's declaration from its JSON form; KeyError, TypeError or ValueError for a
        malformed one (the table's reader says which file)."""
        return cls(
            name=name,
            entry=str(data["entry"]),
            doc=str(data.get("doc", "")),
            args=tuple(ArgDecl.from_json(a) for a in data["args"]),
            key=tuple(KeyDecl.from_json(k) for k in data["key"]),
            type_params={str(tp): tuple(str(v) for v in values) for tp, values in data["type_params"].items()},
            constants={str(c["name"]): tuple(c["values"]) for c in data.get("constants", [])},
            launch=LaunchDecl.from_json(data["launch"]),
            dims={str(d): int(v) for d, v in data.get("dims", {}).items()},
            key_constraints=tuple(data.get("key_constraints", ())),
        )

    # ---- the kernel in prose: help() and the stubs show these ---------------------------------

    def summary(self) -> str:
        """`saxpy(a, x, y): what its doc says`: the one line a module's listing gives a kernel."""
        return f"{self.name}({', '.join(a.name for a in self.user_args)}): {self.doc or '(no description)'}"

    def dtype_text(self, dtype: str) -> str:
        """A declared dtype, with the choices of a type parameter: `T in {float32, float16}`."""
        if dtype in self.type_params:
            return f"{dtype} in {{{', '.join(self.type_params[dtype])}}}"
        return dtype

    def call_doc(self) -> str:
        """The call's documentation: its signature, arguments, constants, stream and key."""
        user = self.user_args
        keywords = [*(f"{c}={v[0]!r}" if len(v) == 1 else c for c, v in self.call_constants.items()), "stream=None"]
        lines = [f"{self.name}({', '.join([*(a.name for a in user), '*', *keywords])})", ""]
        if self.doc:
            lines += [self.doc, ""]
        lines.append("Arguments:")
        for a in user:
            dtype = self.dtype_text(a.dtype)
            if a.shape is not None:
                shape = ", ".join(tree_text(t) for t in a.shape)
                align = f", {a.align}-byte aligned" if a.align else ""
                layout = _LAYOUT_TEXT[a.strides or "contiguous"]
                maybe = ", or None" if a.optional else ""
                lines.append(f"  {a.name}: GPU array{maybe}, {dtype}, shape ({shape}), {layout}{align}, intent {a.intent}")
            else:
                lines.append(f"  {a.name}: scalar, {dtype}{_scalar_note(self.type_params.get(a.dtype, (a.dtype,)))}")
        for c, values in self.call_constants.items():
            lines.append(f"  {c}: constant, keyword only, one of {list(values)!r}" + (" (the only value)" if len(values) == 1 else ""))
        for c, array in self.layout_constants.items():
            lines.append(f"  {c}: not passed: whether {array}'s innermost stride is one element (a variant for each)")
        lines.append(f"  {STREAM_DOC}")
        if any(d in ML_DTYPES for a in user if a.is_array for d in self.type_params.get(a.dtype, (a.dtype,))):
            lines.append(NARROW_ARRAYS_DOC)
        computed = [(a.name, tree_text(a.value)) for a in self.args if a.value is not None]
        if computed:
            lines.append("Not passed (computed from the call): " + ", ".join(n if n == e else f"{n} = {e}" for n, e in computed))
        maps = [(a.name, a.tensor_map.array) for a in self.args if a.tensor_map is not None]
        if maps:
            lines.append("Not passed (tensor maps encoded from an array): " + ", ".join(f"{n} of {src}" for n, src in maps))
        if self.dims:
            lines.append("Free dims (any size, read from the arrays): " + ", ".join(self.dims))
        if self.type_params:
            lines.append(
                "Type parameters (from the arrays' dtypes): " + "; ".join(f"{t} in {{{', '.join(v)}}}" for t, v in self.type_params.items())
            )
        lines.append(
            "Key (selects the variant): " + ", ".join(f"{k.name} = {k.source_text()} in {list(k.buckets)} ({k.mapping})" for k in self.key)
        )
        return "\n".join(lines)

    def select_doc(self) -> str:
        """`select()`'s documentation: the key dims, type parameters and constants it takes."""
        keywords = [k.name for k in self.key] + list(self.type_params) + list(self.constants)
        lines = [
            f"{self.name}.select(arch=None, *, {', '.join(keywords)}) -> Selection",
            "",
            "Which variant runs for these sizes on this arch, and why.",
            "",
            ARCH_DOC,
            "Key dims (sizes, each mapped to a bucket):",
        ]
        for k in self.key:
            lines.append(f"  {k.name}: buckets {list(k.buckets)} ({k.mapping}); a call reads it from {k.source_text()}")
        if self.type_params:
            lines.append("Type parameters:")
            for t, values in self.type_params.items():
                lines.append(f"  {t}: one of {', '.join(values)}" + (" (the default)" if len(values) == 1 else ""))
        if self.constants:
            lines.append("Constants:")
            for c, values in self.constants.items():
                lines.append(f"  {c}: one of {list(values)!r}" + (" (the default)" if len(values) == 1 else ""))
        return "\n".join(lines)


_LAYOUT_TEXT = {"contiguous": "C-contiguous", "inner": "any strides with the innermost one 1", "any": "any strides"}


def _scalar_note(dtypes: tuple[str, ...]) -> str:
    """What a caller passes for a scalar of these dtypes, where a plain number does not say it:
    bfloat16 and FP8 from a real number, complex, bool."""
    if all(d == "bool" for d in dtypes):
        return " (True or False)"
    if any(d in COMPLEX_DTYPES for d in dtypes):
        return " (a complex or real number)"
    if any(d in ML_DTYPES for d in dtypes):
        return " (a real number, rounded to nearest even" + (
            ", FP8 through ml_dtypes)" if any(d.startswith("float8") for d in dtypes) else ")"
        )
    return ""
