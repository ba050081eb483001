"""A call's arguments bound and checked against the kernel's declaration before anything touches
the GPU: arrays (dtype, type parameters, dimensions, layout, alignment, intent), constants, the
key, the shapes the key implies, and the C values of the scalars (`CallChecks.prepare` gives a
`PreparedCall`). PyTorch's fake implementations run the same checks on tensors' metadata
(`check_views`), so tracing and calling say the same."""

from __future__ import annotations

from .args import PreparedCall, array_view
from .declaration import stride_name
from .errors import ArrayInterfaceError, ExpressionError
from .expr import compile_expr, tree_text
from .scalars import c_scalar, integral_types
from .selection import map_to_bucket
from .values import DTYPE_SIZES, MAX_SIZE

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping
    from typing import Any

    from .args import ArrayView
    from .declaration import ArgDecl
    from .selection import KernelSelector

_MISSING = object()


class CallChecks:
    """The checks of a kernel's calls, from its declaration; the selector resolves constants as
    `select()` does, so a call and a selection accept the same values."""

    def __init__(self, selector: KernelSelector):
        decl = self.decl = selector.decl
        self.name = decl.name
        self.selector = selector
        self.user_args = tuple(a.name for a in decl.user_args)
        self.constant_names = tuple(decl.call_constants)  # what a caller passes by keyword
        # Constants the call sets from an array's layout (`unit-stride-variants`): constant -> array.
        self._layout_constants = decl.layout_constants
        self._shape_fns = {a.name: [compile_expr(t) for t in a.shape] for a in decl.args if a.shape is not None}
        self._value_fns = {a.name: compile_expr(a.value) for a in decl.args if a.value is not None}
        # Each free dim's sources: (array, axis) of each array the caller must pass that has it
        # bare as an axis, in declared order; a call reads it from the first one it has.
        self._dim_sources = {
            dim: [
                (a.name, axis)
                for a in decl.args
                if a.shape is not None and not a.optional
                for axis, t in enumerate(a.shape)
                if _bare(t, dim)
            ]
            for dim in decl.dims
        }
        # The strided arrays, whose strides computed scalars may read (`x_stride0`, ...).
        self._strided = tuple((a.name, len(a.shape or ())) for a in decl.args if a.strided) if self._value_fns else ()

    def bind(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> list[Any]:
        """The caller's arguments in declared order, from positions and keywords."""
        user_args = self.user_args
        if not kwargs and len(args) == len(user_args):
            return list(args)
        if len(args) > len(user_args):
            constants = self.constant_names
            keywords = f"; constants are passed by keyword ({', '.join(f'{c}=' for c in constants)})" if constants else ""
            raise TypeError(f"{self.name}() takes {len(user_args)} arguments ({', '.join(user_args)}), got {len(args)}{keywords}")
        values = list(args) + [_MISSING] * (len(user_args) - len(args))
        for k, v in kwargs.items():
            if k in self._layout_constants:
                raise TypeError(
                    f"{self.name}() got {k}=: the call sets it from the layout of {self._layout_constants[k]!r} "
                    "(a variant per unit or non-unit innermost stride); it is not passed"
                )
            if k not in user_args:
                raise TypeError(f"{self.name}() got an unexpected argument {k!r}; arguments: {', '.join(user_args)}")
            i = user_args.index(k)
            if values[i] is not _MISSING:
                raise TypeError(f"{self.name}() got multiple values for argument {k!r}")
            values[i] = v
        missing = [n for n, v in zip(user_args, values) if v is _MISSING]
        if missing:
            raise TypeError(f"{self.name}() missing argument(s): {', '.join(missing)}")
        return values

    def take_constants(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The constants among a call's keywords, taken out of `kwargs`."""
        return {c: kwargs.pop(c) for c in self.constant_names if c in kwargs} if kwargs and self.constant_names else {}

    def prepare(self, bound: list[Any], stream_ptr: int, constants: Mapping[str, Any]) -> PreparedCall:
        """Every check of a bound call, then its C arguments: arrays' pointers, scalars' values."""
        values = dict(zip(self.user_args, bound))
        arrays: dict[str, ArrayView] = {}
        types: dict[str, Any] = {}
        bound_by: dict[str, str] = {}
        for a in self.decl.args:  # each array read, then checked, in declared order: the first wrong one is named
            if a.is_array:
                obj = values[a.name]
                if obj is None and a.optional:  # absent: a null pointer, no checks
                    continue
                view = arrays[a.name] = self._view(a.name, obj, stream_ptr)
                self._check_array(a, view, types, bound_by, True)
        types, key, env = self._check_call(values, arrays, types, constants)
        if self._strided:  # computed scalars read the strides of the strided arrays (0 for an absent one)
            env = dict(env)
            for arg, ndim in self._strided:
                strided = arrays.get(arg)
                for i in range(ndim):
                    env[stride_name(arg, i)] = strided.strides[i] if strided is not None and strided.strides is not None else 0
        c_args: list[Any] = []
        for a in self.decl.args:
            if a.is_array:
                c_args.append(arrays[a.name].ptr if a.name in arrays else 0)
                continue
            if a.tensor_map is not None:  # encoded by the launch from its array (runtime/launching.py)
                c_args.append(None)
                continue
            dtype = types.get(a.dtype, a.dtype)
            value = self._value_fns[a.name](env) if a.name in self._value_fns else values[a.name]
            c_args.append(c_scalar(value, dtype, self.name, a.name))
        dims = {d: env[d] for d in self.decl.dims}
        return PreparedCall(types, key, tuple(c_args), arrays, dims)

    def _view(self, arg: str, obj: Any, stream_ptr: int) -> ArrayView:
        """An array argument as the call reads it, or a TypeError that names the argument."""
        try:
            view = array_view(obj, stream_ptr)
        except ArrayInterfaceError as exc:
            raise TypeError(f"{self.name}(): argument {arg!r}: {exc}") from None
        if view is None:
            raise TypeError(
                f"{self.name}(): argument {arg!r} must be a GPU array exposing __cuda_array_interface__ or DLPack "
                f"(CuPy, PyTorch, Numba, JAX), got {type(obj).__name__}"
            )
        return view

    def check_views(
        self, values: Mapping[str, Any], arrays: Mapping[str, ArrayView], constants: Mapping[str, Any], pointers: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Every check of a call that its arrays' metadata can answer: (types and constants,
        key, the environment that shapes and computed scalars are evaluated in). `arrays` may
        leave out arrays the call does not have yet (the outputs that a PyTorch operator
        allocates, runtime/torch_ops.py); `pointers=False` skips the checks of the data
        pointers (a fake tensor has none). Sizes may be PyTorch's symbolic integers."""
        types: dict[str, Any] = {}
        bound_by: dict[str, str] = {}
        for a in self.decl.args:
            view = arrays.get(a.name)
            if view is not None:
                self._check_array(a, view, types, bound_by, pointers)
        return self._check_call(values, arrays, types, constants)

    def _check_array(self, a: ArgDecl, view: ArrayView, types: dict[str, Any], bound_by: dict[str, str], pointers: bool) -> None:
        """An array argument's own checks; binds the type parameter of its dtype in `types`."""
        name, arg, type_params = self.name, a.name, self.decl.type_params
        if view.device == -1:
            raise ValueError(f"{name}(): argument {arg!r} is in host memory; expected a GPU array")
        declared = a.dtype
        if declared in type_params:
            if view.dtype not in type_params[declared]:
                raise TypeError(
                    f"{name}(): argument {arg!r} has dtype {view.dtype_text()}; "
                    f"expected one of {list(type_params[declared])} (type parameter {declared})"
                )
            if declared in types and types[declared] != view.dtype:
                raise TypeError(
                    f"{name}(): argument {arg!r} has dtype {view.dtype} but {bound_by[declared]!r} has {types[declared]}; both are {declared}"
                )
            types[declared], bound_by[declared] = view.dtype, arg
        elif view.dtype != declared:
            raise TypeError(f"{name}(): argument {arg!r} has dtype {view.dtype_text()}; expected {declared}")
        dims = len(a.shape or ())
        if len(view.shape) != dims:
            raise ValueError(f"{name}(): argument {arg!r} has {len(view.shape)} dimension(s) {view.shape}; expected {dims}")
        if a.strides == "contiguous":
            if not view.contiguous:
                raise ValueError(_not_contiguous(name, a))
        elif 0 not in view.shape:  # an empty array has no memory to lay out
            _check_strides(name, a, view)
        if pointers and not view.ptr and 0 not in view.shape:  # only an empty array may have no memory
            raise ValueError(
                f"{name}(): argument {arg!r} has a null data pointer but shape {view.shape}; "
                "expected device memory (only an empty array may have a null pointer)"
            )
        if view.readonly and a.intent != "in":
            raise ValueError(f"{name}(): argument {arg!r} is read-only but the kernel writes it (intent {a.intent})")
        align = a.align
        if pointers and align and view.ptr % align:
            raise ValueError(
                f"{name}(): argument {arg!r} must start on a {align}-byte boundary (the kernel uses vector "
                f"loads); its pointer {view.ptr:#x} is offset by {view.ptr % align} bytes: pass a copy"
            )

    def _check_call(
        self, values: Mapping[str, Any], arrays: Mapping[str, ArrayView], types: dict[str, Any], constants: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The checks of a whole call, after its arrays': type parameters, constants, key, shapes."""
        name = self.name
        for tp, allowed in self.decl.type_params.items():
            if tp not in types:
                if len(allowed) != 1:
                    absent = [
                        a.name for a in self.decl.args if a.optional and a.dtype == tp and a.name in values and values[a.name] is None
                    ]
                    if absent:
                        raise TypeError(
                            f"{name}(): cannot infer type parameter {tp} (one of {list(allowed)}): only {', '.join(map(repr, absent))} "
                            "would give it, and the call passes None"
                        )
                    raise TypeError(f"{name}(): cannot infer type parameter {tp} from the arguments")
                types[tp] = allowed[0]
        given = dict(constants)
        for c, arg in self._layout_constants.items():  # the variant for the array's innermost stride
            given[c] = _unit_stride(arrays.get(arg))
        chosen = self.selector.resolve_constants(given, f"{name}()")
        types.update(chosen)

        key: dict[str, Any] = {}
        for k in self.decl.key:
            source = k.source
            if k.axis is not None:
                key[k.name] = arrays[source].shape[k.axis]
            else:
                value = values[source]
                if isinstance(value, bool) or not isinstance(value, integral_types()):
                    raise TypeError(f"{name}(): argument {source!r} must be an integer (it defines key dim {k.name}), got {value!r}")
                if not 0 <= value <= MAX_SIZE:
                    raise ValueError(f"{name}(): argument {source!r}={value} defines key dim {k.name}, a size: expected 0 to {MAX_SIZE}")
                key[k.name] = int(value)
            if k.mapping == "exact":  # a miss is the caller's error, said as select() says it, before the driver
                try:
                    map_to_bucket(key[k.name], k.buckets, "exact", k.name)
                except ValueError as exc:
                    source_text = f"{source}.shape[{k.axis}]" if k.axis is not None else f"argument {source!r}"
                    raise ValueError(f"{name}(): {exc} (from {source_text})") from None
        env = {**key, **chosen} if chosen else key  # shapes and computed scalars may use the constants
        bound_from: dict[str, tuple[str, int]] = {}  # free dim -> the (array, axis) it was read from
        if self._dim_sources:
            env = dict(env)
            for dim, sources in self._dim_sources.items():
                for arg, axis in sources:
                    view = arrays.get(arg)
                    if view is not None:
                        env[dim], bound_from[dim] = view.shape[axis], (arg, axis)
                        break
        for arg, view in arrays.items():
            expected = self.expected_shape(arg, env, key)
            if view.shape != expected:
                raise ValueError(self._shape_error(arg, view.shape, expected, env, bound_from))
        return types, key, env

    def _shape_error(
        self, arg: str, shape: tuple[Any, ...], expected: tuple[Any, ...], env: Mapping[str, Any], bound_from: Mapping[str, tuple[str, int]]
    ) -> str:
        """Why an array's shape is wrong; for an axis that is a free dim, which array gave it."""
        found = f"{self.name}(): argument {arg!r} has shape {shape}; expected {expected}"
        for axis, (tree, got, want) in enumerate(zip(self.decl.arg(arg).shape or (), shape, expected)):
            if got == want:
                continue
            for dim, (source, source_axis) in bound_from.items():
                if _bare(tree, dim) and source != arg:
                    return (
                        f"{found}: its dim {axis} is the free dim {dim}, which is {want} in {source!r} ({source}.shape[{source_axis}]) "
                        f"but {got} in {arg!r}; every array must agree on {dim}"
                    )
            break
        return f"{found} (from {_env_text(env)})"

    def expected_shape(self, arg: str, env: Mapping[str, Any], key: Mapping[str, Any]) -> tuple[Any, ...]:
        """The shape that array `arg` must have for a call's key dims and constants (`env`), or
        a ValueError saying why there is none."""
        try:
            expected = tuple(fn(env) for fn in self._shape_fns[arg])
        except ExpressionError as exc:
            raise ValueError(f"{self.name}(): the shape of argument {arg!r} cannot be computed for {_env_text(env)}: {exc}") from None
        if any(d < 0 for d in expected):
            exprs = ", ".join(tree_text(t) for t in self.decl.arg(arg).shape or ()) + ("," if len(expected) == 1 else "")
            raise ValueError(
                f"{self.name}(): argument {arg!r} would have shape ({exprs}) = {expected} for {_env_text(env)}, "
                f"a negative size: {_env_text(key)} is too small for this kernel"
            )
        return expected


def _bare(tree: Any, name: str) -> bool:
    """Whether a shape's expression tree is the name alone (an axis that *is* that dim)."""
    return isinstance(tree, (list, tuple)) and len(tree) == 2 and tree[0] == "n" and tree[1] == name


def _unit_stride(view: ArrayView | None) -> bool:
    """Whether an array's innermost stride is one element (a size of 1 has no stride that
    matters); an array the call does not have (None passed, or an output the operator
    allocates C-contiguous) counts as unit. bool(): under torch.compile with dynamic shapes a
    stride is symbolic and `== 1` a SymBool; bool() decides it and guards the graph on it, as the
    choice of variant depends on it."""
    if view is None or not view.shape or view.shape[-1] <= 1:
        return True
    return view.strides is not None and bool(view.strides[-1] == 1)


def _not_contiguous(kernel: str, a: ArgDecl) -> str:
    """The refusal of a non-contiguous array on a C-contiguous argument. A copy is advice only
    for an array the kernel reads: one it writes would receive the results in the copy."""
    found = f"{kernel}(): argument {a.name!r} must be C-contiguous (row-major, dense)"
    declare = 'the kernel\'s author can declare the argument `strides = "inner"` (unit innermost stride) or `"any"` to take strided arrays'
    if a.writes:
        return f"{found}: the kernel writes it (intent {a.intent}) and takes no strides for it, so a copy would not receive the results; {declare}"
    return f"{found}; pass a contiguous copy, or {declare}"


def _check_strides(kernel: str, a: ArgDecl, view: ArrayView) -> None:
    """A strided argument's layout (`strides = "inner"` or `"any"`): element strides, none
    negative, a unit innermost one for "inner", no two elements sharing memory where the kernel
    writes, and with `align` every stride a whole number of aligned vectors. Sizes of 1 have no
    stride that matters."""
    arg, strides, shape = a.name, view.strides, view.shape
    if strides is None:
        raise ValueError(
            f"{kernel}(): argument {arg!r} has byte strides that are not whole {view.dtype} elements; a strided argument "
            "takes strides in elements (a view of an array of this dtype)"
        )
    live = [(s, n, i) for i, (s, n) in enumerate(zip(strides, shape)) if n != 1]
    copy = " (pass a copy with non-negative strides)" if not a.writes else ""
    for s, _, i in live:
        if s < 0:
            raise ValueError(
                f"{kernel}(): argument {arg!r} has a negative stride in dim {i} (strides {strides} in elements); "
                f"hatch-autotune passes no negative strides{copy}"
            )
    if a.strides == "inner" and shape and shape[-1] != 1 and strides[-1] != 1:
        fix = "pass a copy whose rows are contiguous" if not a.writes else 'the kernel\'s author can declare it `strides = "any"`'
        raise ValueError(
            f"{kernel}(): argument {arg!r} has strides {strides} (elements); the kernel takes it with a unit innermost stride "
            f'(strides = "inner": rows of contiguous elements, the outer strides free): {fix}'
        )
    if a.writes:
        need = 1  # sorted by stride, each dim must step over everything the smaller ones span
        for s, n, i in sorted(live):
            if s < need:
                raise ValueError(
                    f"{kernel}(): argument {arg!r} has shape {shape} and strides {strides} (elements), whose elements may share "
                    f"memory (dim {i}); the kernel writes it (intent {a.intent}), so each element needs its own"
                )
            need = s * n
    if a.align and view.dtype in DTYPE_SIZES:
        size = DTYPE_SIZES[view.dtype]
        for s, _, i in live:
            if s != 1 and s * size % a.align:
                raise ValueError(
                    f"{kernel}(): argument {arg!r} has a stride of {s} elements ({s * size} bytes) in dim {i}, not a multiple of "
                    f"its {a.align}-byte alignment (the kernel uses vector loads): pass a view whose strides are multiples of "
                    f"{max(a.align // size, 1)} elements (rows padded to {a.align} bytes)"
                )


def _env_text(env: Mapping[str, Any]) -> str:
    """`n=3, RADIUS=2`: the key dims and constants that a shape is computed from."""
    return ", ".join(f"{n}={v}" for n, v in env.items())
