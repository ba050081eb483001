"""Inputs for one bucket: random data of the declared dtype and shape (never zeros, so a kernel
that writes nothing or reads the wrong element is visible), or a user generator.

A user generator is named in the config as `inputs = "module:function"` and called as
`function(key, types, rng)` -> {argument name: NumPy array or number} for the caller-passed
arguments (every argument without `value`, outputs included). A reference is
`reference = "module:function"`, called with those inputs as keyword arguments (copies) and
returning {output name: array} (or one array when the kernel has one output); each array has its
output's shape and a numeric dtype of ours (a float64 reference for a float32 output, a float32
one for a bfloat16 or FP8 output, are fine: the comparison runs in the wider dtype), complex only
for a complex output.

Every dtype is a NumPy dtype through `dtypes.numpy_dtype` (ml_dtypes' for bfloat16 and FP8): a
hook's arrays of those dtypes are ml_dtypes arrays (`x.astype(ml_dtypes.bfloat16)`).

Shapes may use the kernel's free dims, at the sizes `dims` gives them; an optional array is
always made (tuning runs the kernel with it present). An array of an argument declared with
strides is a strided view into a larger buffer (input_layout.py), whatever made its values.

Whatever a hook does wrong (its module or function missing, an exception, a result of the wrong
names, shapes or dtypes) is an InputError, a BuildError: one message that names the kernel, the
hook as configured (`inputs = 'mod:fn'`), the bucket and what was expected.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..declare.config import KernelSpec
from ..errors import BuildError
from ..runtime.values import DTYPE_SIZES
from .dtypes import dtype_name, kind, numpy_dtype, part_dtype
from .input_layout import laid_out, span, tuning_layout, tuning_strides


class InputError(BuildError, ValueError):
    """A user generator or reference is missing, raised, or returned something unusable."""


def _bucket(types: Mapping[str, str], key: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in {**key, **types}.items())


def load_function(ref: str, root: Path, where: str | None = None) -> Callable[..., Any]:
    """Import `module:function`, with the project root (and src/) importable. `where` prefixes
    the error message (which kernel and hook asked)."""
    where = where or f"{ref!r}"
    module_name, _, func = ref.partition(":")
    for p in (str(root / "src"), str(root)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise InputError(
                f"{where}: no module named {module_name!r} (looked in {root}, {root / 'src'} and sys.path); "
                "expected 'module:function' naming a module of the project"
            ) from None
        raise InputError(f"{where}: importing module {module_name!r} failed: {_describe(exc)}") from exc
    except Exception as exc:
        raise InputError(f"{where}: importing module {module_name!r} failed: {_describe(exc)}") from exc
    fn = getattr(module, func, None)
    if fn is None:
        raise InputError(f"{where}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function {func!r}")
    if not callable(fn):
        raise InputError(f"{where}: {module_name}.{func} is a {type(fn).__name__}, not a function")
    function: Callable[..., Any] = fn
    return function


def _describe(exc: BaseException) -> str:
    """`Type: message (file:line)`, the line being the innermost frame, where the user's code is."""
    if isinstance(exc, SyntaxError) and exc.filename:  # its str() names the file already, less exactly
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _call(fn: Callable[..., Any], where: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise InputError(f"{where}: raised {_describe(exc)}") from exc


def resolved_dtype(dtype: str, types: Mapping[str, str]) -> str:
    """An argument's dtype for a type instance: a type parameter's name becomes its dtype."""
    return types.get(dtype, dtype)


def shapes(spec: KernelSpec, key: Mapping[str, int], types: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each array's shape at a bucket, for an instance (shapes may use its constants and the
    free dims, at their declared sizes)."""
    env = {**spec.dims, **key, **spec.type_env(types)}
    return {a.name: tuple(int(e(env)) for e in a.shape or ()) for a in spec.args if a.is_array}


def input_bytes(spec: KernelSpec, key: Mapping[str, int], types: Mapping[str, Any]) -> int:
    """What a bucket's arrays hold, in bytes, without making them (the scheduler's cost estimate)."""
    return InputRecipe.of(spec, types, key, ".", 0).nbytes()


RANDOM_BLOCK = 1 << 22  # elements drawn from one seed: blocks are drawn in parallel, the same data whatever the threads
E8M0_EXPONENTS = (-4, 4)  # float8_e8m0fnu inputs (scales): 2^-4 ... 2^4, whose products stay far from overflow


def _random_array(shape: tuple[int, ...], dtype: str, seed: Sequence[int]) -> Any:
    """Never all zeros, so that a kernel that writes nothing or reads the wrong element shows:
    ~ N(0, 1) (never 0) for real floats, bfloat16 and FP8 drawn as float32 and rounded; positive
    powers of two for float8_e8m0fnu (its only values); real and imaginary parts ~ N(0, 1) for
    complex; random booleans (at least one true); integers in [1, 100) otherwise. Drawn in blocks
    of RANDOM_BLOCK elements, each from its own child of `seed`, on as many threads as there are
    CPUs (NumPy draws without the GIL): a 512 MB array takes a fraction of a second, not seconds."""
    import numpy as np

    out = np.empty(math.prod(shape), numpy_dtype(dtype))
    children = np.random.SeedSequence(list(seed)).spawn(max(1, -(-out.size // RANDOM_BLOCK)))
    what = kind(dtype)

    def normal(rng: Any, n: int, as_dtype: str) -> Any:
        drawn = rng.standard_normal(n, dtype=np.float64 if as_dtype == "float64" else np.float32)
        drawn[drawn == 0] = 1
        return drawn

    def fill(i: int) -> None:
        block = out[i * RANDOM_BLOCK : (i + 1) * RANDOM_BLOCK]
        rng = np.random.default_rng(children[i])
        if dtype == "float8_e8m0fnu":  # the biased exponent is the byte
            low, high = E8M0_EXPONENTS
            block.view(np.uint8)[:] = 127 + rng.integers(low, high, size=block.size, endpoint=True)
        elif what == "float":
            block[:] = normal(rng, block.size, dtype)
            block[block == 0] = 1  # never zeros, where rounding to a narrow dtype made one
        elif what == "complex":
            part = part_dtype(dtype)
            block.view(numpy_dtype(part))[:] = normal(rng, 2 * block.size, part)  # real, imaginary interleaved
        elif what == "bool":
            block[:] = rng.integers(0, 2, size=block.size).astype(bool)
        else:
            block[:] = rng.integers(1, 100, size=block.size)

    if len(children) == 1:
        fill(0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(len(children), os.cpu_count() or 1)) as pool:
            list(pool.map(fill, range(len(children))))
    if what == "bool" and out.size and not out.any():
        out[0] = True
    return out.reshape(shape)


def _random_scalar(dtype: str, rng: Any) -> Any:
    """A scalar != 0 of `dtype`: a float in [0.5, 2] rounded to the dtype (so that a reference
    computes with the value the kernel gets), a power of two for float8_e8m0fnu, a complex with
    both parts so, a random bool, an integer in [1, 8)."""
    what = kind(dtype)
    if dtype == "float8_e8m0fnu":
        low, high = E8M0_EXPONENTS
        return 2.0 ** int(rng.integers(low, high, endpoint=True))
    if what == "float":
        return float(numpy_dtype(dtype).type(rng.uniform(0.5, 2.0)))
    if what == "complex":
        part = numpy_dtype(part_dtype(dtype)).type
        return complex(float(part(rng.uniform(0.5, 2.0))), float(part(rng.uniform(0.5, 2.0))))
    if what == "bool":
        return bool(rng.integers(0, 2))
    return int(rng.integers(1, 8))


def _scalar_problem(dtype: str, value: Any) -> str | None:
    """What a user's scalar of `dtype` should have been, or None when it is fine: a number for
    real floats (NumPy's and ml_dtypes' scalars included), a number for complex, a bool for bool,
    an integer for integers; never a bool where a number is meant."""
    import numpy as np

    what = kind(dtype)
    if what == "bool":
        return None if isinstance(value, (bool, np.bool_)) else "a bool"
    if isinstance(value, (bool, np.bool_)):
        return "an integer" if what == "int" else "a number"
    if what == "int":
        return None if isinstance(value, numbers.Integral) else "an integer"
    accepted = numbers.Real if what == "float" else numbers.Complex
    if isinstance(value, accepted) or (isinstance(value, np.generic) and _ours(value.dtype) in ("float", what)):
        return None
    return "a number"


def _ours(dtype: Any) -> str | None:
    """The kind of a NumPy dtype when it is one of ours, else None."""
    name = dtype_name(dtype)
    return kind(name) if name in DTYPE_SIZES else None


@dataclass(frozen=True)
class ArgRecipe:
    """One caller-passed argument of a bucket, resolved: its dtype, its shape (arrays), and the
    key dim a scalar must equal (None: drawn)."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None  # None: a scalar
    intent: str
    position: int  # among every declared argument: a random array is drawn from (seed, position)
    key_dim: str | None = None
    strides: tuple[int, ...] | None = None  # a strided argument's array: its view's element strides (input_layout.py)

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    def nbytes(self) -> int:
        """What the array's buffer holds, in bytes (its padding included); 0 for a scalar."""
        if self.shape is None:
            return 0
        elements = math.prod(self.shape) if self.strides is None else span(self.shape, self.strides)
        return elements * DTYPE_SIZES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape),
               "intent": self.intent, "position": self.position, "key_dim": self.key_dim}  # fmt: skip
        if self.strides is not None:
            out["strides"] = list(self.strides)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ArgRecipe:
        shape, strides = raw["shape"], raw.get("strides")
        dims = None if shape is None else tuple(int(d) for d in shape)
        laid = None if strides is None else tuple(int(s) for s in strides)
        return cls(str(raw["name"]), str(raw["dtype"]), dims, str(raw["intent"]), int(raw["position"]), raw["key_dim"], laid)


@dataclass(frozen=True)
class InputRecipe:
    """How a bucket's inputs (and the user's reference outputs) are made: plain data, so that
    the worker makes them where they are used, from the same seed, and no array travels
    through a file; the tuner, a benchmark and a test make the very same arrays with `make`.
    `args` are the caller-passed arguments (those without `value`), in declaration order."""

    kernel: str
    types: Mapping[str, Any]  # the instance: type parameters and constants
    key: Mapping[str, int]
    seed: int
    args: tuple[ArgRecipe, ...]
    root: str  # the project folder: the user's hooks import from it
    generator: str | None = None  # `inputs = "module:function"`
    reference: str | None = None  # `reference = "module:function"`
    constants: tuple[str, ...] = ()  # the instance's constants, passed to the reference by name
    computed: tuple[str, ...] = ()  # arguments computed from the key at launch (for messages)

    @classmethod
    def of(cls, spec: KernelSpec, types: Mapping[str, Any], key: Mapping[str, int], root: Path | str, seed: int) -> InputRecipe:
        arr_shapes = shapes(spec, key, types)
        key_sources = {k.source: k.name for k in spec.key if k.axis is None}
        layout = {a.unit_stride_constant for a in spec.args}  # set from the arrays, not the reference's business
        args = tuple(
            ArgRecipe(
                a.name,
                resolved_dtype(a.dtype, types),
                arr_shapes[a.name] if a.is_array else None,
                a.intent or "in",
                position,
                None if a.is_array else key_sources.get(a.name),
                tuning_strides(arr_shapes[a.name], resolved_dtype(a.dtype, types), tuning_layout(a, types), a.align)
                if a.is_array
                else None,
            )
            for position, a in enumerate(spec.args)
            if not a.computed
        )
        return cls(
            spec.name, dict(types), dict(key), int(seed), args, str(root), spec.inputs, spec.reference,
            tuple(c for c in types if c in spec.constants and c not in layout), tuple(a.name for a in spec.args if a.computed),
        )  # fmt: skip

    @property
    def outputs(self) -> list[ArgRecipe]:
        return [a for a in self.args if a.is_array and a.intent in ("out", "inout")]

    def nbytes(self) -> int:
        """What the arrays hold, in bytes (the scheduler's cost estimate; nothing is made)."""
        return sum(a.nbytes() for a in self.args)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "types": dict(self.types), "key": dict(self.key), "seed": self.seed,
            "args": [a.to_json() for a in self.args], "root": self.root, "generator": self.generator,
            "reference": self.reference, "constants": list(self.constants), "computed": list(self.computed),
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InputRecipe:
        return cls(
            str(raw["kernel"]), dict(raw["types"]), {str(k): int(v) for k, v in raw["key"].items()}, int(raw["seed"]),
            tuple(ArgRecipe.from_json(a) for a in raw["args"]), str(raw["root"]), raw.get("generator"), raw.get("reference"),
            tuple(raw.get("constants", ())), tuple(raw.get("computed", ())),
        )  # fmt: skip

    def identity(self) -> str:
        """One string per distinct recipe: what a prefetched bucket is found by."""
        import json

        return json.dumps(self.to_json(), sort_keys=True)

    def where(self, which: str) -> str:
        hook = self.generator if which == "inputs" else self.reference
        return f"kernel {self.kernel!r}: {which} = {hook!r}"

    def make(self) -> dict[str, Any]:
        """The caller-passed arguments: the user's generator's when configured, else random."""
        if self.generator is None:
            return self._random()
        return self._generated()

    def _random(self) -> dict[str, Any]:
        """Arrays as _random_array draws them, scalars as _random_scalar. Output-only arrays are
        zeros (not touched: the worker allocates and poisons them on the device, only their shape
        and dtype matter)."""
        import numpy as np

        rng = np.random.default_rng(self.seed)
        out: dict[str, Any] = {}
        for a in self.args:
            if a.shape is not None:
                values = (
                    np.zeros(a.shape, numpy_dtype(a.dtype))
                    if a.intent == "out"
                    else _random_array(a.shape, a.dtype, (self.seed, a.position))
                )
                out[a.name] = laid_out(values, a.strides)
            elif a.key_dim is not None:
                out[a.name] = self.key[a.key_dim]
            else:
                out[a.name] = _random_scalar(a.dtype, rng)
        return out

    def _generated(self) -> dict[str, Any]:
        import numpy as np

        where = f"{self.where('inputs')} ({_bucket(self.types, self.key)})"
        fn = load_function(str(self.generator), Path(self.root), where)
        got = _call(fn, where, dict(self.key), dict(self.types), np.random.default_rng(self.seed))
        expected_names = [a.name for a in self.args]
        if not isinstance(got, Mapping):
            raise InputError(f"{where}: returned a {type(got).__name__}; expected a dict with the arguments {expected_names}")
        missing = [n for n in expected_names if n not in got]
        extra = sorted(map(str, set(got) - set(expected_names)))
        if missing or extra:
            problems = ([f"missing {missing}"] if missing else []) + ([f"unknown {extra}"] if extra else [])
            note = f" ({', '.join(self.computed)} computed from the key, not passed)" if self.computed else ""
            raise InputError(f"{where}: returned arguments {sorted(map(str, got))}: {', '.join(problems)}; expected {expected_names}{note}")
        out: dict[str, Any] = {}
        for a in self.args:
            value = got[a.name]
            if a.shape is not None:
                if not isinstance(value, np.ndarray) or value.dtype != numpy_dtype(a.dtype) or value.shape != a.shape:
                    found = (
                        f"a {value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
                    )
                    raise InputError(f"{where}: argument {a.name!r} must be a {a.dtype} array of shape {a.shape}, got {found}")
                out[a.name] = laid_out(np.ascontiguousarray(value), a.strides)  # uploaded as raw bytes: C order, or its buffer
                continue
            wanted = _scalar_problem(a.dtype, value)
            if wanted is not None:
                raise InputError(f"{where}: argument {a.name!r} must be {wanted} ({a.dtype}), got {value!r}")
            if a.key_dim is not None and value != self.key[a.key_dim]:
                dim = a.key_dim
                raise InputError(
                    f"{where}: argument {a.name!r} is the key dim {dim!r} and must be {self.key[dim]} in this bucket, got {value!r}"
                )
            out[a.name] = value
        return out

    def reference_outputs(self, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """Expected outputs from the user's NumPy reference, or None when none is configured.
        Each output's expected shape is the shape of its array in `inputs`. The instance's
        constants are passed too, by name (a stencil's reference needs its radius)."""

        import numpy as np

        if self.reference is None:
            return None
        where = self.where("reference")
        outputs = self.outputs
        names = [a.name for a in outputs]
        fn = load_function(self.reference, Path(self.root), where)
        constants = {c: self.types[c] for c in self.constants}
        got = _call(fn, where, **{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}, **constants)
        expected = "{" + ", ".join(f"{n!r}: array" for n in names) + "}" + (" or one array" if len(names) == 1 else "")
        if isinstance(got, np.ndarray) and len(outputs) == 1:
            got = {names[0]: got}
        if not isinstance(got, Mapping):
            raise InputError(f"{where}: returned a {type(got).__name__}; expected {expected}")
        if sorted(map(str, got)) != sorted(names):
            raise InputError(f"{where}: returned outputs {sorted(map(str, got))}; expected {expected}")
        out = {}
        for a in outputs:
            value = got[a.name]
            try:
                array = np.asarray(value)
            except Exception:
                array = None
            shape = np.shape(inputs[a.name]) if a.name in inputs else None
            if array is None or not _reference_fits(a.dtype, array.dtype) or (shape is not None and array.shape != shape):
                found = f"{array.dtype} array of shape {array.shape}" if array is not None else type(value).__name__
                want = f"shape {shape}" if shape is not None else "the output's shape"
                numeric = "numeric" if kind(a.dtype) == "complex" else "real numeric"
                raise InputError(f"{where}: output {a.name!r} must be a {numeric} array of {want}, got {found}")
            out[a.name] = np.ascontiguousarray(array)
        return out


def _reference_fits(output: str, reference: Any) -> bool:
    """Whether a reference array's dtype can verify an output of dtype `output`: one of ours, and
    complex only for a complex output (verify.comparison)."""
    found = _ours(reference)
    return found is not None and (found != "complex" or kind(output) == "complex")


def random_inputs(spec: KernelSpec, types: Mapping[str, str], key: Mapping[str, int], seed: int) -> dict[str, Any]:
    """Caller-passed arguments for a bucket, random (InputRecipe._random)."""
    return InputRecipe.of(spec, types, key, ".", seed)._random()


def bucket_inputs(spec: KernelSpec, types: Mapping[str, str], key: Mapping[str, int], root: Path, seed: int = 0) -> dict[str, Any]:
    """The inputs a bucket is tuned on: the user's generator when configured, else random."""
    return InputRecipe.of(spec, types, key, root, seed).make()


def reference_outputs(spec: KernelSpec, inputs: Mapping[str, Any], root: Path, types: Mapping[str, Any]) -> dict[str, Any] | None:
    """Expected outputs from the user's NumPy reference (InputRecipe.reference_outputs)."""
    import numpy as np

    key = {k.name: int(np.shape(inputs[k.source])[k.axis] if k.axis is not None else inputs[k.source]) for k in spec.key}
    return InputRecipe.of(spec, types, key, root, 0).reference_outputs(inputs)
