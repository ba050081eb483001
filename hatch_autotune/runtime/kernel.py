"""Run-time loader, copied verbatim into every wheel that hatch-autotune builds.

It must work with the standard library alone at import time (cuda-python is imported at the
first launch or device query), and it must never import ``hatch_autotune``: a built wheel
carries this file as ``<module>/_runtime.py``. Logic that the build side needs too (expression
trees, key -> bucket mapping, arch fallback, dtype sizes, the CUDA error funnel `check_cuda`)
lives here, so there is one copy. Every CUDA call goes through one `CudaApi`, and all the
runtime learns from CUDA lives in one `GpuState`; `use_gpu(api)` is the seam for tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading

try:  # weakref.WeakSet itself, from the module that threading has imported already
    from _weakrefset import WeakSet
except ImportError:  # pragma: no cover - depends on the interpreter
    from weakref import WeakSet

try:  # CPython's built-in SHA-256: no OpenSSL to load, so importing stays fast
    from _sha256 import sha256 as _sha256  # Python <= 3.11
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha2 import sha256 as _sha256  # Python >= 3.12
    except ImportError:
        from hashlib import sha256 as _sha256

# Annotations are never evaluated (see the __future__ import), so `typing` and `dataclasses`
# are not imported at run time: together they were about half of a cold import of this module.
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any, Callable, Mapping, Sequence


class _Record:
    """A small immutable record: what a frozen dataclass gives, without importing dataclasses."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any):
        values = dict(zip(self.__slots__, args), **kwargs)
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(repr(getattr(self, n)) for n in self.__slots__))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

# --------------------------------------------------------------------------------------------
# The selection table (table.json): the one definition of the wheel's data file. The build
# writes it with `table_bytes` (hatch_autotune.wheel.table fills it), and the runtime, the
# tuning worker and the command read it with `parse_table`. Shape (schema 1):
#   {"schema": 1, "module": str, "archs": [table arch], "ptx": {table arch: PTX arch},
#    "provenance": {...}, "kernels": {name: {entry, doc, args, key, type_params, launch,
#      "constants": [{name, values}],
#      "variants": {variant id: {config, types, index, binaries: {arch: {file, sha256, ...}},
#                                resources: {arch: {...}}}},
#      "select": {types key: {table arch: [{bucket: [int], variant, tuned, provenance}]}}}}}

TABLE_SCHEMA = 1
TABLE_FILE = "table.json"


class TableError(ValueError):
    """A selection table that cannot be read: not JSON, not a table, or another schema."""


def table_bytes(table: Mapping[str, Any]) -> bytes:
    """The one writer of table.json: sorted keys and a fixed layout, so equal tables give equal
    bytes (the wheel is reproducible, and the generated module pins the table's sha256)."""
    return (json.dumps(table, sort_keys=True, indent=1) + "\n").encode()


MAX_SIZE = 2**63 - 1  # the largest array size or key value: what an int64 index can reach
MAX_JSON_DEPTH = 160  # deeper than any file hatch-autotune writes (expression trees included)


def load_json(data: bytes | bytearray | str) -> Any:
    """The one decoder of hatch-autotune's data files (lock file, selection table, cache
    entries): ValueError for text that is not JSON, or that nests deeper than MAX_JSON_DEPTH,
    which the decoder, and later whatever walks the value, would recurse into."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return value


def parse_table(data: Any, where: str) -> dict[str, Any]:
    """The one reader of table.json (bytes, or already-decoded JSON): the table, or TableError
    naming `where` and what is wrong (a newer schema says to upgrade)."""
    if isinstance(data, (bytes, bytearray, str)):
        try:
            data = load_json(data)
        except ValueError as exc:
            raise TableError(f"{where}: corrupt selection table: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict) or "schema" not in data:
        raise TableError(f"{where}: not a hatch-autotune selection table (expected a JSON object with \"schema\" and \"kernels\")")
    schema = data["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise TableError(f"{where}: selection table has no valid schema version (got {schema!r})")
    if schema > TABLE_SCHEMA:
        raise TableError(
            f"{where}: selection table schema {schema} is newer than this reader understands "
            f"(schema {TABLE_SCHEMA}); upgrade hatch-autotune, or rebuild the wheel with this one"
        )
    if schema != TABLE_SCHEMA:
        raise TableError(f"{where}: selection table schema {schema} is not supported (this reader understands schema {TABLE_SCHEMA})")
    return data

# --------------------------------------------------------------------------------------------
# Expression trees.
#
# Config expressions (constraints, shapes, grid/block) are parsed and whitelisted at build time
# by hatch_autotune.declare.expr and shipped as JSON trees: a number or bool is a literal; a list is
# [op, *operands] with op one of the keys of _OPS, "n" (a name), "neg", "not", "and", "or",
# "cmp" (chained comparison: [cmp, a, [op, b], [op, c], ...]), "if" (ternary) and "call".
# Nothing read from a data file is ever passed to eval().


def cdiv(a: int, b: int) -> int:
    """Ceiling division of integers, the usual grid-size helper."""
    return -(-a // b)


FUNCTIONS: dict[str, Callable[..., Any]] = {"cdiv": cdiv, "min": min, "max": max}

# Bounds that keep every evaluation cheap, whatever a config or a table holds: `9**9**9` or a
# product of huge sizes stops at MAX_INT_BITS instead of taking the machine's time and memory,
# a string axis never meets arithmetic (`S * 10**10` would build a 10 GB string), and trees
# deeper than MAX_EXPR_DEPTH are refused before anything recurses into them.
MAX_INT_BITS = 1024
MAX_EXPR_DEPTH = 64
_INT_LIMIT = 1 << MAX_INT_BITS


class ExpressionError(ValueError):
    """An expression that cannot be evaluated within bounds, or a malformed tree (a corrupt or
    foreign table)."""


def _power(a: Any, b: Any) -> Any:
    """a ** b, refused before it is computed when an integer result would exceed the bound."""
    if type(a) is int and type(b) is int and b > 0 and (abs(a).bit_length() - 1) * b >= MAX_INT_BITS:
        raise ExpressionError(f"{short_repr(a)} ** {short_repr(b)} has more than {MAX_INT_BITS} bits")
    return a**b


def _arithmetic(op: str, f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def run(a: Any, b: Any) -> Any:
        if type(a) is str or type(b) is str:
            raise ExpressionError(f"`{op}` applied to a string ({short_repr(a)} {op} {short_repr(b)}); arithmetic takes numbers")
        value = f(a, b)
        if type(value) is int:
            if not -_INT_LIMIT < value < _INT_LIMIT:
                raise ExpressionError(f"{op} gives an integer of more than {MAX_INT_BITS} bits")
        elif type(value) is complex:  # a negative base to a fractional power
            raise ExpressionError(f"{short_repr(a)} ** {short_repr(b)} is not a real number")
        return value

    return run


_OPS: dict[str, Callable[[Any, Any], Any]] = {
    op: _arithmetic(op, f)
    for op, f in {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a / b,
        "//": lambda a, b: a // b,
        "%": lambda a, b: a % b,
        "**": _power,
    }.items()
}
_CMPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _negate(a: Any) -> Any:
    if type(a) is str:
        raise ExpressionError(f"`-` applied to a string ({a!r}); arithmetic takes numbers")
    return -a


def compile_expr(tree: Any) -> Callable[[Mapping[str, Any]], Any]:
    """Turn a tree into a closure over an environment mapping; built once, called per launch.
    Building raises ExpressionError for a malformed or too deep tree; evaluating raises only
    ExpressionError (a division by zero, a bound exceeded, a string in arithmetic...)."""
    fn = _compile(tree, 0)

    def evaluate(env: Mapping[str, Any]) -> Any:
        try:
            return fn(env)
        except ExpressionError:
            raise
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
            raise ExpressionError(f"{type(exc).__name__}: {exc}") from None

    return evaluate


def _compile(tree: Any, depth: int) -> Callable[[Mapping[str, Any]], Any]:
    if depth > MAX_EXPR_DEPTH:
        raise ExpressionError(f"expression tree nested deeper than {MAX_EXPR_DEPTH} levels")
    if isinstance(tree, (bool, int, float)):
        if isinstance(tree, int) and not -_INT_LIMIT < tree < _INT_LIMIT:
            raise ExpressionError(f"an integer literal of more than {MAX_INT_BITS} bits")
        return lambda env, v=tree: v
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise ExpressionError(f"not an expression tree: {short_repr(tree)}")
    op, args = tree[0], tree[1:]
    d = depth + 1
    if op == "n" and len(args) == 1 and isinstance(args[0], str):
        name = args[0]
        return lambda env: env[name]
    if op in _OPS and len(args) == 2:
        f, a, b = _OPS[op], _compile(args[0], d), _compile(args[1], d)
        return lambda env: f(a(env), b(env))
    if op == "neg" and len(args) == 1:
        a = _compile(args[0], d)
        return lambda env: _negate(a(env))
    if op == "not" and len(args) == 1:
        a = _compile(args[0], d)
        return lambda env: not a(env)
    if op in ("and", "or") and len(args) >= 2:
        parts = [_compile(x, d) for x in args]
        if op == "and":
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if op == "cmp" and len(args) >= 2:
        first = _compile(args[0], d)
        rest = []
        for item in args[1:]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0] in _CMPS):
                raise ExpressionError(f"bad comparison in expression tree: {short_repr(item)}")
            rest.append((_CMPS[item[0]], _compile(item[1], d)))

        def chained(env: Mapping[str, Any]) -> bool:
            left = first(env)
            for cmp, right_fn in rest:
                right = right_fn(env)
                if not cmp(left, right):
                    return False
                left = right
            return True

        return chained
    if op == "if" and len(args) == 3:
        c, a, b = (_compile(x, d) for x in args)
        return lambda env: a(env) if c(env) else b(env)
    if op == "call" and len(args) >= 1 and isinstance(args[0], str) and args[0] in FUNCTIONS:
        f = FUNCTIONS[args[0]]
        parts = [_compile(x, d) for x in args[1:]]
        return lambda env: f(*(p(env) for p in parts))
    raise ExpressionError(f"unknown expression node {short_repr(op)} with {len(args)} operand(s)")


def short_repr(value: Any, limit: int = 80) -> str:
    """A value for an error message, cut to `limit` characters (trees can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tree_names(tree: Any) -> set[str]:
    """The free names an expression tree reads (of a tree that compile_expr accepted)."""
    if not isinstance(tree, list) or not tree:
        return set()
    if tree[0] == "n":
        return {tree[1]}
    names: set[str] = set()
    for item in tree[1:]:
        if isinstance(item, list) and len(item) == 2 and tree[0] == "cmp" and item[0] in _CMPS:
            names |= tree_names(item[1])
        else:
            names |= tree_names(item)
    return names


# --------------------------------------------------------------------------------------------
# Key -> bucket mapping.

MAPPINGS = ("nearest", "floor", "ceil", "exact")


def map_to_bucket(value: int, buckets: Sequence[int], mapping: str = "nearest", dim: str = "key") -> int:
    """The bucket a run-time key value falls into; values outside the range clamp to the ends.

    ``nearest`` is nearest in log2 (ties go to the smaller bucket), ``floor`` the largest bucket
    not above the value, ``ceil`` the smallest not below it, ``exact`` only a declared bucket.
    """
    if mapping == "exact":
        if value in buckets:
            return value
        raise ValueError(f"{dim}={value} is not one of the exact buckets {list(buckets)}")
    if value <= buckets[0]:
        return buckets[0]
    if value >= buckets[-1]:
        return buckets[-1]
    lo = max(b for b in buckets if b <= value)
    if lo == value:
        return lo
    hi = min(b for b in buckets if b > value)
    if mapping == "floor":
        return lo
    if mapping == "ceil":
        return hi
    if mapping != "nearest":
        raise ValueError(f"unknown bucket mapping {mapping!r} for {dim}; expected one of {MAPPINGS}")
    lv = math.log2(value)
    return lo if (lv - math.log2(lo)) <= (math.log2(hi) - lv) else hi


# --------------------------------------------------------------------------------------------
# Archs and fallback.

_ARCH_RE = re.compile(r"(sm|compute)_([0-9]+)([0-9])([af]?)")  # fullmatch: no trailing newline


MIN_SM = 75  # the oldest arch NVRTC 13 targets (sm_75): no build can serve an older GPU


def parse_arch(arch: str) -> tuple[str, int, int, str]:
    """'sm_90a' -> ('sm', 9, 0, 'a'); 'compute_80' -> ('compute', 8, 0, '')."""
    m = _ARCH_RE.fullmatch(arch) if isinstance(arch, str) else None
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r} (expected e.g. 'sm_90' or 'compute_90')")
    return m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


def as_compute_capability(arch: Any) -> tuple[int, int]:
    """Accepts 'sm_86', '8.6', 86, (8, 6) and returns (8, 6); ValueError for what no GPU has
    (a major below 1 or above 99, a minor above 9: -1 is not 'sm_-19')."""
    if isinstance(arch, tuple) and len(arch) == 2 and all(type(v) is int for v in arch):
        cc = arch
    elif isinstance(arch, int) and not isinstance(arch, bool):
        cc = (arch // 10, arch % 10) if arch >= 0 else (-1, 0)
    elif isinstance(arch, str):
        if re.fullmatch(r"[0-9]{1,2}\.[0-9]", arch):
            major, minor = arch.split(".")
            cc = (int(major), int(minor))
        else:
            _, major, minor, _ = parse_arch(arch)
            cc = (major, minor)
    else:
        raise TypeError(f"arch: expected 'sm_XY', 'X.Y', an int XY or a (major, minor) tuple, got {short_repr(arch)}")
    if not (1 <= cc[0] <= 99 and 0 <= cc[1] <= 9):
        raise ValueError(f"arch: {short_repr(arch)} is not a compute capability (expected e.g. 'sm_90', '9.0', 90 or (9, 0))")
    return cc


def choose_arch(device_cc: tuple[int, int], cubin_archs: Sequence[str], ptx_archs: Sequence[str]) -> tuple[str, str]:
    """Pick the binary for a device: (arch of the binary, 'cubin' or 'ptx').

    Exact cubin (an 'a' arch only on exactly its own device, preferred there) -> a cubin of
    the same major with a lower minor -> PTX of an arch not above the device (JIT) -> error.
    """
    major, minor = device_cc
    best: tuple[int, int, str] | None = None
    for arch in cubin_archs:
        _, a_major, a_minor, suffix = parse_arch(arch)
        if a_major != major or a_minor > minor:
            continue
        if suffix and a_minor != minor:
            continue  # arch-specific cubins run only on their own compute capability
        rank = (a_minor, 1 if suffix else 0)
        if best is None or rank > best[:2]:
            best = (rank[0], rank[1], arch)
    if best is not None:
        return best[2], "cubin"
    usable = [a for a in ptx_archs if parse_arch(a)[1:3] <= (major, minor)]
    if usable:
        return max(usable, key=lambda a: parse_arch(a)[1:3]), "ptx"
    fix = (
        f"rebuild the wheel with sm_{major}{minor} in `archs`"
        if major * 10 + minor >= MIN_SM
        else f"no wheel can: NVRTC 13, which hatch-autotune builds with, targets sm_{MIN_SM} and newer, so kernels "
        f"of such a wheel need a GPU of compute capability {MIN_SM // 10}.{MIN_SM % 10} or newer"
    )
    raise RuntimeError(
        f"no binary in this wheel runs on a device of compute capability {major}.{minor} "
        f"(sm_{major}{minor}): it has cubins for {', '.join(cubin_archs) or 'no arch'} and PTX for "
        f"{', '.join(ptx_archs) or 'no arch'}; {fix}"
    )


# --------------------------------------------------------------------------------------------
# Selections, dtypes, arrays, scalars and streams: everything a call checks before any GPU call.


class IntegrityError(RuntimeError):
    """A shipped file does not match the sha256 recorded for it."""


def sha256_hex(data: bytes) -> str:
    return _sha256(data).hexdigest()


class Selection(_Record):
    """What `Kernel.select` answers: which variant runs, with which config, and why."""

    __slots__ = ("kernel", "variant", "config", "types", "constants", "bucket", "tuned", "arch", "binary")
    kernel: str
    variant: str
    config: Mapping[str, Any]
    types: Mapping[str, str]  # type parameter -> dtype
    constants: Mapping[str, Any]  # caller-chosen constant -> its value
    bucket: Mapping[str, int]
    tuned: bool
    arch: str  # the table arch whose choice this is (e.g. 'sm_80' on an sm_86 device)
    binary: str  # the binary that runs: 'sm_80' (cubin) or 'compute_90' (PTX, JIT-compiled)


def types_key(types: Mapping[str, Any]) -> str:
    """'T=float32' or 'CAUSAL=true,RADIUS=2,T=float16': an instance's type parameters and
    constants (sorted, comma-joined), or '-' for a kernel with neither."""
    return ",".join(f"{k}={value_text(types[k])}" for k in sorted(types)) or "-"


def value_text(value: Any) -> str:
    """A dtype name or a constant's value as TOML and C++ write it: `true`, not `True`."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# Arrays, scalars and streams at the call boundary. Everything here runs before any GPU call,
# so a wrong argument is a TypeError/ValueError naming it, and nothing has been launched.

# dtype name -> the __cuda_array_interface__ typestr without its byte-order character
TYPESTRS = {
    "float16": "f2", "float32": "f4", "float64": "f8",
    "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8",
}  # fmt: skip
_DTYPE_OF_TYPESTR = {v: k for k, v in TYPESTRS.items()}
DTYPE_SIZES = {name: int(typestr[1:]) for name, typestr in TYPESTRS.items()}  # bytes
# integer dtype -> (min, max): what a scalar of that type holds (the config check and the call agree)
INT_RANGES = {
    name: (-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if name[0] == "i" else (0, (1 << (8 * size)) - 1)
    for name, size in DTYPE_SIZES.items()
    if name.startswith(("int", "uint"))
}


def instance_env(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The names an instance gives expressions: `<T>_size` in bytes per type parameter (whose
    value is a dtype name) and each constant by name (an int or bool). The build side's spec
    imports this, so the wheel and the build evaluate the same shapes and geometry."""
    return {(f"{name}_size" if type(v) is str else name): (DTYPE_SIZES[v] if type(v) is str else v) for name, v in instance.items()}


class ArrayView(_Record):
    """What a call needs of an array: pointer, shape, dtype, layout, and where it lives."""

    __slots__ = ("ptr", "shape", "dtype", "contiguous", "readonly", "device")
    ptr: int
    shape: tuple[int, ...]
    dtype: str | None  # None: a dtype hatch-autotune cannot pass (e.g. bfloat16, big-endian)
    contiguous: bool
    readonly: bool
    device: int | None  # None: unknown until asked (CAI); -1: host memory


def _c_contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    """Row-major dense; strides of size-1 dims do not matter."""
    if strides is None:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


_DLPACK_CPU = 1  # DLPack's kDLCPU device type


def array_view(obj: Any, stream_ptr: int = -1) -> ArrayView | None:
    """Read an array through __cuda_array_interface__ (fast) or DLPack; None if it has neither.

    For DLPack, `stream_ptr` is the stream the array will be used on, so that its producer can
    order its pending work before it (-1: no ordering, for checks that launch nothing)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        typestr, shape, ptr, readonly, strides = _cai_fields(cai)
        dtype = _DTYPE_OF_TYPESTR.get(typestr[1:]) if typestr[:1] in ("<", "|", "=") else None
        itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
        return ArrayView(ptr, shape, dtype, _c_contiguous(shape, strides, itemsize), readonly, None)
    if hasattr(obj, "__dlpack__"):
        where = getattr(obj, "__dlpack_device__", None)
        if where is not None and where()[0] == _DLPACK_CPU:  # NumPy: host memory, and no stream allowed
            return ArrayView(0, (), None, True, False, -1)
        from cuda.core.utils import StridedMemoryView  # lazy: only DLPack-only arrays need it

        view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream_ptr)
        np_dtype = view.dtype
        dtype = None
        if np_dtype is not None and np_dtype.byteorder in ("<", "|", "="):
            dtype = _DTYPE_OF_TYPESTR.get(f"{np_dtype.kind}{np_dtype.itemsize}")
        shape = tuple(view.shape)
        strides = view.strides
        contiguous = _c_contiguous(shape, strides, 1)  # DLPack strides count elements, not bytes
        return ArrayView(view.ptr, shape, dtype, contiguous, bool(view.readonly), view.device_id if view.is_device_accessible else -1)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cai_fields(cai: Any) -> tuple[str, tuple[int, ...], int, bool, tuple[int, ...] | None]:
    """(typestr, shape, pointer, readonly, strides) of a __cuda_array_interface__ (version 3),
    or ArrayInterfaceError saying which field is missing or malformed."""
    if not isinstance(cai, dict):
        raise ArrayInterfaceError(f"__cuda_array_interface__ is {type(cai).__name__}, not a dict")
    missing = [k for k in ("typestr", "shape", "data") if k not in cai]
    if missing:
        raise ArrayInterfaceError(f"__cuda_array_interface__ lacks {', '.join(repr(k) for k in missing)}")
    typestr, shape, data, strides = cai["typestr"], cai["shape"], cai["data"], cai.get("strides")
    if not isinstance(typestr, str):
        raise ArrayInterfaceError(f"__cuda_array_interface__['typestr'] is {short_repr(typestr)}, not a string such as '<f4'")
    if not isinstance(shape, (tuple, list)) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ArrayInterfaceError(f"__cuda_array_interface__['shape'] is {short_repr(shape)}, not a tuple of sizes")
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and _is_int(data[0]) and data[0] >= 0):
        raise ArrayInterfaceError(f"__cuda_array_interface__['data'] is {short_repr(data)}, not (pointer, read_only)")
    if strides is not None and not (isinstance(strides, (tuple, list)) and len(strides) == len(shape) and all(map(_is_int, strides))):
        raise ArrayInterfaceError(f"__cuda_array_interface__['strides'] is {short_repr(strides)}, not None or one int per dim")
    return typestr, tuple(shape), data[0], bool(data[1]), None if strides is None else tuple(strides)


class ArrayInterfaceError(TypeError):
    """An object whose __cuda_array_interface__ is not one (a field missing or of the wrong type)."""


def stream_handle(stream: Any) -> int | None:
    """The cudaStream_t address of anything a user may pass as `stream=`; None for the default.

    Accepts a cuda.core Stream or any object with __cuda_stream__ (CuPy, cuda.core), an object
    with `.cuda_stream` (PyTorch) or `.ptr` (older CuPy), or a raw handle (int).
    """
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream: a raw handle must be a non-negative int, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, handle = proto() if callable(proto) else proto
        return int(handle)
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            return handle
    raise TypeError(
        "stream: expected None, a cuda.core Stream, an object with __cuda_stream__ (CuPy), "
        f"a PyTorch stream, or a raw cudaStream_t handle (int); got {type(stream).__name__}"
    )


class PreparedCall(_Record):
    """A call after every check that needs no GPU: what to select and what to pass."""

    __slots__ = ("types", "key", "c_args", "arrays")
    types: dict[str, str]
    key: dict[str, int]
    c_args: tuple[Any, ...]  # in the kernel's C order: ints for pointers, numpy scalars
    arrays: dict[str, ArrayView]


def _integral_types() -> tuple[type, ...]:
    try:
        import numpy

        return (int, numpy.integer)
    except ImportError:  # pragma: no cover - numpy is a dependency of every generated wheel
        return (int,)


def _converter(dtype: str, kernel: str, arg: str) -> Callable[[Any], Any]:
    """A fast scalar converter for the repeated-call path (its type was checked on the first
    call); numpy raises OverflowError for an integer out of range, which is re-raised as
    _scalar's ValueError by the checked path."""
    def convert(value: Any) -> Any:
        try:
            return fast(value)
        except (OverflowError, ValueError, TypeError):
            return _scalar(value, dtype, kernel, arg)

    import numpy

    if dtype == "float16":
        fast = lambda v: numpy.float16(v).view(numpy.uint16)  # noqa: E731
    else:
        fast = numpy.dtype(dtype).type
        if dtype in INT_RANGES:
            (lo, hi), np_type = INT_RANGES[dtype], fast

            def fast(v: Any) -> Any:  # noqa: F811 - bounds checked explicitly (numpy casts numpy ints silently)
                if not lo <= v <= hi:
                    raise OverflowError
                return np_type(v)

    return convert


def _scalar(value: Any, dtype: str, kernel: str, arg: str) -> Any:
    """A Python or numpy number as the exact C type (float32 stays float32), range-checked."""
    import numpy

    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, (int, float, numpy.number)):
        raise TypeError(f"{kernel}(): argument {arg!r} must be a number ({dtype}), got {type(value).__name__}")
    np_type = numpy.dtype(dtype).type
    if dtype in INT_RANGES:
        if not isinstance(value, (int, numpy.integer)):
            raise TypeError(f"{kernel}(): argument {arg!r} must be an integer ({dtype}), got {value!r}")
        lo, hi = INT_RANGES[dtype]
        if not lo <= int(value) <= hi:
            raise ValueError(f"{kernel}(): argument {arg!r}={value} does not fit in {dtype} [{lo}, {hi}]")
        return np_type(int(value))
    if dtype == "float16":
        return numpy.float16(value).view(numpy.uint16)  # the kernel sees at_half: 16 raw bits
    return np_type(value)


# --------------------------------------------------------------------------------------------
# The CUDA boundary (GPU only). Every CUDA call of the runtime, and of the tuning worker, goes
# through one `CudaApi`; every driver result goes through `check_cuda`; all that the runtime
# learns from the driver lives in one `GpuState`. The seam for tests is `use_gpu(api)`: it puts
# a stand-in driver under the real call path, from a clean state.


class NoDriverError(RuntimeError):
    """No usable CUDA driver or device. Raised only after every check that needs no driver."""


class CudaCallError(RuntimeError):
    """A CUDA driver or NVRTC call returned an error: `call` names the call, `error` the code."""

    def __init__(self, call: str, error: str):
        super().__init__(f"{call} failed: {error}")
        self.call, self.error = call, error


def check_cuda(result: Sequence[Any], call: str) -> Any:
    """The one funnel for cuda-bindings results, driver (CUresult) and NVRTC (nvrtcResult)
    alike: `result` is (err, *values). Returns None, the one value or a tuple of the values;
    CudaCallError naming `call` and the error (e.g. CUDA_ERROR_OUT_OF_MEMORY) otherwise."""
    err = result[0]
    if int(err):  # CUDA_SUCCESS and NVRTC_SUCCESS are both 0
        raise CudaCallError(call, getattr(err, "name", str(err)))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else tuple(result[1:])


_NO_DRIVER_HINT = (
    "running a kernel needs an NVIDIA GPU and its driver; `<kernel>.select(arch='sm_90', ...)` "
    "shows which variant would run, without either"
)

# cuda-core before 0.5 had its API under `cuda.core.experimental` only.
MIN_CUDA_CORE = (0, 5)
_VERSION_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"](\d+)\.(\d+)""")


def check_cuda_core(path: Sequence[str] | None = None) -> None:
    """ImportError, at import, when the cuda-core Python would import predates the `cuda.core`
    API. Reads its _version.py instead of importing it (that takes ~300 ms and may load CUDA);
    a missing cuda-core is not an error here: `select(arch=...)` needs none."""
    for entry in sys.path if path is None else path:
        core = os.path.join(entry or ".", "cuda", "core")
        if os.path.isdir(core):
            break
    else:
        return
    try:
        with open(os.path.join(core, "_version.py"), encoding="utf-8") as f:
            m = _VERSION_RE.search(f.read())
    except OSError:
        m = None
    version = (int(m.group(1)), int(m.group(2))) if m else None
    legacy = os.path.isdir(os.path.join(core, "experimental")) and not os.path.isdir(os.path.join(core, "cu13"))
    if (version is not None and version < MIN_CUDA_CORE) or (version is None and legacy):
        found = f"{version[0]}.{version[1]}" if version else "an unknown version"
        raise ImportError(
            f"hatch-autotune kernels need cuda-core >= {MIN_CUDA_CORE[0]}.{MIN_CUDA_CORE[1]} (the `cuda.core` API); "
            f"{core} is cuda-core {found}, whose API is only under `cuda.core.experimental`: "
            "upgrade it with `pip install -U cuda-core`"
        )


def ptx_driver_needed(isa: str, nvrtc: str | None = None) -> tuple[int, int]:
    """The oldest CUDA driver (major, minor) that JIT-compiles PTX of ISA `isa` ('9.5').

    ISA 9.x came with CUDA 13.x, 8.0-8.5 with 12.0-12.5, 8.6-8.8 with 12.7-12.9, 7.x with
    11.x. For an ISA newer than this table, the NVRTC that wrote it is the safe answer."""
    major, minor = (int(p) for p in isa.split(".")[:2])
    if major == 9:
        return 13, minor
    if major == 8:
        return 12, minor if minor <= 5 else minor + 1
    if major == 7:
        return 11, minor
    if nvrtc:
        n_major, n_minor = (int(p) for p in nvrtc.split(".")[:2])
        return n_major, n_minor
    return major + 4, minor


class CudaApi(_Record):
    """Every CUDA name that the runtime and the tuning worker call, in one object, so that a
    test can hand them a stand-in: cuda.bindings' `driver` module (its cu* functions and the
    CUresult, CUdevice_attribute and CUpointer_attribute enums) and six names of cuda.core."""

    __slots__ = ("driver", "Device", "Stream", "LaunchConfig", "ObjectCode", "EventOptions", "launch")
    driver: Any
    Device: Any
    Stream: Any
    LaunchConfig: Any
    ObjectCode: Any
    EventOptions: Any
    launch: Callable[..., None]

    @classmethod
    def load(cls, driver: Any = None) -> CudaApi:
        """The real ones, from cuda-bindings and cuda-core; ImportError for a cuda-core too old."""
        if driver is None:
            from cuda.bindings import driver
        try:
            from cuda.core import Device, EventOptions, LaunchConfig, ObjectCode, Stream, launch
        except ImportError as exc:
            need = ".".join(map(str, MIN_CUDA_CORE))
            raise ImportError(f"hatch-autotune kernels need cuda-core >= {need} (the `cuda.core` API): {exc}") from None
        return cls(driver, Device, Stream, LaunchConfig, ObjectCode, EventOptions, launch)

    def replace(self, **changes: Any) -> CudaApi:
        """A copy with some names replaced (e.g. a counting `launch`)."""
        return type(self)(**{**{n: getattr(self, n) for n in self.__slots__}, **changes})


class GpuState:
    """What the runtime learns from CUDA, once per process: the API it calls, the device count
    and driver version, per-device facts and objects, and which kernels hold plans over it."""

    def __init__(self, api: CudaApi | None = None):
        self._given = api  # None: the real cuda-bindings and cuda-core, imported at the first launch
        self.api: CudaApi | None = None  # set once the driver has started
        self.single_device: int | None = None  # the one device's ordinal; None with several
        self.driver_version = (0, 0)
        self.cc: dict[int, tuple[int, int]] = {}
        self.primary: dict[int, Any] = {}
        self.default_streams: dict[int, Any] = {}
        self.handle_streams: dict[int, Any] = {}
        self.planners: WeakSet[Kernel] = WeakSet()  # kernels whose plans hold this API's objects
        self.lock = threading.Lock()

    def start(self) -> CudaApi:
        """Initialise the driver and the API, once; NoDriverError without a driver or device."""
        api = self.api
        if api is not None:
            return api
        with self.lock:
            if self.api is not None:
                return self.api
            try:
                if self._given is not None:
                    driver = self._given.driver
                else:
                    from cuda.bindings import driver
                (err,) = driver.cuInit(0)
            except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when libcuda is absent
                raise NoDriverError(f"no CUDA driver found ({type(exc).__name__}: {exc}); {_NO_DRIVER_HINT}") from None
            if int(err):  # not check_cuda: a driver that does not start means "no GPU", said as NoDriverError
                raise NoDriverError(f"the CUDA driver did not initialise ({getattr(err, 'name', err)}); {_NO_DRIVER_HINT}")
            count = check_cuda(driver.cuDeviceGetCount(), "cuDeviceGetCount")
            if count < 1:
                raise NoDriverError(f"the CUDA driver sees no device; {_NO_DRIVER_HINT}")
            version = check_cuda(driver.cuDriverGetVersion(), "cuDriverGetVersion")
            api = self._given if self._given is not None else CudaApi.load(driver)
            self.single_device = 0 if count == 1 else None
            self.driver_version = (version // 1000, (version % 1000) // 10)
            self.api = api
            return api

    def forget(self) -> None:
        """Drop the plans that kernels made over this state (loaded code, streams, configs)."""
        for kernel in list(self.planners):
            kernel._drop_plans()
        self.planners.clear()

    def device_cc(self, device: int) -> tuple[int, int]:
        cc = self.cc.get(device)
        if cc is None:
            driver = self.api.driver
            attr = driver.CUdevice_attribute
            what = f"cuDeviceGetAttribute (compute capability of device {device})"
            major = check_cuda(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), what)
            minor = check_cuda(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), what)
            cc = self.cc.setdefault(device, (int(major), int(minor)))
        return cc

    def current_device(self) -> int | None:
        """The device of the calling thread's current context, None when it has none (the
        driver's error here is that answer, not a failure: no check_cuda)."""
        err, dev = self.api.driver.cuCtxGetDevice()
        return None if err else int(dev)

    def pointer_device(self, ptr: int) -> int | None:
        """Device ordinal of a device pointer; None when it is not device memory (the driver's
        error here is that answer, not a failure: no check_cuda)."""
        driver = self.api.driver
        err, ordinal = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return None if err else int(ordinal)

    def primary_context(self, device: int) -> Any:
        ctx = self.primary.get(device)
        if ctx is None:
            found = check_cuda(self.api.driver.cuDevicePrimaryCtxRetain(device), f"cuDevicePrimaryCtxRetain (device {device})")
            ctx = self.primary.setdefault(device, found)
        return ctx

    def on_device(self, device: int) -> _OnDevice:
        """A block with `device` current in the calling thread (see _OnDevice)."""
        return _OnDevice(self, device)

    def launch(self, device: int, stream: Any, config: Any, kernel: Any, c_args: Sequence[Any]) -> None:
        """Launch with `device` current in the calling thread: as it is when the caller's
        context is already on that device, else its primary context pushed and popped, so that
        any thread can call and the caller's current device never changes."""
        if self.current_device() == device:
            self.api.launch(stream, config, kernel, *c_args)
            return
        with _OnDevice(self, device):
            self.api.launch(stream, config, kernel, *c_args)

    def launch_stream(self, stream: Any, handle: int | None, device: int) -> Any:
        """What to launch on: a cuda.core Stream as given; the device's default stream for None;
        anything else by its handle, wrapped once (Stream.from_handle costs microseconds)."""
        api = self.api
        if isinstance(stream, api.Stream):
            return stream
        if handle is None:
            found = self.default_streams.get(device)
            if found is None:
                with _OnDevice(self, device):
                    found = self.default_streams.setdefault(device, api.Device(device).default_stream)
            return found
        found = self.handle_streams.get(handle)
        if found is None:
            if len(self.handle_streams) >= _CACHE_LIMIT:
                self.handle_streams.clear()
            found = self.handle_streams.setdefault(handle, api.Stream.from_handle(handle))
        return found


class _OnDevice:
    """Run a block with `device`'s primary context current, restoring the caller's afterwards,
    so that loading or launching never changes which device CuPy or PyTorch consider current."""

    __slots__ = ("gpu", "device", "pushed")

    def __init__(self, gpu: GpuState, device: int):
        self.gpu, self.device, self.pushed = gpu, device, False

    def __enter__(self) -> None:
        gpu = self.gpu
        if gpu.current_device() == self.device:
            return
        check_cuda(gpu.api.driver.cuCtxPushCurrent(gpu.primary_context(self.device)), f"cuCtxPushCurrent (device {self.device})")
        self.pushed = True

    def __exit__(self, *exc: Any) -> None:
        if self.pushed:
            result = self.gpu.api.driver.cuCtxPopCurrent()
            if exc[0] is None:  # a failure inside the block is the one to report, not the pop's
                check_cuda(result, f"cuCtxPopCurrent (device {self.device})")


_GPU = GpuState()  # the process's one state; replaced only by use_gpu


def use_gpu(api: CudaApi | None = None) -> GpuState:
    """Run this process's kernels over `api` (None: the real cuda-bindings and cuda-core), from
    a fresh state; kernels drop their plans made over the previous one. The seam that tests use
    to put a stand-in driver under the real call path. Not while other threads launch."""
    global _GPU
    old, _GPU = _GPU, GpuState(api)
    old.forget()
    return _GPU


def cuda_api() -> CudaApi:
    """The started CUDA API of this process (the one `use_gpu` set), for code outside the
    runtime that calls CUDA, such as the tuning worker; NoDriverError without a driver."""
    return _GPU.start()


def current_device_cc(device_id: int | None = None) -> tuple[int, int]:
    """Compute capability of a CUDA device (None: the calling thread's current device, else 0);
    NoDriverError without a driver or device."""
    gpu = _GPU
    gpu.start()
    if device_id is None:
        device_id = gpu.current_device()
    return gpu.device_cc(0 if device_id is None else device_id)


# --------------------------------------------------------------------------------------------
# Binaries: where a kernel's compiled code comes from.


class Binaries:
    """What a Kernel needs to find its compiled code: which binary serves a device, and the
    bytes of a binary. `Library` is the wheel's; the tuning worker brings its own."""

    cubin_archs: Sequence[str] = ()  # the archs that have cubins (for error messages)

    def binary_for(self, cc: tuple[int, int]) -> tuple[str, str]:
        """(table arch, binary arch) for a compute capability: ('sm_80', 'sm_80') runs a cubin,
        ('sm_90', 'compute_90') JIT-compiles the PTX made from sm_90's winners."""
        raise NotImplementedError

    def read(self, kernel: Kernel, variant: str, binary: str) -> bytes:
        """The bytes of `variant`'s binary for arch `binary` (e.g. 'sm_90' or 'compute_90')."""
        raise NotImplementedError


class Library(Binaries):
    """The table of a generated module plus the files next to it."""

    def __init__(self, directory: str, table: Mapping[str, Any]):
        self.directory = directory
        self.table = table
        self.module: str = table["module"]
        self.cubin_archs: list[str] = list(table["archs"])
        # table arch -> the PTX arch compiled from that arch's winners
        self.ptx_for: dict[str, str] = dict(table.get("ptx", {}))
        self.provenance: dict[str, Any] = dict(table.get("provenance", {}))
        self._arch_cache: dict[tuple[int, int], tuple[str, str]] = {}
        self.kernels = {name: Kernel(name, spec, self) for name, spec in sorted(table["kernels"].items())}

    @classmethod
    def load(cls, directory: str, table_sha256: str | None = None) -> Library:
        check_cuda_core()
        path = os.path.join(directory, TABLE_FILE)
        with open(path, "rb") as f:
            raw = f.read()
        if table_sha256 is not None and sha256_hex(raw) != table_sha256:
            raise IntegrityError(
                f"{path} does not match the sha256 recorded in the generated module "
                f"(expected {table_sha256}, got {sha256_hex(raw)}); reinstall the package"
            )
        try:
            return cls(directory, parse_table(raw, path))
        except TableError as exc:
            raise IntegrityError(str(exc)) from None
        except (LookupError, TypeError, ValueError, AttributeError) as exc:
            # parse_table checks the frame; what is inside is read by the constructors, and a
            # table whose sha256 matched but whose content is malformed was built wrong
            raise IntegrityError(f"{path}: malformed selection table ({type(exc).__name__}: {short_repr(str(exc), 200)}); rebuild the wheel") from None

    def binary_for(self, cc: tuple[int, int]) -> tuple[str, str]:
        """(table arch, binary arch) for a compute capability, memoised per device."""
        hit = self._arch_cache.get(cc)
        if hit is None:
            arch, how = choose_arch(cc, self.cubin_archs, sorted(self.ptx_for.values()))
            if how == "ptx":
                hit = (next(t for t, p in self.ptx_for.items() if p == arch), arch)
            else:
                hit = (arch, arch)
            hit = self._arch_cache.setdefault(cc, hit)
        return hit

    def read(self, kernel: Kernel, variant: str, binary: str) -> bytes:
        info = kernel.variants[variant]["binaries"][binary]
        return self.read_checked(info["file"], info["sha256"])

    def read_checked(self, relpath: str, expected_sha256: str) -> bytes:
        path = os.path.join(self.directory, relpath)
        with open(path, "rb") as f:
            data = f.read()
        if sha256_hex(data) != expected_sha256:
            raise IntegrityError(
                f"{path} does not match its sha256 in {TABLE_FILE} "
                f"(expected {expected_sha256}, got {sha256_hex(data)}); reinstall the package"
            )
        return data


# --------------------------------------------------------------------------------------------
# Kernels: selection, and the call path from Python arguments to a launch.

_CACHE_LIMIT = 4096  # per-kernel memo entries (distinct sizes) before the memo is cleared


class Kernel:
    """One kernel of a generated module: `select()` to see the choice, call it to launch.

    `binaries` finds its compiled code: the wheel's Library, or the tuning worker's own."""

    def __init__(self, name: str, spec: Mapping[str, Any], binaries: Binaries):
        self.name = name
        self.entry: str = spec["entry"]
        self.doc: str = spec.get("doc", "")
        self.args: list[dict[str, Any]] = spec["args"]
        self.key: list[dict[str, Any]] = spec["key"]
        self.type_params: dict[str, list[str]] = spec["type_params"]
        # name -> the values a caller may pass, in declared order (the keywords' order)
        self.constants: dict[str, list[Any]] = {c["name"]: c["values"] for c in spec.get("constants", [])}
        self.launch_trees: dict[str, Any] = spec["launch"]
        self.variants: dict[str, dict[str, Any]] = spec["variants"]
        self._binaries = binaries
        self._key_names = [k["name"] for k in self.key]
        # (types_key, arch) -> {bucket tuple -> entry}
        self._select: dict[tuple[str, str], dict[tuple[int, ...], dict[str, Any]]] = {}
        for tkey, per_arch in spec["select"].items():
            for arch, entries in per_arch.items():
                self._select[(tkey, arch)] = {tuple(e["bucket"]): e for e in entries}
        self._grid = [compile_expr(t) for t in self.launch_trees["grid"]]
        self._block = [compile_expr(t) for t in self.launch_trees["block"]]
        self._shared = compile_expr(self.launch_trees["shared"])
        self.user_args = [a["name"] for a in self.args if "value" not in a]
        self._shape_fns = {a["name"]: [compile_expr(t) for t in a["shape"]] for a in self.args if a["kind"] == "array"}
        self._value_fns = {a["name"]: compile_expr(a["value"]) for a in self.args if "value" in a}
        self._memo: dict[Any, Any] = {}
        self._fast: dict[tuple, _FastPlan] = {}
        self._n_user = len(self.user_args)
        self._constant_names = tuple(self.constants)
        key_scalars = {k["from"] for k in self.key if k["axis"] is None}
        kinds = {a["name"]: (_ARRAY if a["kind"] == "array" else _KEY_SCALAR if a["name"] in key_scalars else _SCALAR) for a in self.args}
        self._user_kinds = tuple(kinds[n] for n in self.user_args)
        self._kernels: dict[tuple[int, str, str], Any] = {}
        self._load_lock = threading.Lock()
        self.__doc__ = self._docstring()

    # ---- introspection ----------------------------------------------------------------------

    @property
    def buckets(self) -> dict[str, list[int]]:
        return {k["name"]: list(k["buckets"]) for k in self.key}

    @property
    def provenance(self) -> dict[str, Any]:
        """Per (types, arch, bucket): the variant, tuned or default, and where it was tuned."""
        out: dict[str, Any] = {}
        for (tkey, arch), entries in sorted(self._select.items()):
            for bucket, e in sorted(entries.items()):
                label = " ".join(f"{n}={b}" for n, b in zip(self._key_names, bucket))
                out[f"{tkey} {arch} {label}"] = {
                    "variant": e["variant"],
                    "tuned": e["tuned"],
                    "provenance": e.get("provenance", {}),
                }
        return out

    def _docstring(self) -> str:
        keywords = [f"{c}={self.constants[c][0]!r}" if len(self.constants[c]) == 1 else c for c in self.constants]
        lines = [f"{self.name}({', '.join(self.user_args)}, *, {''.join(k + ', ' for k in keywords)}stream=None)", ""]
        if self.doc:
            lines += [self.doc, ""]
        lines.append("Arguments:")
        for a in self.args:
            if "value" in a:
                continue
            dtype = a["dtype"]
            if dtype in self.type_params:
                dtype = f"{dtype} in {{{', '.join(self.type_params[dtype])}}}"
            if a["kind"] == "array":
                shape = ", ".join(_tree_text(t) for t in a["shape"])
                lines.append(f"  {a['name']}: GPU array, {dtype}, shape ({shape}), C-contiguous, intent {a['intent']}")
            else:
                lines.append(f"  {a['name']}: scalar, {dtype}")
        for c, values in self.constants.items():
            lines.append(f"  {c}: constant, keyword only, one of {values!r}" + (" (the only value)" if len(values) == 1 else ""))
        lines.append("  stream: None (the device's default stream), a cuda.core/CuPy/PyTorch stream, or a raw handle")
        lines.append("Key (selects the variant): " + ", ".join(f"{k['name']} in {k['buckets']} ({k['mapping']})" for k in self.key))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<hatch-autotune kernel {self.name}({', '.join(self.user_args)}) key=({', '.join(self._key_names)})>"

    @property
    def __signature__(self) -> Any:
        """So that help() and inspect.signature() show the real call: the arguments, then stream=."""
        import inspect

        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.user_args]
        for c, values in self.constants.items():
            default = values[0] if len(values) == 1 else inspect.Parameter.empty
            params.append(inspect.Parameter(c, inspect.Parameter.KEYWORD_ONLY, default=default))
        params.append(inspect.Parameter("stream", inspect.Parameter.KEYWORD_ONLY, default=None))
        return inspect.Signature(params)

    # ---- selection --------------------------------------------------------------------------

    def _resolve_constants(self, given: dict[str, Any], where: str) -> dict[str, Any]:
        """Each constant's value: given by keyword (taken out of `given`), exactly one of the
        declared values (an int for an integer constant, a bool for a boolean one), or the
        only declared value when it has one."""
        out: dict[str, Any] = {}
        for c, allowed in self.constants.items():
            if c not in given:
                if len(allowed) != 1:
                    raise TypeError(f"{where} needs constant {c}= (one of {allowed!r})")
                out[c] = allowed[0]
                continue
            value = given.pop(c)
            kind = bool if type(allowed[0]) is bool else int
            exact = _as_constant(value, kind)
            if exact is None or exact not in allowed:
                raise ValueError(f"{where}: constant {c}={short_repr(value)}; expected one of {allowed!r}")
            out[c] = exact
        return out

    def _resolve_instance(self, given: dict[str, Any]) -> dict[str, Any]:
        types: dict[str, Any] = {}
        for tp, allowed in self.type_params.items():
            if tp in given:
                value = str(given.pop(tp))
                if value not in allowed:
                    raise ValueError(f"{self.name}: type parameter {tp}={value!r}; expected one of {allowed}")
                types[tp] = value
            elif len(allowed) == 1:
                types[tp] = allowed[0]
            else:
                raise TypeError(f"{self.name}.select() needs type parameter {tp}= (one of {allowed})")
        types.update(self._resolve_constants(given, f"{self.name}.select()"))
        return types

    def select(self, arch: Any = None, **key: Any) -> Selection:
        """Choose the variant for key dims (and type parameters and constants) on a device arch.

        ``arch`` is 'sm_86', '8.6', 86 or (8, 6); None asks the current CUDA device.
        """
        given = dict(key)
        types = self._resolve_instance(given)
        missing = [n for n in self._key_names if n not in given]
        unknown = sorted(set(given) - set(self._key_names))
        if unknown:
            raise TypeError(f"{self.name}.select(): unknown key {unknown}; the key dims are {self._key_names}")
        if missing:
            raise TypeError(f"{self.name}.select(): missing key dim(s) {missing}")
        for n in self._key_names:
            value = given[n]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.name}.select(): key dim {n} must be an int, got {short_repr(value)}")
            if not 1 <= value <= MAX_SIZE:
                raise ValueError(
                    f"{self.name}.select(): key dim {n}={short_repr(value)} is not a problem size: expected 1 to {MAX_SIZE}"
                    + (" (a call with an empty array launches nothing, so nothing is selected)" if value == 0 else "")
                )
        cc = as_compute_capability(arch) if arch is not None else current_device_cc()
        return self._selection(cc, types, given)

    def _selection(self, cc: tuple[int, int], types: Mapping[str, str], key: Mapping[str, int]) -> Selection:
        bucket = tuple(map_to_bucket(key[k["name"]], k["buckets"], k["mapping"], k["name"]) for k in self.key)
        table_arch, binary = self._binaries.binary_for(cc)
        entry = self._select[(types_key(types), table_arch)][bucket]
        variant = self.variants[entry["variant"]]
        return Selection(
            kernel=self.name,
            variant=entry["variant"],
            config=dict(variant["config"]),
            types={tp: types[tp] for tp in self.type_params},
            constants={c: types[c] for c in self.constants},
            bucket=dict(zip(self._key_names, bucket)),
            tuned=bool(entry["tuned"]),
            arch=table_arch,
            binary=binary,
        )

    def binary(self, selection: Selection) -> bytes:
        """The cubin (or PTX) bytes of a selection (a Library checks them against their sha256)."""
        return self._binaries.read(self, selection.variant, selection.binary)

    # ---- calling ----------------------------------------------------------------------------

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if not kwargs and len(args) == len(self.user_args):
            return list(args)
        if len(args) > len(self.user_args):
            keywords = f"; constants are passed by keyword ({', '.join(f'{c}=' for c in self.constants)})" if self.constants else ""
            raise TypeError(f"{self.name}() takes {len(self.user_args)} arguments ({', '.join(self.user_args)}), got {len(args)}{keywords}")
        values = list(args) + [_MISSING] * (len(self.user_args) - len(args))
        for k, v in kwargs.items():
            if k not in self.user_args:
                raise TypeError(f"{self.name}() got an unexpected argument {k!r}; arguments: {', '.join(self.user_args)}")
            i = self.user_args.index(k)
            if values[i] is not _MISSING:
                raise TypeError(f"{self.name}() got multiple values for argument {k!r}")
            values[i] = v
        missing = [n for n, v in zip(self.user_args, values) if v is _MISSING]
        if missing:
            raise TypeError(f"{self.name}() missing argument(s): {', '.join(missing)}")
        return values

    def prepare(self, *args: Any, **kwargs: Any) -> PreparedCall:
        """Check and convert a call's arguments (and constants) without touching the GPU."""
        constants = self._take_constants(kwargs)
        return self._prepare(self._bind(args, kwargs), -1, constants)

    def _take_constants(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The constants among a call's keywords, taken out of `kwargs`."""
        return {c: kwargs.pop(c) for c in self._constant_names if c in kwargs} if kwargs and self._constant_names else {}

    def _prepare(self, bound: list[Any], stream_ptr: int, constants: Mapping[str, Any]) -> PreparedCall:
        values = dict(zip(self.user_args, bound))
        name = self.name
        arrays: dict[str, ArrayView] = {}
        types: dict[str, str] = {}
        bound_by: dict[str, str] = {}
        for a in self.args:
            if a["kind"] != "array":
                continue
            arg, obj = a["name"], values[a["name"]]
            try:
                view = array_view(obj, stream_ptr)
            except ArrayInterfaceError as exc:
                raise TypeError(f"{name}(): argument {arg!r}: {exc}") from None
            if view is None:
                raise TypeError(
                    f"{name}(): argument {arg!r} must be a GPU array exposing __cuda_array_interface__ or DLPack "
                    f"(CuPy, PyTorch, Numba, JAX), got {type(obj).__name__}"
                )
            if view.device == -1:
                raise ValueError(f"{name}(): argument {arg!r} is in host memory; expected a GPU array")
            declared = a["dtype"]
            if declared in self.type_params:
                if view.dtype not in self.type_params[declared]:
                    raise TypeError(
                        f"{name}(): argument {arg!r} has dtype {view.dtype or 'unsupported'}; "
                        f"expected one of {self.type_params[declared]} (type parameter {declared})"
                    )
                if declared in types and types[declared] != view.dtype:
                    raise TypeError(
                        f"{name}(): argument {arg!r} has dtype {view.dtype} but {bound_by[declared]!r} has "
                        f"{types[declared]}; both are {declared}"
                    )
                types[declared], bound_by[declared] = view.dtype, arg
            elif view.dtype != declared:
                raise TypeError(f"{name}(): argument {arg!r} has dtype {view.dtype or 'unsupported'}; expected {declared}")
            if len(view.shape) != len(a["shape"]):
                raise ValueError(f"{name}(): argument {arg!r} has {len(view.shape)} dimension(s) {view.shape}; expected {len(a['shape'])}")
            if not view.contiguous:
                raise ValueError(f"{name}(): argument {arg!r} must be C-contiguous (row-major, dense); pass a contiguous copy")
            if view.readonly and a["intent"] != "in":
                raise ValueError(f"{name}(): argument {arg!r} is read-only but the kernel writes it (intent {a['intent']})")
            align = a.get("align")
            if align and view.ptr % align:
                raise ValueError(
                    f"{name}(): argument {arg!r} must start on a {align}-byte boundary (the kernel uses vector "
                    f"loads); its pointer {view.ptr:#x} is offset by {view.ptr % align} bytes: pass a copy"
                )
            arrays[arg] = view
        for tp, allowed in self.type_params.items():
            if tp not in types:
                if len(allowed) != 1:
                    raise TypeError(f"{name}(): cannot infer type parameter {tp} from the arguments")
                types[tp] = allowed[0]
        chosen = self._resolve_constants(dict(constants), f"{name}()")
        types.update(chosen)

        key: dict[str, int] = {}
        for k in self.key:
            source = k["from"]
            if k["axis"] is not None:
                key[k["name"]] = arrays[source].shape[k["axis"]]
            else:
                value = values[source]
                if isinstance(value, bool) or not isinstance(value, _integral_types()):
                    raise TypeError(f"{name}(): argument {source!r} must be an integer (it defines key dim {k['name']}), got {value!r}")
                if not 0 <= value <= MAX_SIZE:
                    raise ValueError(f"{name}(): argument {source!r}={value} defines key dim {k['name']}, a size: expected 0 to {MAX_SIZE}")
                key[k["name"]] = int(value)
        env = {**key, **chosen} if chosen else key  # shapes and computed scalars may use the constants
        for arg, view in arrays.items():
            expected = tuple(fn(env) for fn in self._shape_fns[arg])
            if view.shape != expected:
                dims = ", ".join(f"{n}={v}" for n, v in key.items())
                raise ValueError(f"{name}(): argument {arg!r} has shape {view.shape}; expected {expected} (from {dims})")

        c_args: list[Any] = []
        for a in self.args:
            arg = a["name"]
            if a["kind"] == "array":
                c_args.append(arrays[arg].ptr)
                continue
            dtype = types.get(a["dtype"], a["dtype"])
            value = self._value_fns[arg](env) if arg in self._value_fns else values[arg]
            c_args.append(_scalar(value, dtype, name, arg))
        return PreparedCall(types, key, tuple(c_args), arrays)

    # The call path. A first call with a given signature (array dtypes, shapes, layouts, scalar
    # types, stream) goes through every check in _prepare, then starts the driver, and records a
    # _FastPlan per device; later calls with the same signature only read each array's pointer,
    # check its alignment, convert the scalars and launch, from any thread. With one GPU the
    # device is known; with several, each call asks the driver which device its arrays are on.

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        constants = self._take_constants(kwargs) if kwargs else {}
        if kwargs or len(args) != self._n_user:
            return self._call_checked(self._bind(args, kwargs), stream, None, constants)
        sig: list[Any] = [stream if stream is None or type(stream) is int else id(stream)]
        if constants:  # their values pick the instance; the type too (True == 1, but not for a constant)
            if any(type(v) not in (int, bool) for v in constants.values()):
                return self._call_checked(list(args), stream, None, constants)  # names what is wrong, or converts
            sig.append(tuple((c, type(v), v) for c, v in constants.items()))
        ptrs = []
        for obj, kind in zip(args, self._user_kinds):
            if kind is _ARRAY:
                cai = getattr(obj, "__cuda_array_interface__", None)
                if cai is None:
                    return self._call_checked(list(args), stream, None, constants)
                try:
                    data = cai["data"]
                    sig.append((cai["typestr"], cai["shape"], data[1], cai.get("strides")))
                except (LookupError, TypeError):  # not a real interface: the checked path names it
                    return self._call_checked(list(args), stream, None, constants)
                ptrs.append(data[0])
            elif kind is _KEY_SCALAR:
                sig.append((type(obj), obj))  # its value picks the bucket
            else:
                sig.append(type(obj))
        gpu = _GPU
        if gpu.api is None:  # the first call in this process: checks first, then the driver
            return self._call_checked(list(args), stream, tuple(sig), constants)
        device = gpu.single_device
        if device is None:
            device = self._arrays_device(gpu, ptrs)
            if device is None:  # unknown, mixed or zero-sized: the checked path says which
                return self._call_checked(list(args), stream, tuple(sig), constants)
        sig.append(device)
        plan = self._fast.get(tuple(sig))
        if plan is None or (stream is not None and plan.stream_ref is not stream and type(stream) is not int):
            return self._call_checked(list(args), stream, tuple(sig[:-1]), constants)
        c_args = plan.c_args.copy()
        for slot, ptr, align in zip(plan.ptr_slots, ptrs, plan.aligns):
            if ptr % align:
                return self._call_checked(list(args), stream, None, constants)  # raises the alignment error
            c_args[slot] = ptr
        for slot, index, convert in plan.scalar_slots:
            c_args[slot] = convert(args[index])
        if not plan.empty:
            gpu.launch(device, plan.stream, plan.config, plan.kernel, c_args)
        return None

    @staticmethod
    def _arrays_device(gpu: GpuState, ptrs: Sequence[int]) -> int | None:
        """The one device that every non-null pointer is on, else None (several GPUs only)."""
        found = None
        for ptr in ptrs:
            if ptr:
                device = gpu.pointer_device(ptr)
                if device is None or (found is not None and device != found):
                    return None
                found = device
        return found

    def _call_checked(self, bound: list[Any], stream: Any, fast_sig: tuple | None, constants: Mapping[str, Any]) -> None:
        """Every check, then the launch; records a fast plan under `fast_sig` + device."""
        handle = stream_handle(stream)
        call = self._prepare(bound, handle or 1, constants)  # DLPack forbids stream 0; 1 is the legacy default stream
        gpu = _GPU
        gpu.start()  # NoDriverError only now, after every check that needs no driver
        gpu.planners.add(self)  # so that use_gpu() drops the plans made below
        device = self._device_of(gpu, call)
        memo_key = (device, tuple(call.types.values()), tuple(call.key.values()))
        plan = self._memo.get(memo_key)
        if plan is None:
            plan = self._plan(gpu, device, call)
            if len(self._memo) >= _CACHE_LIMIT:
                self._memo.clear()
            self._memo[memo_key] = plan
        kernel, config, empty = plan
        launch_stream = gpu.launch_stream(stream, handle, device)
        if fast_sig is not None:
            if len(self._fast) >= _CACHE_LIMIT:
                self._fast.clear()
            self._fast[(*fast_sig, device)] = _FastPlan(self, call, kernel, config, empty, launch_stream, stream)
        if not empty:  # a zero-sized problem launches nothing
            gpu.launch(device, launch_stream, config, kernel, call.c_args)

    def _drop_plans(self) -> None:
        """Forget everything made over a GpuState (see use_gpu): plans, loaded code."""
        self._memo, self._fast, self._kernels = {}, {}, {}

    def _device_of(self, gpu: GpuState, call: PreparedCall) -> int:
        """The one device all arrays live on (zero-sized arrays, pointer 0, are anywhere)."""
        devices = {}
        for arg, view in call.arrays.items():
            if view.ptr == 0 or 0 in view.shape:
                continue
            device = view.device if view.device is not None else gpu.pointer_device(view.ptr)
            if device is None:
                raise ValueError(f"{self.name}(): argument {arg!r} (pointer {view.ptr:#x}) is not CUDA device memory")
            devices[arg] = device
        distinct = set(devices.values())
        if len(distinct) > 1:
            listing = ", ".join(f"{a} on device {d}" for a, d in devices.items())
            raise ValueError(f"{self.name}(): arrays are on different devices ({listing})")
        if distinct:
            return distinct.pop()
        current = gpu.current_device()
        return 0 if current is None else current

    def _plan(self, gpu: GpuState, device: int, call: PreparedCall) -> tuple[Any, Any, bool]:
        """Kernel handle and LaunchConfig for a (device, types, key): computed once, memoised."""
        sel = self._selection(gpu.device_cc(device), call.types, call.key)
        grid, block, shared = self.geometry(sel.config, call.types, call.key)
        if min(grid) == 0:
            return None, None, True
        return self._kernel_handle(gpu, device, sel), gpu.api.LaunchConfig(grid=grid, block=block, shmem_size=shared), False

    def geometry(self, config: Mapping[str, Any], types: Mapping[str, str], key: Mapping[str, int]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(grid, block, dynamic shared bytes) of a config at a key: the declared expressions."""
        env = {**key, **config, **instance_env(types)}
        grid = tuple(int(f(env)) for f in self._grid)
        block = tuple(int(f(env)) for f in self._block)
        shared = int(self._shared(env))
        if any(g < 0 for g in grid) or any(b <= 0 for b in block) or shared < 0:
            raise ValueError(f"{self.name}: launch geometry grid={grid} block={block} shared={shared} is invalid for {dict(key)}")
        return grid, block, shared

    def _kernel_handle(self, gpu: GpuState, device: int, sel: Selection) -> Any:
        cache_key = (device, sel.variant, sel.binary)
        handle = self._kernels.get(cache_key)
        if handle is None:
            with self._load_lock:
                handle = self._kernels.get(cache_key)
                if handle is None:
                    code_type = gpu.api.ObjectCode
                    data = self.binary(sel)
                    is_ptx = sel.binary.startswith("compute_")
                    if is_ptx:
                        self._check_ptx_driver(gpu, sel)
                    with gpu.on_device(device):
                        code = code_type.from_ptx(data) if is_ptx else code_type.from_cubin(data)
                        handle = code.get_kernel(self.entry)
                    self._kernels[cache_key] = handle
        return handle

    def _check_ptx_driver(self, gpu: GpuState, sel: Selection) -> None:
        """A clear error, before the driver's bare CUDA_ERROR_UNSUPPORTED_PTX_VERSION, when this
        driver is older than the PTX it would have to JIT-compile."""
        info = self.variants[sel.variant]["binaries"][sel.binary]
        isa = info.get("ptx_isa")
        if isa is None:
            return
        needed = ptx_driver_needed(isa, info.get("nvrtc"))
        have = gpu.driver_version
        if have >= needed:
            return
        raise RuntimeError(
            f"{self.name}(): the wheel has no cubin for this device's arch (its cubins: {', '.join(self._binaries.cubin_archs)}), "
            f"so its PTX ({sel.binary}, ISA {isa}, made by NVRTC {info.get('nvrtc', 'unknown')}) must be JIT-compiled, "
            f"which needs a driver of CUDA {needed[0]}.{needed[1]} or newer; this driver is CUDA {have[0]}.{have[1]}. "
            f"Fixes: update the NVIDIA driver; or rebuild the wheel with this device's arch in `archs`; or build it "
            f"with an NVRTC no newer than the driver (pin nvidia-cuda-nvrtc=={have[0]}.{have[1]}.* in build-system.requires)"
        )


_MISSING = object()


def _as_constant(value: Any, kind: type) -> Any:
    """`value` as an exact int or bool of `kind` (numpy's too), else None: True is not 1."""
    import numpy

    is_bool = isinstance(value, (bool, numpy.bool_))
    if kind is bool:
        return bool(value) if is_bool else None
    return int(value) if not is_bool and isinstance(value, _integral_types()) else None
_ARRAY, _KEY_SCALAR, _SCALAR = "array", "key scalar", "scalar"


class _FastPlan:
    """What a repeated call needs: the C arguments with holes for pointers and user scalars."""

    __slots__ = ("c_args", "ptr_slots", "aligns", "scalar_slots", "kernel", "config", "empty", "stream", "stream_ref")

    def __init__(self, kernel: Kernel, call: PreparedCall, handle: Any, config: Any, empty: bool, stream: Any, stream_ref: Any):
        c_index = {a["name"]: i for i, a in enumerate(kernel.args)}
        by_name = {a["name"]: a for a in kernel.args}
        self.c_args = list(call.c_args)
        self.ptr_slots, self.aligns, self.scalar_slots = [], [], []
        for i, name in enumerate(kernel.user_args):
            a = by_name[name]
            if a["kind"] == "array":
                self.ptr_slots.append(c_index[name])
                self.aligns.append(a.get("align") or 1)
            else:
                dtype = call.types.get(a["dtype"], a["dtype"])
                self.scalar_slots.append((c_index[name], i, _converter(dtype, kernel.name, name)))
        self.kernel, self.config, self.empty, self.stream = handle, config, empty, stream
        self.stream_ref = stream_ref  # the user's stream object, so a new object is not mistaken for it


def _tree_text(tree: Any) -> str:
    """A readable rendering of a shape tree for docstrings."""
    if isinstance(tree, list) and tree and tree[0] == "n":
        return tree[1]
    if isinstance(tree, list) and len(tree) == 3 and tree[0] in _OPS:
        return f"{_tree_text(tree[1])} {tree[0]} {_tree_text(tree[2])}"
    return json.dumps(tree) if isinstance(tree, list) else str(tree)
