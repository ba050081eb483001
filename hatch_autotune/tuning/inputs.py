"""Inputs for one bucket: random data of the declared dtype and shape (never zeros, so a kernel
that writes nothing or reads the wrong element is visible), or a user generator.

A user generator is named in the config as `inputs = "module:function"` and called as
`function(key, types, rng)` -> {argument name: NumPy array or number} for the caller-passed
arguments. A reference is `reference = "module:function"`, called with those inputs as keyword
arguments and returning {output name: array} (or one array when the kernel has one output).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import DTYPES, KernelSpec


class InputError(ValueError):
    """A user generator or reference returned something unusable; the message says what."""


def load_function(ref: str, root: Path) -> Callable[..., Any]:
    """Import `module:function`, with the project root (and src/) importable."""
    module_name, _, func = ref.partition(":")
    for p in (str(root / "src"), str(root)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        module = importlib.import_module(module_name)
        return getattr(module, func)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot load {ref!r}: {exc}") from None


def resolved_dtype(spec: KernelSpec, dtype: str, types: Mapping[str, str]) -> str:
    return types.get(dtype, dtype)


def shapes(spec: KernelSpec, key: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    return {a.name: tuple(int(e(key)) for e in a.shape) for a in spec.args if a.is_array}


def random_inputs(spec: KernelSpec, types: Mapping[str, str], key: Mapping[str, int], seed: int) -> dict[str, Any]:
    """Caller-passed arguments for a bucket: arrays ~ N(0, 1) (ints in [1, 100)), scalars != 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    key_sources = {k.source: k.name for k in spec.key if k.axis is None}
    arr_shapes = shapes(spec, key)
    for a in spec.args:
        if a.value is not None:
            continue  # computed from the key at launch
        dtype = resolved_dtype(spec, a.dtype, types)
        if a.is_array:
            if dtype.startswith(("float")):
                data = rng.standard_normal(arr_shapes[a.name]).astype(dtype)
                data[data == 0] = 1  # never zeros
            else:
                data = rng.integers(1, 100, size=arr_shapes[a.name]).astype(dtype)
            out[a.name] = data
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
    fn = load_function(spec.inputs, root)
    got = fn(dict(key), dict(types), np.random.default_rng(seed))
    if not isinstance(got, Mapping):
        raise InputError(f"{spec.inputs} returned {type(got).__name__}; expected a dict of argument name -> value")
    expected_names = [a.name for a in spec.args if a.value is None]
    if sorted(got) != sorted(expected_names):
        raise InputError(f"{spec.inputs} returned arguments {sorted(got)}; expected {sorted(expected_names)}")
    arr_shapes = shapes(spec, key)
    for a in spec.args:
        if a.is_array:
            value = got[a.name]
            dtype = resolved_dtype(spec, a.dtype, types)
            if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype) or value.shape != arr_shapes[a.name]:
                raise InputError(
                    f"{spec.inputs}: argument {a.name!r} must be a {dtype} array of shape {arr_shapes[a.name]}, "
                    f"got {getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}"
                )
    return dict(got)


def reference_outputs(spec: KernelSpec, inputs: Mapping[str, Any], root: Path) -> dict[str, Any] | None:
    """Expected outputs from the user's NumPy reference, or None when none is configured."""
    import numpy as np

    if spec.reference is None:
        return None
    outputs = [a for a in spec.args if a.is_array and a.intent in ("out", "inout")]
    fn = load_function(spec.reference, root)
    got = fn(**{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()})
    if isinstance(got, np.ndarray) and len(outputs) == 1:
        got = {outputs[0].name: got}
    if not isinstance(got, Mapping) or sorted(got) != sorted(a.name for a in outputs):
        raise InputError(f"{spec.reference} must return {{{', '.join(a.name for a in outputs)}: array}}")
    return {k: np.asarray(v) for k, v in got.items()}


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][1]
