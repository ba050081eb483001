"""A kernel's declaration as every stage after the build reads it: frozen, typed records
(`KernelDecl` and its `ArgDecl`, `KeyDecl`, `LaunchDecl`), their JSON form in the selection table
and the tuning worker's requests (`from_json`/`to_json`, the one reader and writer), and the prose
that describes a kernel's call, which help() and the generated stubs both show.

The build makes a `KernelDecl` from its validated `KernelSpec` once (declare/kernel_decl.py);
the runtime's Kernel, its PyTorch operators, the tuning worker, the stub writer and the
inspection readers read these records, never the JSON by key.

JSON form (inside table.json's schema 1, per kernel):
  {"entry": str, "doc": str,
   "args": [{"name", "dtype", "kind": "array"|"scalar", "shape": [tree], "intent", "align"?, "value"?: tree}],
   "key": [{"name", "from", "axis": int|null, "buckets": [int], "mapping"}],
   "type_params": {name: [dtype]}, "constants": [{"name", "values": [int|bool]}],
   "launch": {"grid": [tree], "block": [tree], "shared": tree}}
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


class ArgDecl(Record):
    """One argument of a kernel's C signature, in declared order: an array (a `shape` of
    expression trees over the key dims and constants), a scalar the caller passes, or a scalar
    computed from the key (`value`), which the caller does not pass."""

    __slots__ = ("name", "dtype", "shape", "intent", "align", "value")
    name: str
    dtype: str  # a dtype name, or the name of one of the kernel's type parameters
    shape: tuple[Any, ...] | None  # arrays: one expression tree per dim; None for scalars
    intent: str | None  # arrays: one of INTENTS
    align: int | None  # arrays: the pointer's required alignment in bytes (vector loads)
    value: Any  # a computed scalar's expression tree; None for an argument the caller passes

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    @property
    def computed(self) -> bool:
        """A scalar the call computes from the key: not among the caller's arguments."""
        return self.value is not None

    @property
    def writes(self) -> bool:
        """An array the kernel writes (intent out or inout)."""
        return self.shape is not None and self.intent != "in"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "kind": "array" if self.is_array else "scalar"}
        if self.shape is not None:
            out.update(shape=list(self.shape), intent=self.intent)
            if self.align:
                out["align"] = self.align
        if self.value is not None:
            out["value"] = self.value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArgDecl:
        array = data["kind"] == "array"
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(data["shape"]) if array else None,
            intent=str(data["intent"]) if array else None,
            align=int(data["align"]) if array and data.get("align") else None,
            value=data.get("value"),
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

    __slots__ = ("grid", "block", "shared")
    grid: tuple[Any, ...]
    block: tuple[Any, ...]
    shared: Any  # dynamic shared memory in bytes

    def to_json(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "block": list(self.block), "shared": self.shared}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchDecl:
        return cls(grid=tuple(data["grid"]), block=tuple(data["block"]), shared=data["shared"])


class KernelDecl(Record):
    """What a kernel is to its callers: its entry, arguments, key, type parameters, constants
    and launch geometry. The variants and what each bucket selects are the table's, not this."""

    __slots__ = ("name", "entry", "doc", "args", "key", "type_params", "constants", "launch")
    name: str
    entry: str  # the `extern "C"` function's name in every variant's binary
    doc: str
    args: tuple[ArgDecl, ...]  # the C signature's order
    key: tuple[KeyDecl, ...]
    type_params: Mapping[str, tuple[str, ...]]  # name -> the dtypes it may be, in declared order
    constants: Mapping[str, tuple[Any, ...]]  # name -> the values a caller may pass, declared order
    launch: LaunchDecl

    @property
    def user_args(self) -> tuple[ArgDecl, ...]:
        """The arguments a caller passes, in order (computed scalars left out)."""
        return tuple(a for a in self.args if a.value is None)

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
        keywords = [*(f"{c}={v[0]!r}" if len(v) == 1 else c for c, v in self.constants.items()), "stream=None"]
        lines = [f"{self.name}({', '.join([*(a.name for a in user), '*', *keywords])})", ""]
        if self.doc:
            lines += [self.doc, ""]
        lines.append("Arguments:")
        for a in user:
            dtype = self.dtype_text(a.dtype)
            if a.shape is not None:
                shape = ", ".join(tree_text(t) for t in a.shape)
                align = f", {a.align}-byte aligned" if a.align else ""
                lines.append(f"  {a.name}: GPU array, {dtype}, shape ({shape}), C-contiguous{align}, intent {a.intent}")
            else:
                lines.append(f"  {a.name}: scalar, {dtype}{_scalar_note(self.type_params.get(a.dtype, (a.dtype,)))}")
        for c, values in self.constants.items():
            lines.append(f"  {c}: constant, keyword only, one of {list(values)!r}" + (" (the only value)" if len(values) == 1 else ""))
        lines.append(f"  {STREAM_DOC}")
        if any(d in ML_DTYPES for a in user if a.is_array for d in self.type_params.get(a.dtype, (a.dtype,))):
            lines.append(NARROW_ARRAYS_DOC)
        computed = [(a.name, tree_text(a.value)) for a in self.args if a.value is not None]
        if computed:
            lines.append("Not passed (computed from the key): " + ", ".join(n if n == e else f"{n} = {e}" for n, e in computed))
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
