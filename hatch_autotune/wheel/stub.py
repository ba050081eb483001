"""Type stubs for the generated package: `__init__.pyi` and `py.typed` (PEP 561), so that
editors and type checkers see each kernel's call and `select()` as declared in the table.

The stub is a pure function of the spec (byte-identical for the same table). Per kernel it
declares a class `_<name>_kernel` whose `__call__`, `prepare` and `select` spell out the
kernel's parameters, and the module attribute `<name>: _<name>_kernel`:

    def __call__(self, a: _SupportsFloat, x: _GpuArray, y: _GpuArray, *, stream: _Stream = None) -> None
    def select(self, arch: _Arch = None, *, n: int, T: _Literal["float32", "float16"]) -> _Selection

Arrays are typed structurally (anything with `__cuda_array_interface__` or `__dlpack__`, as the
runtime accepts; `| None` for an optional one); their dtypes and shapes, which no type checker
can see, are in the docstrings.
Every name the stub defines itself starts with `_`, which no kernel name does (config.py), and
the builtins it uses are reached through `_builtins` when a kernel is named like one of them.
"""

from __future__ import annotations

import ast
from typing import Any

from .. import __version__
from ..declare.config import ProjectSpec
from ..declare.kernel_decl import kernel_decl
from ..runtime import INT_RANGES, ArgDecl, KernelDecl
from ..runtime.values import COMPLEX_DTYPES

STUB_FILE = "__init__.pyi"
TYPED_MARKER = "py.typed"  # empty: the stub is complete, not partial

_BUILTINS_USED = ("bool", "bytes", "dict", "int", "list", "str", "tuple")

_HEADER = """\
# Type stubs of the generated package, written by hatch-autotune from the kernels' declarations
# (do not edit). Arrays are typed by protocol; their dtypes and shapes are in the docstrings.

from typing import (
    Any as _Any,
    Literal as _Literal,
    Mapping as _Mapping,
    Protocol as _Protocol,
    SupportsComplex as _SupportsComplex,
    SupportsFloat as _SupportsFloat,
    SupportsIndex as _SupportsIndex,
)

from ._runtime import KernelDecl as _KernelDecl, PreparedCall as _PreparedCall, Selection as _Selection, Variant as _Variant
"""

_PROTOCOLS = '''\
class _CudaArrayInterface(_Protocol):
    """A GPU array exposing __cuda_array_interface__ (CuPy, PyTorch, Numba)."""

    @property
    def __cuda_array_interface__(self) -> _Any: ...

class _DLPackArray(_Protocol):
    """An array exporting DLPack (JAX, PyTorch, CuPy); one in host memory is refused at run time."""

    def __dlpack__(self, *args: _Any, **kwargs: _Any) -> _Any: ...

class _CudaStreamProtocol(_Protocol):
    """A stream with __cuda_stream__ (cuda.core, CuPy)."""

    def __cuda_stream__(self) -> _Any: ...

class _TorchStream(_Protocol):
    """A stream with a `cuda_stream` handle (PyTorch)."""

    @property
    def cuda_stream(self) -> {int}: ...

class _PtrStream(_Protocol):
    """A stream with a `ptr` handle (older CuPy)."""

    @property
    def ptr(self) -> {int}: ...

_GpuArray = _CudaArrayInterface | _DLPackArray
_Stream = _CudaStreamProtocol | _TorchStream | _PtrStream | {int} | None
_Arch = {str} | {int} | {tuple}[{int}, {int}] | None
'''

# The runtime Kernel's public attributes, as it declares them.
_ATTRIBUTES = (
    ("name", "{str}"),
    ("entry", "{str}"),
    ("doc", "{str}"),
    ("declaration", "_KernelDecl"),
    ("user_args", "{tuple}[{str}, ...]"),
    ("type_params", "_Mapping[{str}, {tuple}[{str}, ...]]"),
    ("constants", "_Mapping[{str}, {tuple}[_Any, ...]]"),
    ("variants", "_Mapping[{str}, _Variant]"),
    ("checked_calls", "{int}"),
)


def module_docstring(project: ProjectSpec) -> str:
    """The generated module's docstring, as a Python literal (repr), whatever a `doc` contains."""
    lines = [
        f"{project.module}: GPU kernels pre-tuned at build time by hatch-autotune {__version__}.",
        "",
        "Generated file; do not edit. Importing it touches no GPU and needs neither hatch-autotune nor",
        "a CUDA compiler: the binaries were compiled and chosen when the wheel was built.",
        "",
        "Kernels:",
    ]
    for decl in map(kernel_decl, project.kernels.values()):
        lines.append(f"- {decl.summary()}")
        lines.append("  key: " + ", ".join(f"{k.name} in {list(k.buckets)}" for k in decl.key))
    return repr("\n".join(lines) + "\n")


def stub_files(project: ProjectSpec) -> dict[str, bytes]:
    """The files the generated package gets for type checkers, by path inside it."""
    return {STUB_FILE: render_stub(project).encode("utf-8"), TYPED_MARKER: b""}


def render_stub(project: ProjectSpec) -> str:
    """`__init__.pyi` for a project: the module's names and one class per kernel."""

    docstring = _docstring(ast.literal_eval(module_docstring(project)), "")  # the module's own
    names = list(project.kernels)
    b = _Builtins(shadowed=set(names) & set(_BUILTINS_USED))
    parts = [docstring, _HEADER]
    if b.shadowed:
        parts.append("import builtins as _builtins\n")
    parts.append(_PROTOCOLS.format(**{n: b(n) for n in _BUILTINS_USED}))
    parts.append("__all__ = [" + ", ".join(f'"{n}"' for n in [*names, "provenance"]) + "]\n")
    parts.append(f"provenance: {b('dict')}[{b('str')}, _Any]\n")
    for spec in project.kernels.values():
        parts.append(_kernel_class(kernel_decl(spec), b))
    for name in names:
        parts.append(f"{name}: {_class_name(name)}")
    return "\n".join(parts).rstrip("\n") + "\n"


class _Builtins:
    """Spells a builtin type: `int`, or `_builtins.int` where a kernel's name shadows it."""

    def __init__(self, shadowed: set[str]):
        self.shadowed = shadowed

    def __call__(self, name: str) -> str:
        return f"_builtins.{name}" if self.shadowed else name


def _class_name(kernel: str) -> str:
    return f"_{kernel}_kernel"


def _value(v: Any) -> str:
    """A dtype name ("float32"), an integer or a boolean as a Python literal."""
    return f'"{v}"' if isinstance(v, str) else repr(v)


def _choice(name: str, values: tuple[Any, ...], b: _Builtins) -> str:
    """A keyword parameter over a set of values (dtype names, integers or booleans): required
    with several, defaulted with one; both booleans are `bool`."""
    if len(values) == 2 and all(type(v) is bool for v in values):
        return f"{name}: {b('bool')}"
    annotation = "_Literal[" + ", ".join(map(_value, values)) + "]"
    return f"{name}: {annotation} = {_value(values[0])}" if len(values) == 1 else f"{name}: {annotation}"


def _scalar_type(arg: ArgDecl, decl: KernelDecl, b: _Builtins) -> str:
    """What a caller may pass for a scalar: an integer (Python or NumPy) for integer dtypes,
    True or False for bool, a complex or real number where a dtype is complex, any real number
    otherwise (bfloat16 and FP8 too: the runtime converts it to the exact C type)."""
    dtypes = decl.type_params.get(arg.dtype, (arg.dtype,))
    if all(d == "bool" for d in dtypes):
        return b("bool")
    if any(d in COMPLEX_DTYPES for d in dtypes):
        return "_SupportsComplex | _SupportsFloat"
    return "_SupportsIndex" if all(d in INT_RANGES for d in dtypes) else "_SupportsFloat"


def _array_type(arg: ArgDecl) -> str:
    """An array argument: any GPU array; None too where it is optional (the kernel then gets a
    null pointer). No default: a positional argument stays positional."""
    return "_GpuArray | None" if arg.optional else "_GpuArray"


def _docstring(text: str, indent: str) -> str:
    """A docstring literal for any text: backslashes and control characters escaped, and each
    quote that would close the literal (a third in a row, or one at the end)."""
    out: list[str] = []
    quotes = 0  # unescaped quotes just written
    for ch in text.removesuffix("\n"):  # the closing quotes get a line of their own
        if ch == '"':
            out.append('\\"' if quotes == 2 else '"')
            quotes = 0 if quotes == 2 else quotes + 1
            continue
        quotes = 0
        if ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch if ch == "\n" or (ord(ch) >= 32 and ord(ch) != 127) else f"\\x{ord(ch):02x}")
    for i in range(quotes):
        out[-1 - i] = '\\"'
    lines = "".join(out).split("\n")
    body = "\n".join([lines[0], *[(indent + line) if line else "" for line in lines[1:]]])
    closing = f"\n{indent}" if len(lines) > 1 else ""
    return f'{indent}"""{body}{closing}"""'


def _kernel_class(decl: KernelDecl, b: _Builtins) -> str:
    user = decl.user_args
    key_names = [k.name for k in decl.key]
    constants = [_choice(c, v, b) for c, v in decl.call_constants.items()]  # a call sets the layout constants itself
    types = [_choice(t, v, b) for t, v in decl.type_params.items()]
    params = [f"{a.name}: {_array_type(a) if a.is_array else _scalar_type(a, decl, b)}" for a in user]
    self_ = "self"  # config.py refuses `self`, `stream` and `arch` where a call or select() takes them

    def signature(positional: list[str], keywords: list[str]) -> str:
        return ", ".join([self_, *positional, *(["*", *keywords] if keywords else [])])

    call_sig = signature(params, [*constants, "stream: _Stream = None"])
    prepare_sig = signature(params, constants)
    key_params = [f"{k}: {b('int')}" for k in key_names]
    optional_key = [f"{p} = ..." for p in key_params]  # pin() and unpin(): a bucket, or none
    chosen = [_choice(c, v, b) for c, v in decl.constants.items()]  # select() names the layout constants too
    select_sig = signature(["arch: _Arch = None"], [*key_params, *types, *chosen])
    i1, i2 = "    ", "        "
    summary = decl.summary()
    int_, str_ = b("int"), b("str")
    types_ = {n: b(n) for n in _BUILTINS_USED}
    lines = [
        f"class {_class_name(decl.name)}:",
        _docstring(summary + "\n\nCall it to launch; `select()` says which variant runs, and why.", i1),
        "",
        *(f"{i1}{attr}: {annotation.format(**types_)}" for attr, annotation in _ATTRIBUTES),
        "",
        f"{i1}def __call__({call_sig}) -> None:",
        _docstring(decl.call_doc(), i2),
        f"{i1}def select({select_sig}) -> _Selection:",
        _docstring(decl.select_doc(), i2),
        f"{i1}def prepare({prepare_sig}) -> _PreparedCall:",
        f'{i2}"""Check and convert a call\'s arguments without touching the GPU (the arguments of a call, without `stream=`)."""',
        f"{i1}def pin({signature([f'choice: {str_}'], optional_key)}) -> None:",
        f'{i2}"""Run \'default\', a variant id, or \'tuned\' instead of the tuned selection, in every bucket or the one given, until unpin()."""',
        f"{i1}def unpin({signature([], optional_key)}) -> None:",
        f'{i2}"""Drop the program\'s pins of this kernel, or the one of the bucket given (HATCH_AUTOTUNE_PIN\'s stay)."""',
        f"{i1}def binary({self_}, selection: _Selection) -> {b('bytes')}:",
        f'{i2}"""The cubin (or PTX) bytes of a selection, checked against their sha256."""',
        f"{i1}def geometry({self_}, config: _Mapping[{str_}, _Any], types: _Mapping[{str_}, _Any], key: _Mapping[{str_}, {int_}]) -> {b('tuple')}[{b('tuple')}[{int_}, ...], {b('tuple')}[{int_}, ...], {int_}]:",
        f'{i2}"""(grid, block, dynamic shared bytes) of a config at a key: the declared expressions."""',
        f"{i1}@property",
        f"{i1}def buckets({self_}) -> {b('dict')}[{str_}, {b('list')}[{int_}]]:",
        f'{i2}"""The buckets of each key dim: {", ".join(f"{k.name}={list(k.buckets)}" for k in decl.key)}."""',
        f"{i1}@property",
        f"{i1}def provenance({self_}) -> {b('dict')}[{str_}, _Any]:",
        f'{i2}"""Per (types, arch, bucket): the variant, tuned or default, and where it was tuned."""',
        "",
    ]
    return "\n".join(lines)
