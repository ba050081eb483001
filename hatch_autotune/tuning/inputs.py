"""Inputs for one bucket: random data of the declared dtype and shape (never zeros, so a kernel
that writes nothing or reads the wrong element is visible), or a user generator.

A user generator is named in the config as `inputs = "module:function"` and called as
`function(key, types, rng)` -> {argument name: NumPy array or number} for the caller-passed
arguments (every argument without `value`, outputs included). A reference is
`reference = "module:function"`, called with those inputs as keyword arguments (copies) and
returning {output name: array} (or one array when the kernel has one output); each array has its
output's shape and a real numeric dtype (a float64 reference for a float32 output is fine: the
comparison runs in float64).

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
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..declare.config import KernelSpec
from ..errors import BuildError


class InputError(BuildError, ValueError):
    """A user generator or reference is missing, raised, or returned something unusable."""


def _hook(spec: KernelSpec, which: str) -> str:
    return f"kernel {spec.name!r}: {which} = {getattr(spec, which)!r}"


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
    except Exception as exc:  # noqa: BLE001 - a user module that fails at import (SyntaxError, ...)
        raise InputError(f"{where}: importing module {module_name!r} failed: {_describe(exc)}") from exc
    fn = getattr(module, func, None)
    if fn is None:
        raise InputError(f"{where}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function {func!r}")
    if not callable(fn):
        raise InputError(f"{where}: {module_name}.{func} is a {type(fn).__name__}, not a function")
    return fn


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
    except Exception as exc:  # noqa: BLE001 - the user's code: reported with the kernel and hook
        raise InputError(f"{where}: raised {_describe(exc)}") from exc


def resolved_dtype(dtype: str, types: Mapping[str, str]) -> str:
    """An argument's dtype for a type instance: a type parameter's name becomes its dtype."""
    return types.get(dtype, dtype)


def shapes(spec: KernelSpec, key: Mapping[str, int], types: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each array's shape at a bucket, for an instance (shapes may use its constants)."""
    env = {**key, **spec.type_env(types)}
    return {a.name: tuple(int(e(env)) for e in a.shape or ()) for a in spec.args if a.is_array}


def input_bytes(spec: KernelSpec, key: Mapping[str, int], types: Mapping[str, Any]) -> int:
    """What a bucket's arrays hold, in bytes, without making them (the scheduler's cost estimate)."""
    import numpy as np

    sizes = shapes(spec, key, types)
    return sum(math.prod(sizes[a.name]) * np.dtype(resolved_dtype(a.dtype, types)).itemsize for a in spec.args if a.is_array)


RANDOM_BLOCK = 1 << 22  # elements drawn from one seed: blocks are drawn in parallel, the same data whatever the threads


def _random_array(shape: tuple[int, ...], dtype: str, seed: Sequence[int]) -> Any:
    """~ N(0, 1) (never 0) for floats, integers in [1, 100) otherwise; drawn in blocks of
    RANDOM_BLOCK elements, each from its own child of `seed`, on as many threads as there are
    CPUs (NumPy draws without the GIL): a 512 MB array takes a fraction of a second, not seconds."""
    import numpy as np

    out = np.empty(math.prod(shape), dtype)
    children = np.random.SeedSequence(list(seed)).spawn(max(1, -(-out.size // RANDOM_BLOCK)))
    draw_as = np.float64 if dtype == "float64" else np.float32

    def fill(i: int) -> None:
        block = out[i * RANDOM_BLOCK : (i + 1) * RANDOM_BLOCK]
        rng = np.random.default_rng(children[i])
        if dtype.startswith("float"):
            block[:] = rng.standard_normal(block.size, dtype=draw_as)
            block[block == 0] = 1  # never zeros
        else:
            block[:] = rng.integers(1, 100, size=block.size)

    if len(children) == 1:
        fill(0)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(len(children), os.cpu_count() or 1)) as pool:
            list(pool.map(fill, range(len(children))))
    return out.reshape(shape)


def random_inputs(spec: KernelSpec, types: Mapping[str, str], key: Mapping[str, int], seed: int) -> dict[str, Any]:
    """Caller-passed arguments for a bucket: arrays ~ N(0, 1) (ints in [1, 100)), scalars != 0.
    Output-only arrays are zeros: the worker poisons them before every run, so only their shape
    and dtype matter."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    key_sources = {k.source: k.name for k in spec.key if k.axis is None}
    arr_shapes = shapes(spec, key, types)
    for position, a in enumerate(spec.args):
        if a.value is not None:
            continue  # computed from the key at launch
        dtype = resolved_dtype(a.dtype, types)
        if a.is_array:
            shape = arr_shapes[a.name]
            out[a.name] = np.zeros(shape, dtype) if a.intent == "out" else _random_array(shape, dtype, (seed, position))
        elif a.name in key_sources:
            out[a.name] = key[key_sources[a.name]]
        elif dtype.startswith("float"):
            out[a.name] = float(rng.uniform(0.5, 2.0))
        else:
            out[a.name] = int(rng.integers(1, 8))
    return out


def bucket_inputs(spec: KernelSpec, types: Mapping[str, str], key: Mapping[str, int], root: Path, seed: int = 0) -> dict[str, Any]:
    """The inputs a bucket is tuned on: the user's generator when configured, else random."""
    import numpy as np

    if spec.inputs is None:
        return random_inputs(spec, types, key, seed)
    where = f"{_hook(spec, 'inputs')} ({_bucket(types, key)})"
    fn = load_function(spec.inputs, root, where)
    got = _call(fn, where, dict(key), dict(types), np.random.default_rng(seed))
    expected_names = [a.name for a in spec.args if a.value is None]
    if not isinstance(got, Mapping):
        raise InputError(f"{where}: returned a {type(got).__name__}; expected a dict with the arguments {expected_names}")
    missing = [n for n in expected_names if n not in got]
    extra = sorted(map(str, set(got) - set(expected_names)))
    if missing or extra:
        problems = ([f"missing {missing}"] if missing else []) + ([f"unknown {extra}"] if extra else [])
        computed = [a.name for a in spec.args if a.value is not None]
        note = f" ({', '.join(computed)} computed from the key, not passed)" if computed else ""
        raise InputError(f"{where}: returned arguments {sorted(map(str, got))}: {', '.join(problems)}; expected {expected_names}{note}")
    arr_shapes = shapes(spec, key, types)
    key_sources = {k.source: k.name for k in spec.key if k.axis is None}
    out: dict[str, Any] = {}
    for a in spec.args:
        if a.value is not None:
            continue
        value, dtype = got[a.name], resolved_dtype(a.dtype, types)
        if a.is_array:
            if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype) or value.shape != arr_shapes[a.name]:
                found = f"a {value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
                raise InputError(f"{where}: argument {a.name!r} must be a {dtype} array of shape {arr_shapes[a.name]}, got {found}")
            out[a.name] = np.ascontiguousarray(value)  # uploaded as raw bytes in C order
            continue
        integral = not dtype.startswith("float")
        kind = numbers.Integral if integral else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InputError(f"{where}: argument {a.name!r} must be {'an integer' if integral else 'a number'} ({dtype}), got {value!r}")
        if a.name in key_sources and value != key[key_sources[a.name]]:
            dim = key_sources[a.name]
            raise InputError(f"{where}: argument {a.name!r} is the key dim {dim!r} and must be {key[dim]} in this bucket, got {value!r}")
        out[a.name] = value
    return out


def reference_outputs(spec: KernelSpec, inputs: Mapping[str, Any], root: Path, types: Mapping[str, Any]) -> dict[str, Any] | None:
    """Expected outputs from the user's NumPy reference, or None when none is configured. Each
    output's expected shape is the shape of its array in `inputs`. The instance's constants
    are passed too, by name (a stencil's reference needs its radius)."""
    import numpy as np

    if spec.reference is None:
        return None
    where = _hook(spec, "reference")
    outputs = [a for a in spec.args if a.is_array and a.intent in ("out", "inout")]
    names = [a.name for a in outputs]
    fn = load_function(spec.reference, root, where)
    constants = {c: v for c, v in types.items() if c in spec.constants}
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
        except Exception:  # noqa: BLE001 - ragged lists and the like
            array = None
        shape = np.shape(inputs[a.name]) if a.name in inputs else None
        if array is None or array.dtype.kind not in "biuf" or (shape is not None and array.shape != shape):
            found = f"{array.dtype} array of shape {array.shape}" if array is not None else type(value).__name__
            want = f"shape {shape}" if shape is not None else "the output's shape"
            raise InputError(f"{where}: output {a.name!r} must be a real numeric array of {want}, got {found}")
        out[a.name] = np.ascontiguousarray(array)
    return out
