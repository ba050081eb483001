"""Hardening of the call path (issue #33): what a hostile or careless caller can hand a kernel.
A null pointer for a non-empty array, lists in __cuda_array_interface__, an `exact` key that is
not a bucket, a float scalar beyond its dtype, a garbage stream, a negative computed shape, a
positional constant to select(), an unsupported dtype: each is one TypeError or ValueError that
names what is wrong, before anything is launched. Kernels are built here from their table JSON
(no NVRTC) over a driver that counts whether it was reached, or are example_pkg's, launched
through the driver stand-in (tests/cuda_standin.py)."""

from __future__ import annotations

import math
import os
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hatch_autotune import runtime
from hatch_autotune.declare.expr import parse
from hatch_autotune.runtime import Binaries, CudaApi, Kernel, KernelTable, NoDriverError, stream_handle
from hatch_autotune.runtime.params import PACK_ERRORS, ParamBuffer
from hatch_autotune.runtime.scalars import c_scalar


def fast_bytes(value, dtype):
    """A scalar as the repeated-call path packs it: the struct of a ParamBuffer, which raises one
    of PACK_ERRORS for a value the dtype cannot hold (the call then takes the checked path)."""
    return ParamBuffer([(dtype, 0, None)]).convert.pack(value)


EXAMPLE_ARCHS = ("sm_90",)  # example_kernels: the stand-in is an sm_90 device
EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- kernels from their table JSON, over a driver that says whether it was reached -----------


def tree(text: str):
    return parse(text).tree


def array(name: str, shape: list[str], intent: str = "in") -> dict:
    return {"name": name, "dtype": "float32", "kind": "array", "shape": [tree(s) for s in shape], "intent": intent}


def computed(name: str, value: str) -> dict:
    return {"name": name, "dtype": "int32", "kind": "scalar", "value": tree(value)}


def kernel(name: str, args: list[dict], key: list[dict], select: dict, constants: dict | None = None, **extra) -> Kernel:
    spec = {
        "entry": name,
        "doc": "",
        "args": args,
        "key": key,
        "type_params": extra.get("type_params", {}),
        "constants": [{"name": c, "values": v} for c, v in (constants or {}).items()],
        "launch": {"grid": [tree("cdiv(n, 128)") if "n" in {k["name"] for k in key} else 1], "block": [128], "shared": 0},
        "variants": {"v0": {"config": {}, "binaries": {}}},
        "select": select,
    }
    return Kernel(KernelTable.from_json(name, spec), _Sm90())


class _Sm90(Binaries):
    cubin_archs = ("sm_90",)

    def binary_for(self, cc, driver=None):
        return "sm_90", "sm_90"

    def read(self, table, variant, binary):
        raise AssertionError("no binary is read here")


def entries(*buckets: tuple[int, ...]) -> dict:
    return {"sm_90": [{"bucket": list(b), "variant": "v0", "tuned": False, "provenance": {"reason": "default"}} for b in buckets]}


# col_sum(x[rows, cols], y[cols]): `cols` picks code written for that width, so it is exact
COL_SUM = kernel(
    "col_sum",
    [array("x", ["rows", "cols"]), array("y", ["cols"], "out"), computed("rows", "rows"), computed("cols", "cols")],
    [
        {"name": "rows", "from": "x", "axis": 0, "buckets": [256, 4096], "mapping": "nearest"},
        {"name": "cols", "from": "x", "axis": 1, "buckets": [64, 128], "mapping": "exact"},
    ],
    {"-": entries((256, 64), (256, 128), (4096, 64), (4096, 128))},
)
# halo_sum as tests/consumers/stencil_kit declares it: y is n - 2 RADIUS long
HALO_SUM = kernel(
    "halo_sum",
    [array("x", ["n"]), array("y", ["n - 2 * RADIUS"], "out"), computed("m", "n - 2 * RADIUS")],
    [{"name": "n", "from": "x", "axis": 0, "buckets": [4096, 65536], "mapping": "nearest"}],
    {f"RADIUS={r}": entries((4096,), (65536,)) for r in (2, 4)},
    constants={"RADIUS": [2, 4]},
)


class DriverSpy:
    """A driver that does not start, and counts how often it was asked to."""

    def __init__(self):
        self.inits = 0

    def cuInit(self, flags):
        self.inits += 1
        return (1,)  # not CUDA_SUCCESS: NoDriverError


@pytest.fixture
def spy():
    driver = DriverSpy()
    runtime.use_gpu(CudaApi(driver, None, None, None, None, None, None))
    yield driver
    runtime.use_gpu(None)


class Cai:
    """An object exposing exactly the __cuda_array_interface__ it is given."""

    _next = 0x7F0000000000

    def __init__(self, shape=None, typestr="<f4", ptr=None, *, interface=None):
        Cai._next += 1 << 20
        self.ptr = Cai._next if ptr is None else ptr
        self.__cuda_array_interface__ = (
            interface
            if interface is not None
            else {"shape": shape, "typestr": typestr, "data": (self.ptr, False), "strides": None, "version": 3}
        )


# ---- #10: a null pointer for a non-empty array -------------------------------------------------


def test_a_null_pointer_for_a_non_empty_array_is_refused_before_the_driver(spy):
    with pytest.raises(ValueError, match=r"col_sum\(\): argument 'x' has a null data pointer but shape \(512, 64\)"):
        COL_SUM(Cai((512, 64), ptr=0), Cai((64,)))
    with pytest.raises(ValueError, match=r"col_sum\(\): argument 'x' has a null data pointer"):
        COL_SUM.prepare(Cai((512, 64), ptr=0), Cai((64,)))
    assert spy.inits == 0
    with pytest.raises(NoDriverError):  # an empty array may have a null pointer (CuPy gives one)
        HALO_SUM(Cai((4,)), Cai((0,), ptr=0), RADIUS=2)
    assert spy.inits == 1


def test_a_null_pointer_never_reaches_a_launch_on_the_fast_path(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    x, y = DeviceArray.empty(standin, (4096,)), DeviceArray.empty(standin, (4096,))
    k["saxpy"](1.0, x, y)
    k["saxpy"](1.0, x, y)  # a plan for this signature
    assert len(standin.launches) == 2
    x.__cuda_array_interface__ = {**x.__cuda_array_interface__, "data": (0, False)}
    with pytest.raises(ValueError, match=r"saxpy\(\): argument 'x' has a null data pointer but shape \(4096,\)"):
        k["saxpy"](1.0, x, y)
    for bad in (2**63, -16, 64.0, False):  # not a pointer that cuda.core can pack: the checked path names it
        x.__cuda_array_interface__ = {**x.__cuda_array_interface__, "data": (bad, False)}
        with pytest.raises(TypeError, match=r"saxpy\(\): argument 'x': __cuda_array_interface__\['data'\]"):
            k["saxpy"](1.0, x, y)
    assert len(standin.launches) == 2


def test_a_pointer_beyond_what_cuda_core_packs_is_refused():
    with pytest.raises(TypeError, match=r"col_sum\(\): argument 'x': .*with an int pointer from 0 to 2\*\*63 - 1"):
        COL_SUM.prepare(Cai((512, 64), ptr=2**64), Cai((64,)))


# ---- #11: lists in __cuda_array_interface__ ----------------------------------------------------


def test_list_shape_and_strides_are_sequences_on_every_call(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    x, y = DeviceArray.empty(standin, (3, 5)), DeviceArray.empty(standin, (3, 5))
    x.__cuda_array_interface__ = {**x.__cuda_array_interface__, "shape": [3, 5], "strides": [20, 4]}
    for _ in range(3):  # the first call records no plan for it; the later ones check again
        k["row_softmax"](x, y)
    assert len(standin.launches) == 3 and standin.launches[-1].grid == (3, 1, 1)
    y.__cuda_array_interface__ = {**y.__cuda_array_interface__, "data": [y.ptr, False]}
    k["row_softmax"](x, y)
    assert len(standin.launches) == 4


@pytest.mark.parametrize(
    "field,value",
    [("shape", [512, 64.0]), ("shape", [True, 64]), ("shape", [512, -64]), ("shape", [512, "64"]), ("strides", [256, 4.0])],
)
def test_list_elements_must_be_sizes(field, value):
    x = Cai((512, 64))
    x.__cuda_array_interface__[field] = value
    with pytest.raises(TypeError, match=rf"col_sum\(\): argument 'x': __cuda_array_interface__\['{field}'\] is \["):
        COL_SUM.prepare(x, Cai((64,)))


# ---- #14: an exact key that is not a bucket ----------------------------------------------------


def test_an_exact_key_miss_is_said_before_the_driver_as_select_says_it(spy):
    with pytest.raises(ValueError) as selected:
        COL_SUM.select("sm_90", rows=512, cols=65)
    said = str(selected.value)
    assert said == "cols=65 is not one of the exact buckets [64, 128]"
    with pytest.raises(ValueError) as called:
        COL_SUM(Cai((512, 65)), Cai((65,)))
    assert str(called.value) == f"col_sum(): {said} (from x.shape[1])"
    with pytest.raises(ValueError, match=r"col_sum\(\): cols=65 is not one of the exact buckets"):
        COL_SUM.prepare(Cai((512, 65)), Cai((65,)))
    with pytest.raises(ValueError, match="cols=65 is not one of the exact buckets"):
        COL_SUM.select(rows=512, cols=65)  # without an arch: said before the device is asked
    assert spy.inits == 0
    with pytest.raises(NoDriverError):
        COL_SUM(Cai((512, 64)), Cai((64,)))  # a bucket: on to the driver
    assert spy.inits == 1


# ---- #15: float scalars beyond their dtype -----------------------------------------------------


@pytest.mark.parametrize(
    "value,dtype,shown",
    [
        (1e39, "float32", "[-3.4028235e+38, 3.4028235e+38]"),
        (-1e39, "float32", "[-3.4028235e+38, 3.4028235e+38]"),
        (np.float64(3.5e38), "float32", "[-3.4028235e+38, 3.4028235e+38]"),
        (10**39, "float32", "[-3.4028235e+38, 3.4028235e+38]"),
        (1e6, "float16", "[-65504, 65504]"),
        (65520.0, "float16", "[-65504, 65504]"),  # rounds to inf: refused
        (10**400, "float64", "[-1.7976931e+308, 1.7976931e+308]"),
    ],
)
def test_a_finite_float_beyond_its_dtype_is_refused(value, dtype, shown):
    expected = rf"k\(\): argument 'a'=.* does not fit in {dtype} {re.escape(shown)}: it would become inf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from numpy on the way
        with pytest.raises(ValueError, match=expected):
            c_scalar(value, dtype, "k", "a")
        with pytest.raises(PACK_ERRORS):
            fast_bytes(value, dtype)  # the repeated-call path: refused too, so the checked path names it


def test_inf_nan_and_values_that_round_within_range_pass_as_given():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in ("float16", "float32", "float64"):
            bits = [c_scalar(v, dtype, "k", "a") for v in (math.inf, -math.inf, math.nan)]
            values = [b.view(np.float16) if dtype == "float16" else b for b in bits]
            assert values[0] == np.inf and values[1] == -np.inf and np.isnan(values[2])
            assert [fast_bytes(v, dtype) for v in (math.inf, -math.inf)] == [b.tobytes() for b in bits[:2]]
            fast_nan = np.frombuffer(fast_bytes(math.nan, dtype), "<f2" if dtype == "float16" else np.dtype(dtype))[0]
            assert np.isnan(fast_nan)
        assert c_scalar(65519.0, "float16", "k", "a").view(np.float16) == 65504  # rounds to the largest half
        assert c_scalar(3.4028235e38, "float32", "k", "a") == np.finfo(np.float32).max
        assert c_scalar(1e-50, "float32", "k", "a") == 0  # underflow is rounding, not an error


def test_a_float_overflow_on_the_fast_path_launches_nothing(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    x, y = DeviceArray.empty(standin, (64,)), DeviceArray.empty(standin, (64,))
    k["saxpy"](2.0, x, y)
    k["saxpy"](2.0, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"saxpy\(\): argument 'a'=1e\+39 does not fit in float32"):
            k["saxpy"](1e39, x, y)
        k["saxpy"](-math.inf, x, y)
    assert len(standin.launches) == 3 and standin.launches[-1].param(0, "float32") == -np.inf


# ---- weak messages -------------------------------------------------------------------------


class Stream:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


@pytest.mark.parametrize("value", [(1, 2, 3), "x", (0, "abc"), (0, -5), (0, 1.5), None, (0, True)])
def test_a_garbage_cuda_stream_is_named(value):
    with pytest.raises(
        TypeError, match=r"^stream: __cuda_stream__ of Stream gave .*; expected \(version, handle\) with the handle a non-negative int$"
    ):
        stream_handle(Stream(value))
    assert stream_handle(Stream((0, 0x55))) == 0x55


def test_a_negative_computed_shape_says_so():
    with pytest.raises(ValueError) as info:
        HALO_SUM.prepare(Cai((3,)), Cai((0,), ptr=0), RADIUS=2)
    assert str(info.value) == (
        "halo_sum(): argument 'y' would have shape (n - 2 * RADIUS,) = (-1,) for n=3, RADIUS=2, a negative size: n=3 is too small for this kernel"
    )
    with pytest.raises(ValueError, match=r"argument 'y' has shape \(5,\); expected \(6,\) \(from n=10, RADIUS=2\)"):
        HALO_SUM.prepare(Cai((10,)), Cai((5,)), RADIUS=2)


def test_a_positional_constant_to_select_names_the_kernel():
    with pytest.raises(TypeError) as info:
        HALO_SUM.select("sm_90", 4096, 2)
    assert str(info.value) == (
        "halo_sum.select() takes one positional argument (arch), got 3; "
        "key dims, type parameters and constants are passed by keyword (n=, RADIUS=)"
    )
    assert HALO_SUM.select("sm_90", n=4096, RADIUS=2).bucket == {"n": 4096}


@pytest.mark.parametrize(
    "typestr,shown",
    [
        (">f4", "'>f4' (big-endian), which hatch-autotune cannot pass"),
        ("<c32", "'<c32', which hatch-autotune cannot pass"),  # complex256: no dtype of ours
        ("<f²", "'<f²', which hatch-autotune cannot pass"),  # a Unicode digit: not a size
        ("<f" + "9" * 5000, "'<f9999"),  # more digits than int() reads
    ],
)
def test_an_unsupported_dtype_says_what_was_passed(typestr, shown):
    with pytest.raises(TypeError) as info:
        COL_SUM.prepare(Cai((512, 64), typestr), Cai((64,)))
    message = str(info.value)
    assert message.startswith(f"col_sum(): argument 'x' has dtype {shown}") and message.endswith("; expected float32")
    assert len(message) < 200


# ---- Hypothesis: any array interface either passes or is refused, naming the argument ----------

TYPESTRS = ["<f4", "|f4", "=f4", ">f4", "<f2", "<f8", "<i4", "f4", "", "<f²", 5, None, b"<f4"]
SIZES = [64, 0, 65, 1, -1, 2**63, True]
JUNK = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.floats(allow_nan=False), st.just(object()))


def _sequence(items):
    """Tuples and lists of up to three of `items`."""
    return st.lists(items, max_size=3).flatmap(lambda xs: st.sampled_from([tuple(xs), xs]))


@st.composite
def interfaces(draw, valid_ptr: int):
    """A __cuda_array_interface__ for saxpy's x (64 float32s): a valid one with up to three of
    its fields broken (or missing), or no interface at all."""
    ptr = st.one_of(
        st.sampled_from([0, valid_ptr + 4, valid_ptr + 16, valid_ptr + 64, -16, 2**63, 2**64, 2**63 - 16]),
        st.integers(),
        st.floats(),
        st.booleans(),
        JUNK,
    )
    readonly = st.one_of(st.booleans(), st.sampled_from([0, 1, None, "x"]))
    size = st.one_of(st.sampled_from(SIZES), st.floats(), st.text(max_size=2))
    broken = {
        "shape": st.one_of(st.just([64]), st.just((64.0,)), _sequence(size), JUNK),
        "typestr": st.sampled_from(TYPESTRS),
        "data": st.one_of(
            st.tuples(ptr, readonly),
            st.lists(ptr, min_size=2, max_size=2),
            st.tuples(st.just(valid_ptr), readonly),
            st.sampled_from([(valid_ptr,), (valid_ptr, False, 1), valid_ptr, None, [valid_ptr, False]]),
        ),
        "strides": st.one_of(st.just((4,)), st.just([4]), _sequence(st.sampled_from([4, 8, -4, 0, 4.0])), JUNK),
        "version": st.one_of(st.integers(0, 4), JUNK),
    }
    cai = {"shape": (64,), "typestr": "<f4", "data": (valid_ptr, False), "strides": None, "version": 3}
    for field in draw(st.sets(st.sampled_from(list(broken)), max_size=3)):
        if draw(st.integers(0, 4)) == 0:
            del cai[field]
        else:
            cai[field] = draw(broken[field])
    return draw(st.one_of(st.just(cai), JUNK, st.lists(st.integers(), max_size=2))) if draw(st.integers(0, 9)) == 0 else cai


@PROPERTY
@given(data=st.data())
def test_any_array_interface_passes_or_is_refused_naming_an_argument(gpu, data):
    from cuda_standin import DeviceArray

    standin, k = gpu
    if not hasattr(standin, "saxpy_arrays"):  # once per test: examples share the stand-in
        standin.saxpy_arrays = DeviceArray.empty(standin, (64,)), DeviceArray.empty(standin, (64,))
    x, y = standin.saxpy_arrays
    k["saxpy"](1.0, x, y)  # a plan for the valid signature: broken ones may meet the fast path
    cai = data.draw(interfaces(x.ptr))
    obj = Cai(interface={})
    obj.__cuda_array_interface__ = cai
    for _ in range(2):  # the second call meets whatever plan the first recorded
        before = len(standin.launches)
        try:
            k["saxpy"](1.0, obj, y)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            assert message.startswith("saxpy(): argument '"), message
            assert "\n" not in message and len(message) < 400
            assert len(standin.launches) == before
            event(f"refused ({type(exc).__name__})")
            continue
        event("launched")
        launched = standin.launches[before:]
        assert len(launched) == 1
        pointer = int(launched[0].param(1, "int64"))
        assert pointer == cai["data"][0] and 0 < pointer < 2**63  # never a null or unpackable pointer


@PROPERTY
@given(
    value=st.one_of(st.floats(), st.integers(min_value=-(2**1100), max_value=2**1100), st.sampled_from([np.float64(1e300), np.float16(1)]))
)
def test_any_float_scalar_converts_exactly_or_is_refused_naming_it(value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in ("float16", "float32", "float64"):
            try:
                bits = c_scalar(value, dtype, "k", "a")
            except ValueError as exc:
                assert str(exc).startswith("k(): argument 'a'=") and f"does not fit in {dtype}" in str(exc)
                assert isinstance(value, int) or math.isfinite(value)
                with pytest.raises(PACK_ERRORS):
                    fast_bytes(value, dtype)
                continue
            converted = float(bits.view(np.float16) if dtype == "float16" else bits)
            assert math.isfinite(converted) == (isinstance(value, int) or math.isfinite(value))
            if not math.isnan(converted):  # a NaN's payload bits may differ; it is a NaN either way
                assert fast_bytes(value, dtype) == bits.tobytes()


@PROPERTY
@given(
    value=st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([np.int64(-1), np.uint64(2**64 - 1), np.int8(-128)]))
)
def test_any_integer_scalar_packs_as_the_checked_path_converts_it_or_both_refuse_it(value):
    """The repeated-call path packs a caller's integer with struct; the checked path converts it
    with c_scalar: the same bytes, and the same values refused (the call then says which)."""
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        try:
            exact = c_scalar(value, dtype, "k", "a")
        except ValueError as exc:
            assert f"does not fit in {dtype}" in str(exc)
            with pytest.raises(PACK_ERRORS):
                fast_bytes(value, dtype)
            continue
        assert fast_bytes(value, dtype) == exact.tobytes()


def test_a_cuda_api_takes_all_of_cuda_cores_names_or_none():
    """A stand-in's CudaApi either brings every cuda.core name (the tuning worker's) or none
    (then the real ones come at their first use): half of them would mix two worlds silently."""
    with pytest.raises(TypeError, match=r"^CudaApi: give all of cuda.core's names or none \(given \['Device'\]\)$"):
        CudaApi(object(), Device=object())
    with pytest.raises(TypeError, match=r"^CudaApi: unknown name\(s\) \['Devise'\]"):
        CudaApi(object(), Devise=object())
    api = CudaApi("driver")
    with pytest.raises(TypeError, match=r"^CudaApi.replace: unknown name\(s\) \['lanch'\]$"):
        api.replace(Device=1, Stream=2, LaunchConfig=3, ObjectCode=4, EventOptions=5, launch=6, lanch=7)
    assert api.replace(driver="other").driver == "other" and api.replace(driver="other")._core is None  # still lazy
    with pytest.raises(AttributeError):
        api.not_a_name  # noqa: B018
