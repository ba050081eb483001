"""PyTorch custom operators (torch.library) for a generated module's kernels: torch.compile traces
through them without a graph break, shape propagation and torch.export see their outputs, and
CUDA graphs capture them. The generated `<module>.torch_ops` calls `register` when it is
imported; `import <module>` never does, and this module imports PyTorch in `register` alone.

Per kernel K, under a namespace ns (the hook's `torch-namespace`, by default the top-level package):

  ns::K      K's call returning what it writes: its `out` arrays allocated (shape and dtype from
             the declaration, on the inputs' device) and returned. For a kernel without `out`
             arrays, K's call as declared: it writes its `inout` arrays and returns nothing.
  ns::K_out  (kernels with `out` arrays) K's call as declared, writing into outputs the caller
             passes.

`operators` derives both from the declaration (a `KernelDecl`) alone, so the build's stub (wheel/stub.py) and the
registration agree. A schema takes the kernel's arguments in declared order (tensors, of any
dtype: the kernel's checks name a wrong one; `Tensor?` for an optional array; scalars as `int`,
`float` (bfloat16 and FP8 included), `complex` or `bool` by dtype), then its constants,
keyword-only; `(a0!)` marks what it writes. Tensors reach the kernel as they are: a strided one
on an argument declared with strides is not made contiguous (its operator is tagged to keep the
caller's exact strides under torch.compile; the others' to get contiguous ones).

Each operator has three implementations: the call (the kernel's own checks, then the launch on
PyTorch's current stream, where the kernel launches for PyTorch tensors anyway), a fake one for
tracing (the same checks on the tensors' metadata, with the same messages, and the outputs'
shapes: symbolic sizes pass through), and a fallthrough for autograd: the kernels have no
gradient, so their outputs never require one (what PyTorch asks of non-differentiable
operators). torch.library.Library's own registration is used, not torch.library.custom_op,
whose Python layers cost about 8x as much per call.
"""

from __future__ import annotations

from .args import torch_view
from .cuda_seam import CACHE_LIMIT
from .record import Record
from .scalars import c_scalar
from .values import COMPLEX_DTYPES, INT_RANGES

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping, Sequence
    from typing import Any

    from .declaration import ArgDecl, KernelDecl
    from .kernel import Kernel
    from .library import Library

OUT_SUFFIX = "_out"  # K_out: the operator that writes into the caller's outputs
MIN_TORCH = (2, 4)  # torch.library.register_fake


class Operator(Record):
    """One PyTorch operator of a kernel, as `operators` derives it from the declaration."""

    __slots__ = ("name", "kernel", "params", "returns", "mutates", "schema", "note")
    name: str  # its name in the namespace: K or K_out
    kernel: str
    params: tuple[str, ...]  # the kernel's arguments it takes, in declared order
    returns: tuple[str, ...]  # the `out` arrays it allocates and returns, in declared order
    mutates: tuple[str, ...]  # the arguments it writes, which its schema marks
    schema: str  # '(float a, Tensor x, Tensor(a0!) y) -> ()'
    note: str  # K_out of a kernel that cannot have a functional K: why; else ''


def operators(decl: KernelDecl) -> tuple[Operator, ...]:
    """A kernel's operators, from its declaration."""
    kernel, type_params = decl.name, decl.type_params
    user = decl.user_args
    outs = tuple(a.name for a in user if a.is_array and a.intent == "out")
    written = tuple(a.name for a in user if a.writes)
    keywords = _constants_schema(decl.call_constants)  # those the call sets from a layout are not passed
    as_declared = _schema(user, written, type_params, keywords, "()")
    names = tuple(a.name for a in user)
    if not outs:
        return (Operator(kernel, kernel, names, (), written, as_declared, ""),)
    blocker = functional_blocker(decl)
    out_form = Operator(kernel + OUT_SUFFIX, kernel, names, (), written, as_declared, blocker or "")
    if blocker:
        return (out_form,)
    inputs = [a for a in user if a.name not in outs]
    returns = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    inout = tuple(n for n in written if n not in outs)
    functional = Operator(
        kernel, kernel, tuple(a.name for a in inputs), outs, inout, _schema(inputs, inout, type_params, keywords, returns), ""
    )
    return (functional, out_form)


def functional_blocker(decl: KernelDecl) -> str | None:
    """Why a kernel's `out` arrays cannot be allocated from its other arguments, or None."""
    outs = {a.name: a for a in decl.args if a.is_array and a.intent == "out"}
    inputs = [a for a in decl.args if a.is_array and a.name not in outs]
    for k in decl.key:
        if k.source in outs:
            return f"key dim {k.name} is read from `out` array {k.source!r}, so the outputs' sizes are not known before the call"
    if not inputs:
        return "it has no array but its `out` arrays, so no tensor says which device they go on"
    if all(a.optional for a in inputs):
        return "every array but its `out` arrays is optional, so no tensor surely says which device they go on"
    for dim in decl.dims:
        bare = ["n", dim]
        sources = [a.name for a in decl.args if a.shape is not None and not a.optional and any(list(t) == bare for t in a.shape)]
        if sources and all(s in outs for s in sources):
            return (
                f"free dim {dim} is read only from `out` arrays ({', '.join(sources)}), so the outputs' sizes are not known before the call"
            )
    fixed = {a.dtype for a in inputs}
    for name, a in outs.items():
        tp = a.dtype
        if len(decl.type_params.get(tp, ())) > 1 and tp not in fixed:
            return f"the dtype of `out` array {name!r} is type parameter {tp}, which no other array fixes"
    return None


def scalar_type(dtype: str, type_params: Mapping[str, Sequence[str]]) -> str:
    """A scalar argument's type in a schema: int, float (every real float dtype: bfloat16 and FP8
    scalars are passed as Python floats), complex or bool, or Scalar for a type parameter of
    several of these."""
    kinds = {_scalar_kind(d) for d in type_params.get(dtype, (dtype,))}
    return kinds.pop() if len(kinds) == 1 else "Scalar"


def _scalar_kind(dtype: str) -> str:
    return "bool" if dtype == "bool" else "int" if dtype in INT_RANGES else "complex" if dtype in COMPLEX_DTYPES else "float"


def _schema(user: Sequence[ArgDecl], written: Sequence[str], type_params: Mapping[str, Sequence[str]], keywords: str, returns: str) -> str:
    params = []
    for a in user:
        name = a.name
        if a.is_array:
            optional = "?" if a.optional else ""
            params.append(f"Tensor(a{written.index(name)}!){optional} {name}" if name in written else f"Tensor{optional} {name}")
        else:
            params.append(f"{scalar_type(a.dtype, type_params)} {name}")
    return f"({', '.join(params + ([keywords] if keywords else []))}) -> {returns}"


def _constants_schema(constants: Mapping[str, Sequence[Any]]) -> str:
    """`*, int RADIUS, bool PERIODIC=False`: required with several values, defaulted with one."""
    parts = []
    for name, values in constants.items():
        kind = "bool" if type(values[0]) is bool else "int"
        parts.append(f"{kind} {name}" + (f"={values[0]!r}" if len(values) == 1 else ""))
    return ", ".join(["*", *parts]) if parts else ""


# ---- registration ---------------------------------------------------------------------------


class _Registration:
    """A namespace's operators, as registered once per process: their packets
    (`torch.ops.<ns>.<name>`), their schemas, and the library whose kernels they launch
    (`library` is replaced when the same module is imported again, see `register`)."""

    def __init__(self, module: str, schemas: dict[str, str], library: Library, torch_library: Any):
        self.module = module
        self.schemas = schemas
        self.library = library
        self.torch_library = torch_library  # kept alive: PyTorch drops the operators with it
        self.packets: dict[str, Any] = {}


_REGISTERED: dict[str, _Registration] = {}


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            f"the kernels' PyTorch operators need PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer (pip install torch); "
            f"the kernels themselves do not: call them directly ({exc})"
        ) from None
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < MIN_TORCH:
        raise ImportError(
            f"the kernels' PyTorch operators need PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer "
            f"(torch.library.register_fake); this is PyTorch {torch.__version__}"
        )
    return torch


def register(library: Library, namespace: str) -> dict[str, Any]:
    """Register the operators of `library`'s kernels under `namespace`, once per process, and
    return them by name (`torch.ops.<namespace>.<name>`).

    The same module imported again (another copy of its files: a reinstall, a reload) takes over
    the operators, whose schemas must be the same; another module's operators in the namespace
    are an error that says so."""
    torch = _import_torch()
    ops = [op for k in library.kernels.values() for op in operators(k.declaration)]
    schemas = {op.name: op.schema for op in ops}
    held = _REGISTERED.get(namespace)
    if held is not None:
        if held.module != library.module:
            raise RuntimeError(
                f"{library.module}: torch.ops.{namespace} already holds the operators of {held.module}; two modules cannot "
                f"share a namespace: set `torch-namespace` in one's hook table (pyproject.toml) and rebuild it"
            )
        if held.schemas != schemas:
            changed = sorted(n for n in set(schemas) | set(held.schemas) if schemas.get(n) != held.schemas.get(n))
            raise RuntimeError(
                f"{library.module}: torch.ops.{namespace} was registered in this process by another build of this module, "
                f"whose operators differ ({', '.join(changed)}); PyTorch cannot redefine an operator: restart the process"
            )
        held.library = library
        return dict(held.packets)
    reg = _Registration(library.module, schemas, library, torch.library.Library(namespace, "FRAGMENT"))
    contiguous = getattr(torch.Tag, "needs_contiguous_strides", None) or getattr(torch.Tag, "needs_fixed_stride_order", None)
    exact = getattr(torch.Tag, "needs_exact_strides", None) or getattr(torch.Tag, "needs_fixed_stride_order", None)
    for op in ops:
        kernel = library.kernels[op.kernel]
        impl = _Implementation(torch, reg, op, kernel)
        # what Inductor hands the operator: a strided argument takes the caller's own strides
        tag = exact if any(a.strided for a in kernel.declaration.args) else contiguous
        try:
            reg.torch_library.define(op.name + op.schema, tags=(tag,) if tag is not None else ())
        except RuntimeError as exc:
            raise RuntimeError(f"{library.module}: cannot define operator {namespace}::{op.name}{op.schema}: {exc}") from None
        reg.torch_library.impl(op.name, impl.call if op.returns else impl.launch, "CompositeExplicitAutograd")
        reg.torch_library.impl(op.name, torch.library.fallthrough_kernel, "Autograd")
        torch.library.register_fake(f"{namespace}::{op.name}", impl.fake, lib=reg.torch_library)
    packets = getattr(torch.ops, namespace)
    reg.packets = {op.name: getattr(packets, op.name) for op in ops}
    _REGISTERED[namespace] = reg
    return dict(reg.packets)


class _Implementation:
    """An operator's call (`launch` for one that returns nothing, `call` for one that allocates
    its outputs) and its fake implementation, over the registration's current kernels."""

    def __init__(self, torch: Any, reg: _Registration, op: Operator, kernel: Kernel):
        self.torch, self.reg, self.op = torch, reg, op
        self.kernel_name = op.kernel
        decl = kernel.declaration
        declared = {a.name: a for a in decl.args}
        self.arrays = [i for i, n in enumerate(op.params) if declared[n].is_array]  # positions of the tensors
        self.optional = any(declared[op.params[i]].optional for i in self.arrays)  # a tensor may be None
        self.scalars = [(i, n, declared[n].dtype) for i, n in enumerate(op.params) if not declared[n].is_array]
        self.key_scalars = [i for i, n in enumerate(op.params) if any(k.source == n and k.axis is None for k in decl.key)]
        self.out_dtypes = [declared[n].dtype for n in op.returns]
        # the kernel's arguments, in its order, from (the operator's arguments + the outputs)
        position = {n: i for i, n in enumerate(op.params)} | {n: len(op.params) + j for j, n in enumerate(op.returns)}
        order = [position[n] for n in kernel.user_args]
        self.reorder = None if order == list(range(len(order))) else order
        self.memo: dict[Any, Any] = {}

    def launch(self, *args: Any, **constants: Any) -> None:
        """An operator that returns nothing: the kernel's call, checks and all."""
        self.reg.library.kernels[self.kernel_name](*args, **constants)

    def call(self, *args: Any, **constants: Any) -> Any:
        """A functional operator: its outputs allocated where its first tensor is, then the
        kernel's call (checks and all) with them. Shapes and dtypes are memoised per signature,
        whose first call checks the arguments before anything is allocated."""
        tensors = [args[i] for i in self.arrays]
        present: tuple[bool, ...] = ()
        if self.optional:  # which optional tensors the call has: part of the signature
            present = tuple(t is not None for t in tensors)
            tensors = [t for t in tensors if t is not None]
        signature = (
            *present,
            *[t.shape for t in tensors],
            *[t.dtype for t in tensors],
            *[args[i] for i in self.key_scalars],
            *constants.items(),
        )
        outputs = self.memo.get(signature)
        if outputs is None:
            outputs = self._outputs(args, constants)
            if len(self.memo) >= CACHE_LIMIT:
                self.memo.clear()
            self.memo[signature] = outputs
        device = tensors[0].device
        empty = self.torch.empty
        made = [empty(shape, dtype=dtype, device=device) for shape, dtype in outputs]
        everything = (*args, *made)
        if self.reorder is not None:
            everything = tuple(everything[i] for i in self.reorder)
        self.reg.library.kernels[self.kernel_name](*everything, **constants)
        return made[0] if len(made) == 1 else tuple(made)

    def fake(self, *args: Any, **constants: Any) -> Any:
        """What tracing sees: the call's checks on the tensors' metadata, and outputs of the
        right shape, dtype and device."""
        outputs = self._outputs(args, constants)
        if not self.op.returns:
            return None
        device = next(args[i] for i in self.arrays if args[i] is not None).device
        made = [self.torch.empty(shape, dtype=dtype, device=device) for shape, dtype in outputs]
        return made[0] if len(made) == 1 else tuple(made)

    def _outputs(self, args: Sequence[Any], constants: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], Any]]:
        """Every check a call's metadata can answer, as the kernel words it; then (shape, dtype)
        of each output the operator allocates."""
        kernel = self.reg.library.kernels[self.kernel_name]
        values = dict(zip(self.op.params, args))
        views = {}
        for i in self.arrays:  # tensors, as the schema says: fake, meta or real (None: an optional one left out)
            if args[i] is not None:
                views[self.op.params[i]] = torch_view(args[i], memory=False)
        types, key, env = kernel.checks.check_views(values, views, constants, pointers=False)
        for i, name, dtype in self.scalars:
            if type(args[i]) in (int, float, complex, bool):  # a symbolic one (torch.compile's) is checked at the call
                c_scalar(args[i], types.get(dtype, dtype), kernel.name, name)
        return [
            (kernel.checks.expected_shape(name, env, key), self._torch_dtype(types.get(dtype, dtype), name))
            for name, dtype in zip(self.op.returns, self.out_dtypes)
        ]

    def _torch_dtype(self, dtype: str, arg: str) -> Any:
        """PyTorch's dtype of ours (the same name: torch.bfloat16, torch.float8_e5m2), or an
        error saying that this PyTorch has none (float8_e8m0fnu came in PyTorch 2.7)."""
        found = getattr(self.torch, dtype, None)
        if found is None:
            raise TypeError(
                f"{self.kernel_name}(): output {arg!r} is {dtype}, which PyTorch {self.torch.__version__} has no dtype for; "
                "a newer PyTorch has"
            )
        return found
