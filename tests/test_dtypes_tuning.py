"""Tuning with every dtype (bfloat16, FP8, complex, bool and the rest): the NumPy dtype of each
name, random inputs, a user's inputs and reference hooks, default tolerances and poison.

Verification of these dtypes on the host and on the device (compare.cu) is proven alike in
tests/test_device_verify.py over tests/compare_cases.py; here is what happens around it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from hatch_autotune.errors import BuildError
from hatch_autotune.runtime.values import COMPLEX_DTYPES, DTYPE_SIZES, FLOAT_DTYPES, ML_DTYPES
from hatch_autotune.tuning import inputs as inputs_mod
from hatch_autotune.tuning.device_verify import supports
from hatch_autotune.tuning.dtypes import dtype_name, kind, numpy_dtype, part_dtype
from hatch_autotune.tuning.inputs import ArgRecipe, InputError, InputRecipe
from hatch_autotune.tuning.verify import INT_POISON, TOLERANCES, compare, compare_host, poison_byte, tolerance

ALL = tuple(DTYPE_SIZES)
NARROW = ("bfloat16", "float8_e4m3fn", "float8_e5m2")  # rounded floats with a mantissa


# ---- names -> NumPy dtypes -------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_every_dtype_name_is_a_numpy_dtype_of_its_size_and_name(name):
    dtype = numpy_dtype(name)
    assert dtype.itemsize == DTYPE_SIZES[name]
    assert dtype.name == name == dtype_name(dtype) == dtype_name(name)
    if name in ML_DTYPES:
        assert dtype == np.dtype(getattr(ml_dtypes, name))


def test_kinds_follow_the_runtimes_lists_not_numpys_kind_letters():
    assert {n for n in ALL if kind(n) == "float"} == set(FLOAT_DTYPES)
    assert {n for n in ALL if kind(n) == "complex"} == set(COMPLEX_DTYPES)
    assert kind("bool") == "bool" and kind("uint8") == kind("int64") == "int"
    assert numpy_dtype("bfloat16").kind == "V" and numpy_dtype("float8_e5m2").kind == "f"  # why NumPy's cannot say
    assert (part_dtype("complex64"), part_dtype("complex128")) == ("float32", "float64")


@pytest.mark.parametrize("bad", ["float128", "bf16", "", "complex32"])
def test_an_unknown_dtype_name_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=f"unknown dtype {bad!r}; expected one of float16, float32"):
        numpy_dtype(bad)
    with pytest.raises(ValueError, match="unknown dtype"):
        kind(bad)


# ---- tolerances and poison -------------------------------------------------------------------


def test_every_dtype_has_a_default_tolerance():
    assert set(TOLERANCES) == set(ALL)
    assert tolerance("bfloat16") == (2.0**-6, 2.0**-8)
    assert tolerance("float8_e4m3fn") == (2.0**-3, 2.0**-4)
    assert tolerance("float8_e5m2") == (2.0**-2, 2.0**-3)
    assert tolerance("float8_e8m0fnu") == tolerance("bool") == tolerance("int8") == (0.0, 0.0)
    assert tolerance("complex64") == tolerance("float32") and tolerance("complex128") == tolerance("float64")
    assert tolerance("bfloat16", (0.5, 0.25)) == (0.5, 0.25)
    with pytest.raises(ValueError, match="no tolerance for dtype 'float128'"):
        tolerance("float128")


def _finite_values(name: str) -> np.ndarray:
    """Every finite value of a one- or two-byte float dtype, in increasing order."""
    dtype = numpy_dtype(name)
    every = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint32).astype(f"u{dtype.itemsize}").view(dtype)
    with np.errstate(invalid="ignore"):
        values = np.unique(every.astype(np.float64))
    return values[np.isfinite(values)].astype(dtype)


@pytest.mark.parametrize(("name", "ulps"), [("bfloat16", 2), ("float8_e4m3fn", 1), ("float8_e5m2", 1)])
def test_the_default_tolerance_passes_the_rounding_steps_it_is_made_for(name, ulps):
    """rtol = ulps * 2^-m: any two values `ulps` steps apart match, anywhere in the range."""
    values = _finite_values(name)
    assert compare_host("y", values[ulps:], values[:-ulps], *tolerance(name)).differ == 0
    assert compare_host("y", values[:-ulps], values[ulps:], *tolerance(name)).differ == 0
    # and a step more does not, at the bottom of a binade (1.0: the widest relative step)
    one = int(np.flatnonzero(values.astype(np.float64) == 1.0)[0])
    assert compare_host("y", values[one + ulps + 1 : one + ulps + 2], values[one : one + 1], *tolerance(name)).differ == 1


@pytest.mark.parametrize("name", [*NARROW, "float8_e8m0fnu", "complex64", "complex128"])
def test_the_default_tolerance_catches_a_wrong_index(name):
    x = InputRecipe("k", {}, {}, 3, (ArgRecipe("x", name, (4096,), "in", 0),), ".").make()["x"]
    shifted = np.roll(x, 1)  # what reading the neighbour's element gives
    found = compare_host("y", shifted, x, *tolerance(name))
    assert found.differ > len(x) // 4, found


@pytest.mark.parametrize("name", ALL)
def test_poisoned_outputs_are_nan_for_every_float_and_complex_and_no_bool(name):
    dtype = numpy_dtype(name)
    poisoned = np.full(8 * dtype.itemsize, poison_byte(dtype), np.uint8).view(dtype)
    assert poison_byte(name) == poison_byte(dtype)
    if kind(name) in ("float", "complex"):
        with np.errstate(invalid="ignore"):
            assert np.isnan(poisoned.astype(np.complex128 if kind(name) == "complex" else np.float64)).all()
        reason = compare("y", poisoned, np.ones(8, dtype), *tolerance(name))
        assert reason == "y: 8 element(s) are NaN or unwritten, first at (0,)"
    else:
        assert poison_byte(dtype) == INT_POISON
        reason = compare("y", poisoned, np.ones(8, dtype), 0.0, 0.0)
        assert reason is not None and reason.startswith("y: 8 element(s) differ (first at (0,)")


# ---- random inputs ---------------------------------------------------------------------------


def _recipe(*args: ArgRecipe, seed: int = 0, **hooks) -> InputRecipe:
    return InputRecipe("k", {}, {"n": 1000}, seed, args, hooks.pop("root", "."), **hooks)


@pytest.mark.parametrize("name", ALL)
def test_random_arrays_of_every_dtype(name):
    x = _recipe(ArgRecipe("x", name, (1000,), "in", 0)).make()["x"]
    assert x.dtype == numpy_dtype(name) and x.shape == (1000,)
    assert np.array_equal(x.view(np.uint8), _recipe(ArgRecipe("x", name, (1000,), "in", 0)).make()["x"].view(np.uint8))
    what = kind(name)
    if what == "bool":
        assert 0 < x.sum() < 1000 and set(x.view(np.uint8)) == {0, 1}
    elif what == "complex":
        assert (x.real != 0).all() and (x.imag != 0).all()
        assert 0.7 < np.std(x.real) < 1.3 and 0.7 < np.std(x.imag) < 1.3
    elif name == "float8_e8m0fnu":  # positive powers of two, 2^-4 ... 2^4
        exponents = np.log2(x.astype(np.float64))
        assert set(exponents) == set(range(-4, 5))
    elif what == "float":
        wide = x.astype(np.float64)
        assert np.isfinite(wide).all() and (wide != 0).all() and 0.7 < np.std(wide) < 1.3
        if name in NARROW:  # drawn as float32 and rounded: the values are N(0, 1)'s, rounded
            assert (wide < 0).any() and len(np.unique(wide)) > 10
    else:
        assert x.min() >= 1 and x.max() < 100


def test_a_bool_array_is_never_all_false():
    for seed in range(64):  # one element: half of the seeds draw false
        assert _recipe(ArgRecipe("x", "bool", (1,), "in", 0), seed=seed).make()["x"].all()


@pytest.mark.parametrize("name", ["bfloat16", "float8_e8m0fnu", "complex64", "bool"])
def test_big_arrays_of_the_new_dtypes_are_the_same_whatever_the_blocks_threads(monkeypatch, name):
    one = inputs_mod._random_array((5000,), name, (7, 1))
    monkeypatch.setattr(inputs_mod, "RANDOM_BLOCK", 1000)
    blocks = inputs_mod._random_array((5000,), name, (7, 1))
    assert blocks.dtype == one.dtype and blocks[:1000].tobytes() == inputs_mod._random_array((1000,), name, (7, 1)).tobytes()
    assert not np.array_equal(blocks.view(np.uint8), inputs_mod._random_array((5000,), name, (7, 2)).view(np.uint8))


@pytest.mark.parametrize("name", ALL)
def test_outputs_are_zeros_of_their_dtype_and_the_bytes_are_counted(name):
    recipe = _recipe(ArgRecipe("y", name, (10, 3), "out", 0), ArgRecipe("x", name, (7,), "in", 1))
    y = recipe.make()["y"]
    assert y.dtype == numpy_dtype(name) and not y.view(np.uint8).any()
    assert recipe.nbytes() == 37 * DTYPE_SIZES[name]


@pytest.mark.parametrize("name", [n for n in ALL if n not in ("int64", "uint64")])
def test_random_scalars_are_values_of_their_dtype(name):
    values = [_recipe(ArgRecipe("a", name, None, "in", 0), seed=s).make()["a"] for s in range(20)]
    what = kind(name)
    if what == "bool":
        assert {type(v) for v in values} == {bool} and set(values) == {True, False}
        return
    if what == "complex":
        assert all(isinstance(v, complex) and v.real and v.imag for v in values)
        part = numpy_dtype(part_dtype(name)).type
        assert all(float(part(v.real)) == v.real and float(part(v.imag)) == v.imag for v in values)
        return
    assert all(v != 0 for v in values)
    if what == "float":  # exactly representable: the reference computes with what the kernel gets
        assert all(isinstance(v, float) and float(numpy_dtype(name).type(v)) == v for v in values)
    if name == "float8_e8m0fnu":
        assert all(math.log2(v).is_integer() and -4 <= math.log2(v) <= 4 for v in values)


# ---- a user's inputs hook ----------------------------------------------------------------------

HOOKS = """\
import ml_dtypes
import numpy as np


def make(key, types, rng):
    n = key["n"]
    x = rng.standard_normal(n).astype(np.float32)
    return {
        "x": x.astype(ml_dtypes.bfloat16),
        "s": ml_dtypes.float8_e4m3fn(1.5),
        "z": (x + 1j * x).astype(np.complex64),
        "flag": np.True_,
        "c": 2,
        "y": np.zeros(n, ml_dtypes.float8_e5m2),
    }


def wrong_dtype(key, types, rng):
    return {**make(key, types, rng), "x": np.zeros(key["n"], np.float16)}


def bool_as_int(key, types, rng):
    return {**make(key, types, rng), "flag": 1}


def bool_as_number(key, types, rng):
    return {**make(key, types, rng), "s": True}


def text_as_complex(key, types, rng):
    return {**make(key, types, rng), "c": "2j"}


def reference(x, s, z, flag, c, y):
    return {"y": x.astype(np.float32) * np.float32(s)}


def reference_bf16(x, s, z, flag, c, y):
    return {"y": x * ml_dtypes.bfloat16(2)}


def reference_complex(x, s, z, flag, c, y):
    return {"y": x.astype(np.complex128)}


def reference_z(x, s, z, flag, c, y):
    return {"y": x.astype(np.float32), "z": z.astype(np.complex128)}


def reference_z_real(x, s, z, flag, c, y):
    return {"y": x.astype(np.float32), "z": z.real.copy()}
"""

HOOK_ARGS = (
    ArgRecipe("x", "bfloat16", (1000,), "in", 0),
    ArgRecipe("s", "float8_e4m3fn", None, "in", 1),
    ArgRecipe("z", "complex64", (1000,), "in", 2),
    ArgRecipe("flag", "bool", None, "in", 3),
    ArgRecipe("c", "complex128", None, "in", 4),
    ArgRecipe("y", "float8_e5m2", (1000,), "out", 5),
)


@pytest.fixture
def hooks_root(tmp_path, monkeypatch):
    (tmp_path / "dtype_hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return str(tmp_path)


def test_a_users_inputs_of_the_new_dtypes_are_taken(hooks_root):
    made = _recipe(*HOOK_ARGS, root=hooks_root, generator="dtype_hooks:make").make()
    assert made["x"].dtype == numpy_dtype("bfloat16") and made["z"].dtype == np.complex64
    assert made["flag"] is np.True_ and made["c"] == 2 and made["y"].dtype == numpy_dtype("float8_e5m2")


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("wrong_dtype", "argument 'x' must be a bfloat16 array of shape (1000,), got a float16 array of shape (1000,)"),
        ("bool_as_int", "argument 'flag' must be a bool (bool), got 1"),
        ("bool_as_number", "argument 's' must be a number (float8_e4m3fn), got True"),
        ("text_as_complex", "argument 'c' must be a number (complex128), got '2j'"),
    ],
)
def test_a_users_inputs_of_the_wrong_dtype_are_a_clear_error(hooks_root, hook, message):
    with pytest.raises(InputError) as info:
        _recipe(*HOOK_ARGS, root=hooks_root, generator=f"dtype_hooks:{hook}").make()
    assert str(info.value).startswith(f"kernel 'k': inputs = 'dtype_hooks:{hook}' (n=1000): "), str(info.value)
    assert message in str(info.value)
    assert isinstance(info.value, BuildError)


def test_a_reference_may_be_wider_than_its_output(hooks_root):
    recipe = _recipe(*HOOK_ARGS, root=hooks_root, generator="dtype_hooks:make", reference="dtype_hooks:reference")
    made = recipe.make()
    ref = recipe.reference_outputs(made)["y"]
    assert ref.dtype == np.float32 and ref.shape == (1000,)
    assert supports("float8_e5m2", "float32")  # compared on the device
    got = ref.astype(numpy_dtype("float8_e5m2"))  # a kernel that rounds once
    assert compare("y", got, ref, *tolerance("float8_e5m2")) is None
    assert compare("y", np.roll(got, 1), ref, *tolerance("float8_e5m2")) is not None
    same = recipe.__class__(**{**recipe.__dict__, "reference": "dtype_hooks:reference_bf16"}).reference_outputs(made)
    assert same["y"].dtype == numpy_dtype("bfloat16")  # any real dtype of ours


def test_a_complex_reference_verifies_only_a_complex_output(hooks_root):
    base = _recipe(*HOOK_ARGS, root=hooks_root, generator="dtype_hooks:make", reference="dtype_hooks:reference_complex")
    made = base.make()
    with pytest.raises(InputError, match=r"output 'y' must be a real numeric array of shape \(1000,\), got complex128 array"):
        base.reference_outputs(made)
    z_out = (*HOOK_ARGS[:2], ArgRecipe("z", "complex64", (1000,), "inout", 2), *HOOK_ARGS[3:])
    ok = _recipe(*z_out, root=hooks_root, generator="dtype_hooks:make", reference="dtype_hooks:reference_z")
    assert ok.reference_outputs(made)["z"].dtype == np.complex128 and supports("complex64", "complex128")
    real = _recipe(*z_out, root=hooks_root, generator="dtype_hooks:make", reference="dtype_hooks:reference_z_real")
    assert real.reference_outputs(made)["z"].dtype == np.float32  # a real reference: zero imaginary parts
    assert not supports("complex64", "float32")  # compared on the host
    assert compare("z", made["z"], made["z"].real.copy(), *tolerance("complex64")) is not None


@pytest.mark.parametrize(("got", "expected"), [("bfloat16", "float16"), ("float8_e4m3fn", "bfloat16"), ("float32", "bfloat16")])
def test_pairs_without_a_compare_kernel_are_compared_on_the_host(got, expected):
    """The worker verifies such a pair on the host (worker_state: pair not in the loaded ones)."""
    assert not supports(got, expected)
    e = np.linspace(-2, 2, 33, dtype=np.float32)
    g = e.astype(numpy_dtype(got))
    assert compare("y", g, e.astype(numpy_dtype(expected)), *tolerance(got)) is None
    g[4] = numpy_dtype(got).type(7.0)
    assert compare("y", g, e.astype(numpy_dtype(expected)), *tolerance(got)).startswith(
        "y: 1 element(s) differ (first at (4,): got np.float64("
    )
