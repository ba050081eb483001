"""A kernel of a generated module: its selection (`select()`, from the table's entries) and its
call path, from Python arguments through every check to a launch on the right device and
stream. `Binaries` is what a Kernel needs to find its compiled code: the wheel's `Library`
(library.py), or the tuning worker's own."""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading

from . import cuda_seam
from .args import (
    _CODES,
    CUPY,
    TORCH,
    PreparedCall,
    array_reader,
    array_view,
    as_constant,
    c_scalar,
    integral_types,
    stream_handle,
)
from .cuda_seam import CACHE_LIMIT, CU_STREAM_LEGACY, check_cuda, current_device_cc
from .errors import ArrayInterfaceError, ExpressionError, short_repr
from .expr import compile_expr, tree_text
from .params import PACK_ERRORS, POINTER, ParamBuffer
from .selection import Selection, as_compute_capability, map_to_bucket, ptx_driver_needed
from .table import TableEntry
from .values import MAX_SIZE, instance_env, types_key

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any, Callable, Mapping, Sequence

    from .args import ArrayView
    from .cuda_seam import GpuState


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


_MISSING = object()
STREAM_DOC = (
    "stream: None (the current stream of the arrays' library, CuPy's or PyTorch's, else the device's "
    "default stream), a cuda.core/CuPy/PyTorch stream, or a raw handle (int)"
)  # the stubs' docstrings say it too (wheel/stub.py)
_NO_CONSTANTS: Mapping[str, Any] = {}

# How the fast path takes each argument: an array is its alignment in bytes (1 or more), so that
# one `ptr % kind` checks it; a scalar is 0, a key scalar (its value picks the bucket) -1.
_SCALAR, _KEY_SCALAR = 0, -1


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
        self._shape_trees = {a["name"]: a["shape"] for a in self.args if a["kind"] == "array"}
        self._shape_fns = {arg: [compile_expr(t) for t in trees] for arg, trees in self._shape_trees.items()}
        self._value_fns = {a["name"]: compile_expr(a["value"]) for a in self.args if "value" in a}
        self._memo: dict[Any, Any] = {}
        self._fast: dict[tuple, _FastPlan] = {}
        # Calls that took the checked path (every argument checked, a fast plan recorded); the
        # rest took the fast path. A count that grows with every call says the fast path is
        # missed, e.g. a new stream object per call.
        self.checked_calls = 0
        self._n_user = len(self.user_args)
        self._constant_names = tuple(self.constants)
        key_scalars = {k["from"] for k in self.key if k["axis"] is None}
        kinds = {
            a["name"]: (a.get("align") or 1) if a["kind"] == "array" else _KEY_SCALAR if a["name"] in key_scalars else _SCALAR
            for a in self.args
        }
        self._user_kinds: tuple[int, ...] = tuple(kinds[n] for n in self.user_args)
        c_slot = {a["name"]: c for c, a in enumerate(self.args)}
        self._user_slots = tuple(c_slot[n] for n in self.user_args)  # each argument's C parameter
        self._kernels: dict[tuple[int, str, str], Any] = {}
        self._load_lock = allocate_lock()
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
            for bucket, raw in sorted(entries.items()):
                e = TableEntry.from_json(raw)
                label = " ".join(f"{n}={b}" for n, b in zip(self._key_names, bucket))
                out[f"{tkey} {arch} {label}"] = {"variant": e.variant, "tuned": e.tuned, "provenance": e.provenance_json()}
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
                shape = ", ".join(tree_text(t) for t in a["shape"])
                lines.append(f"  {a['name']}: GPU array, {dtype}, shape ({shape}), C-contiguous, intent {a['intent']}")
            else:
                lines.append(f"  {a['name']}: scalar, {dtype}")
        for c, values in self.constants.items():
            lines.append(f"  {c}: constant, keyword only, one of {values!r}" + (" (the only value)" if len(values) == 1 else ""))
        lines.append(f"  {STREAM_DOC}")
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
            exact = as_constant(value, kind)
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

    def select(self, arch: Any = None, *extra: Any, **key: Any) -> Selection:
        """Choose the variant for key dims (and type parameters and constants) on a device arch.

        ``arch`` is 'sm_86', '8.6', 86 or (8, 6); None asks the current CUDA device.
        """
        if extra:
            names = [*self._key_names, *self.type_params, *self.constants]
            raise TypeError(
                f"{self.name}.select() takes one positional argument (arch), got {1 + len(extra)}; "
                f"key dims, type parameters and constants are passed by keyword ({', '.join(f'{n}=' for n in names)})"
            )
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
        bucket = self._bucket(given)  # a miss of an exact key is said before the device is asked
        cc = as_compute_capability(arch) if arch is not None else current_device_cc()
        return self._selection(cc, types, given, bucket)

    def _bucket(self, key: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(map_to_bucket(key[k["name"]], k["buckets"], k["mapping"], k["name"]) for k in self.key)

    def _selection(
        self, cc: tuple[int, int], types: Mapping[str, str], key: Mapping[str, int], bucket: tuple[int, ...] | None = None
    ) -> Selection:
        if bucket is None:
            bucket = self._bucket(key)
        table_arch, binary = self._binaries.binary_for(cc)
        entry = TableEntry.from_json(self._select[(types_key(types), table_arch)][bucket])
        variant = self.variants[entry.variant]
        return Selection(
            kernel=self.name,
            variant=entry.variant,
            config=dict(variant["config"]),
            types={tp: types[tp] for tp in self.type_params},
            constants={c: types[c] for c in self.constants},
            bucket=dict(zip(self._key_names, bucket)),
            tuned=entry.tuned,
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
        arrays: dict[str, ArrayView] = {}
        types: dict[str, Any] = {}
        bound_by: dict[str, str] = {}
        for a in self.args:  # each array read, then checked, in declared order: the first wrong one is named
            if a["kind"] == "array":
                view = arrays[a["name"]] = self._view(a["name"], values[a["name"]], stream_ptr)
                self._check_array(a, view, types, bound_by, True)
        types, key, env = self._check_call(values, arrays, types, constants)
        c_args: list[Any] = []
        for a in self.args:
            arg = a["name"]
            if a["kind"] == "array":
                c_args.append(arrays[arg].ptr)
                continue
            dtype = types.get(a["dtype"], a["dtype"])
            value = self._value_fns[arg](env) if arg in self._value_fns else values[arg]
            c_args.append(c_scalar(value, dtype, self.name, arg))
        return PreparedCall(types, key, tuple(c_args), arrays)

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
        for a in self.args:
            view = arrays.get(a["name"])
            if view is not None:
                self._check_array(a, view, types, bound_by, pointers)
        return self._check_call(values, arrays, types, constants)

    def _check_array(self, a: Mapping[str, Any], view: ArrayView, types: dict[str, Any], bound_by: dict[str, str], pointers: bool) -> None:
        """An array argument's own checks; binds the type parameter of its dtype in `types`."""
        name, arg = self.name, a["name"]
        if view.device == -1:
            raise ValueError(f"{name}(): argument {arg!r} is in host memory; expected a GPU array")
        declared = a["dtype"]
        if declared in self.type_params:
            if view.dtype not in self.type_params[declared]:
                raise TypeError(
                    f"{name}(): argument {arg!r} has dtype {view.dtype_text()}; "
                    f"expected one of {self.type_params[declared]} (type parameter {declared})"
                )
            if declared in types and types[declared] != view.dtype:
                raise TypeError(
                    f"{name}(): argument {arg!r} has dtype {view.dtype} but {bound_by[declared]!r} has "
                    f"{types[declared]}; both are {declared}"
                )
            types[declared], bound_by[declared] = view.dtype, arg
        elif view.dtype != declared:
            raise TypeError(f"{name}(): argument {arg!r} has dtype {view.dtype_text()}; expected {declared}")
        if len(view.shape) != len(a["shape"]):
            raise ValueError(f"{name}(): argument {arg!r} has {len(view.shape)} dimension(s) {view.shape}; expected {len(a['shape'])}")
        if not view.contiguous:
            raise ValueError(f"{name}(): argument {arg!r} must be C-contiguous (row-major, dense); pass a contiguous copy")
        if pointers and not view.ptr and 0 not in view.shape:  # only an empty array may have no memory
            raise ValueError(
                f"{name}(): argument {arg!r} has a null data pointer but shape {view.shape}; "
                "expected device memory (only an empty array may have a null pointer)"
            )
        if view.readonly and a["intent"] != "in":
            raise ValueError(f"{name}(): argument {arg!r} is read-only but the kernel writes it (intent {a['intent']})")
        align = a.get("align")
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
        for tp, allowed in self.type_params.items():
            if tp not in types:
                if len(allowed) != 1:
                    raise TypeError(f"{name}(): cannot infer type parameter {tp} from the arguments")
                types[tp] = allowed[0]
        chosen = self._resolve_constants(dict(constants), f"{name}()")
        types.update(chosen)

        key: dict[str, Any] = {}
        for k in self.key:
            source = k["from"]
            if k["axis"] is not None:
                key[k["name"]] = arrays[source].shape[k["axis"]]
            else:
                value = values[source]
                if isinstance(value, bool) or not isinstance(value, integral_types()):
                    raise TypeError(f"{name}(): argument {source!r} must be an integer (it defines key dim {k['name']}), got {value!r}")
                if not 0 <= value <= MAX_SIZE:
                    raise ValueError(f"{name}(): argument {source!r}={value} defines key dim {k['name']}, a size: expected 0 to {MAX_SIZE}")
                key[k["name"]] = int(value)
            if k["mapping"] == "exact":  # a miss is the caller's error, said as select() says it, before the driver
                try:
                    map_to_bucket(key[k["name"]], k["buckets"], "exact", k["name"])
                except ValueError as exc:
                    source_text = f"{source}.shape[{k['axis']}]" if k["axis"] is not None else f"argument {source!r}"
                    raise ValueError(f"{name}(): {exc} (from {source_text})") from None
        env = {**key, **chosen} if chosen else key  # shapes and computed scalars may use the constants
        for arg, view in arrays.items():
            expected = self.expected_shape(arg, env, key)
            if view.shape != expected:
                raise ValueError(f"{name}(): argument {arg!r} has shape {view.shape}; expected {expected} (from {_env_text(env)})")
        return types, key, env

    def expected_shape(self, arg: str, env: Mapping[str, Any], key: Mapping[str, Any]) -> tuple[Any, ...]:
        """The shape that array `arg` must have for a call's key dims and constants (`env`), or
        a ValueError saying why there is none."""
        try:
            expected = tuple(fn(env) for fn in self._shape_fns[arg])
        except ExpressionError as exc:
            raise ValueError(f"{self.name}(): the shape of argument {arg!r} cannot be computed for {_env_text(env)}: {exc}") from None
        if any(d < 0 for d in expected):
            exprs = ", ".join(tree_text(t) for t in self._shape_trees[arg]) + ("," if len(expected) == 1 else "")
            raise ValueError(
                f"{self.name}(): argument {arg!r} would have shape ({exprs}) = {expected} for {_env_text(env)}, "
                f"a negative size: {_env_text(key)} is too small for this kernel"
            )
        return expected

    # The call path. A first call with a given signature (array types, dtypes, shapes, layouts
    # and devices, scalar types, stream) goes through every check in _prepare, then starts the
    # driver, and records a _FastPlan per device; later calls with the same signature read each
    # array's pointer (CuPy's and PyTorch's through their own attributes: args.array_reader),
    # check its alignment, pack the pointers and scalars into the plan's parameter buffer and
    # launch, from any thread. The device is the arrays' own (CuPy, PyTorch), the only one, or,
    # with several GPUs and other arrays, the one the driver says they are on.

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        sig: list[Any] = [stream if stream is None or type(stream) is int else id(stream)]
        constants: Mapping[str, Any] = _NO_CONSTANTS
        if kwargs:
            constants = self._take_constants(kwargs)
            if kwargs:
                return self._call_checked(self._bind(args, kwargs), stream, None, constants)
            if any(type(v) not in (int, bool) for v in constants.values()):
                return self._call_checked(list(args), stream, None, constants)  # names what is wrong, or converts
            sig.append(tuple((c, type(v), v) for c, v in constants.items()))  # the type too: True == 1, not for a constant
        if len(args) != self._n_user:
            return self._call_checked(self._bind(args, kwargs), stream, None, constants)
        values: list[Any] = []  # the caller's values as the kernel takes them: pointers for arrays
        device = library = None  # the arrays' own device, and their type, where they say (CuPy, PyTorch)
        codes = _CODES
        for obj, kind in zip(args, self._user_kinds):
            if kind > 0:  # an array; `kind` is its alignment
                t = type(obj)
                code = codes.get(t) or array_reader(t).code  # found once per type
                if code is CUPY:
                    memory = obj.data
                    ptr = memory.ptr
                    on = memory.device_id
                    sig += (t, obj.dtype, obj.shape, obj.strides, on)
                    if device is None:
                        device, library = on, t
                elif code is TORCH:
                    ptr = obj.data_ptr()
                    on = obj.get_device() if obj.is_cuda else -1  # another backend's index is no CUDA device
                    sig += (t, obj.dtype, obj.shape, obj.stride(), on)
                    if device is None:
                        device, library = on, t
                else:
                    try:
                        cai = obj.__cuda_array_interface__
                        data = cai["data"]
                        sig += (t, cai["typestr"], cai["shape"], data[1], cai.get("strides"))
                    except (LookupError, TypeError, AttributeError):  # DLPack only, not an array, or not a real
                        return self._call_checked(list(args), stream, None, constants)  # interface: checked
                    ptr = data[0]
                # an int pointer that fits the parameter (below 2**63), aligned, not null: a null or
                # odd one (an empty array's, or a mistake) takes the checked path, which says which
                if type(ptr) is not int or ptr <= 0 or ptr % kind:  # above 2**63 - 1: struct refuses it
                    return self._call_checked(list(args), stream, None, constants)
                values.append(ptr)
            else:
                sig.append((type(obj), obj) if kind else type(obj))  # a key scalar's value picks the bucket
                values.append(obj)
        gpu = cuda_seam.current
        if gpu.api is None:  # the first call in this process: checks first, then the driver
            return self._call_checked(list(args), stream, tuple(sig), constants)
        if gpu.single_device is None:  # several GPUs: the driver says where the other arrays are
            others = [v for v, obj, kind in zip(values, args, self._user_kinds) if kind > 0 and codes.get(type(obj)) not in (CUPY, TORCH)]
            if others:
                found = self._arrays_device(gpu, others)
                if found is None or (device is not None and found != device):  # unknown or mixed: the
                    return self._call_checked(list(args), stream, tuple(sig), constants)  # checked path says which
                device = found
        if device is None:
            device = gpu.single_device
            if device is None:  # several GPUs, no array to say which: the checked path finds it
                return self._call_checked(list(args), stream, tuple(sig), constants)
        current_stream = array_reader(library).current_stream if library is not None else None  # asked below
        sig.append(device)
        try:
            plan = self._fast.get(tuple(sig))
        except TypeError:  # an interface with a list (shape, strides): valid, but no plan is keyed by it
            return self._call_checked(list(args), stream, None, constants)
        if plan is None or (stream is not None and plan.stream_ref is not stream and type(stream) is not int):
            return self._call_checked(list(args), stream, tuple(sig[:-1]), constants)
        handle = plan.stream
        if handle is None:  # stream=None: where the arrays' library runs its own work, else the default
            # (a library's null stream 0 is its legacy one: 0 is the per-thread one where cuda-python
            # is told to use that)
            handle = (current_stream(device) or CU_STREAM_LEGACY) if current_stream is not None else gpu.default_stream
        try:
            params = plan.take()  # the plan's buffer, unless another thread is launching from it
        except IndexError:
            params = plan.params.fresh()
        try:
            params.pack(params.storage, 0, *values)
        except PACK_ERRORS:  # a scalar its C type cannot hold: the checked path says which
            plan.give(params)
            return self._call_checked(list(args), stream, None, constants)
        driver = gpu.driver  # the launch, as GpuState.launch does it, inline: a call costs 0.1 µs
        err, current = driver.cuCtxGetCurrent()
        if err or int(current) != plan.context:
            gpu.launch(device, plan.head, handle, params.address, self.name)  # the caller's context is another
        else:
            result = driver.cuLaunchKernel(*plan.head, handle, params.address, 0)
            if result[0]:
                gpu.raise_launch_error(result[0], self.name)
        plan.give(params)  # not after a failed launch: a later call makes a fresh one
        return None

    @staticmethod
    def _arrays_device(gpu: GpuState, ptrs: Sequence[Any]) -> int | None:
        """The one device that every non-null pointer is on, else None (several GPUs only)."""
        found = None
        for ptr in ptrs:
            if type(ptr) is not int or not 0 <= ptr <= MAX_SIZE:
                return None  # not a pointer: the checked path names it
            if ptr:
                device = gpu.pointer_device(ptr)
                if device is None or (found is not None and device != found):
                    return None
                found = device
        return found

    def _call_checked(self, bound: list[Any], stream: Any, fast_sig: tuple | None, constants: Mapping[str, Any]) -> None:
        """Every check, then the launch; records a fast plan under `fast_sig` + device."""
        self.checked_calls += 1
        handle = stream_handle(stream)
        gpu = cuda_seam.current
        ordering = gpu.default_stream if handle is None else handle or CU_STREAM_LEGACY  # DLPack forbids stream 0
        call = self._prepare(bound, ordering, constants)
        gpu.start()  # NoDriverError only now, after every check that needs no driver
        gpu.planners.add(self)  # so that use_gpu() drops the plans made below
        device = self._device_of(gpu, call)
        memo_key = (device, tuple(call.types.values()), tuple(call.key.values()))
        head = self._memo.get(memo_key)
        if head is None:
            head = self._plan(gpu, device, call)
            if len(self._memo) >= CACHE_LIMIT:
                self._memo.clear()
            self._memo[memo_key] = head
        plan = _FastPlan(self, call, head, handle, stream, gpu.primary_handle(device))
        if fast_sig is not None and not plan.empty:  # an empty problem's calls stay on this path: they launch nothing
            if len(self._fast) >= CACHE_LIMIT:
                self._fast.clear()
            try:
                self._fast[(*fast_sig, device)] = plan
            except TypeError:  # an unhashable key (a list in an array interface): every such call is checked
                pass
        if plan.empty:  # a zero-sized problem launches nothing
            return
        if handle is None:
            library_stream = self._library_stream(bound)
            handle = (library_stream(device) or CU_STREAM_LEGACY) if library_stream is not None else gpu.default_stream
        try:
            params = plan.take()  # published above: a fast call of another thread may hold it
        except IndexError:
            params = plan.params.fresh()
        params.exact.pack_into(params.storage, 0, *[call.c_args[c] for c in self._user_slots])
        gpu.launch(device, plan.head, handle, params.address, self.name)
        plan.give(params)

    def _library_stream(self, bound: Sequence[Any]) -> Callable[[int], int] | None:
        """The current-stream reader of the first array whose library has one (CuPy, PyTorch)."""
        for obj, kind in zip(bound, self._user_kinds):
            if kind > 0:
                reader = array_reader(type(obj))
                if reader.current_stream is not None:
                    return reader.current_stream
        return None

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

    def _plan(self, gpu: GpuState, device: int, call: PreparedCall) -> tuple[Any, ...] | None:
        """(function, grid x3, block x3, shared bytes) for a (device, types, key), the head of
        its cuLaunchKernel; None for a zero-sized problem. Computed once, memoised."""
        sel = self._selection(gpu.device_cc(device), call.types, call.key)
        grid, block, shared = self.geometry(sel.config, call.types, call.key)
        if min(grid) == 0:
            return None
        dims = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
        return (self._kernel_handle(gpu, device, sel), *dims[0], *dims[1], shared)

    def geometry(
        self, config: Mapping[str, Any], types: Mapping[str, str], key: Mapping[str, int]
    ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(grid, block, dynamic shared bytes) of a config at a key: the declared expressions."""
        env = {**key, **config, **instance_env(types)}
        grid = tuple(int(f(env)) for f in self._grid)
        block = tuple(int(f(env)) for f in self._block)
        shared = int(self._shared(env))
        if any(g < 0 for g in grid) or any(b <= 0 for b in block) or shared < 0:
            raise ValueError(f"{self.name}: launch geometry grid={grid} block={block} shared={shared} is invalid for {dict(key)}")
        return grid, block, shared

    def _kernel_handle(self, gpu: GpuState, device: int, sel: Selection) -> Any:
        """The CUfunction of a selection on a device: its cubin (or PTX, JIT-compiled) loaded
        into the device's primary context once, with the driver's own calls."""
        cache_key = (device, sel.variant, sel.binary)
        handle = self._kernels.get(cache_key)
        if handle is None:
            with self._load_lock:
                handle = self._kernels.get(cache_key)
                if handle is None:
                    data = self.binary(sel)
                    is_ptx = sel.binary.startswith("compute_")
                    if is_ptx:
                        self._check_ptx_driver(gpu, sel)
                        if not data.endswith(b"\0"):
                            data += b"\0"  # cuModuleLoadData reads PTX as a C string
                    driver = gpu.driver
                    what = f"{self.name} variant {sel.variant}, {sel.binary}, on device {device}"
                    with gpu.on_device(device):
                        module = check_cuda(driver.cuModuleLoadData(data), f"cuModuleLoadData ({what})")
                        handle = check_cuda(driver.cuModuleGetFunction(module, self.entry.encode()), f"cuModuleGetFunction ({what})")
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


def _env_text(env: Mapping[str, Any]) -> str:
    """`n=3, RADIUS=2`: the key dims and constants that a shape is computed from."""
    return ", ".join(f"{n}={v}" for n, v in env.items())


class _FastPlan:
    """What a call with a known signature needs: the launch's head (function, grid, block,
    shared bytes), the parameter buffers that its pointers and scalars are packed into
    (`take()` one, `give()` it back), and its stream (None: asked at each call, see
    Kernel.__call__)."""

    __slots__ = ("params", "take", "give", "head", "empty", "stream", "stream_ref", "context")

    def __init__(self, kernel: Kernel, call: PreparedCall, head: tuple[Any, ...] | None, stream: int | None, stream_ref: Any, context: int):
        user_index = {name: i for i, name in enumerate(kernel.user_args)}
        layout = []
        for a, value in zip(kernel.args, call.c_args):
            name = a["name"]
            dtype = POINTER if a["kind"] == "array" else call.types.get(a["dtype"], a["dtype"])
            layout.append((dtype, user_index.get(name), None if name in user_index else value))
        self.params = ParamBuffer(layout)
        # Buffers not in use: cuLaunchKernel reads a buffer while it runs (without the GIL), so a
        # call takes one (list.pop is atomic) and gives it back after its launch; a call that
        # finds none (another thread launches this plan) packs into a fresh one.
        free = [self.params]
        self.take, self.give = free.pop, free.append
        self.head, self.empty = head or (), head is None
        self.stream = stream
        self.stream_ref = stream_ref  # the user's stream object, so a new object is not mistaken for it
        self.context = context  # the device's primary context (an int): where the launch must happen
