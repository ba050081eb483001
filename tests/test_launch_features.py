"""Launch features at the driver boundary (issue #52): dynamic shared memory past 48 KiB (the
function's opt-in set once, the device's opt-in limit checked first), thread-block clusters
(cuLaunchKernelEx with a prebuilt CUlaunchConfig), tensor-map arguments (cuTensorMapEncodeTiled,
a 128-byte 64-byte-aligned parameter, cached per pointer) and the tuning worker launching through
the same runtime code as the wheel.

Kernels are compiled here with NVRTC (small sources, sm_80 and sm_90 cubins) and declared from
their table JSON; they run over the driver stand-in (tests/cuda_standin.py), which reads each
parameter through kernelParams as the cubin declares it and refuses what the driver refuses: a
launch past 48 KiB without the attribute, a cluster that does not divide the grid, a tensor map
against the driver's documented rules, a 128-byte parameter that is not an encoded map."""

from __future__ import annotations

import ctypes
import functools
import itertools

import cuda_standin
import numpy as np
import pytest
from cuda.bindings import nvrtc
from cuda_standin import DeviceArray, decode_tensor_map, install

from hatch_autotune import runtime
from hatch_autotune.declare.expr import parse
from hatch_autotune.runtime import Binaries, Kernel, KernelTable
from hatch_autotune.runtime.declaration import TensorMapDecl
from hatch_autotune.runtime.launching import ExConfig
from hatch_autotune.runtime.params import TENSOR_MAP, ParamBuffer
from hatch_autotune.runtime.tensor_map import tensor_map_args

R = cuda_standin.R

SOURCE = r"""
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;

extern "C" __global__ void big_smem(float* x, int n) {
    extern __shared__ float dyn[];
    __shared__ float fixed[256];  // 1024 bytes of static shared memory
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    fixed[threadIdx.x % 256] = (float)i;
    dyn[threadIdx.x] = fixed[(threadIdx.x + 1) % 256];
    __syncthreads();
    if (i < n) x[i] = dyn[threadIdx.x];
}

extern "C" __global__ void clustered(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 1.0f;
}

extern "C" __global__ void tma_rows(const float* a, const __grid_constant__ CUtensorMap a_map, float* out, int m, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) out[i] = a[(long long)i * k] + (float)a_map.opaque[threadIdx.x % 16];
}
"""


@functools.cache
def cubin(arch: str, source: str = SOURCE) -> bytes:
    """`source` compiled by NVRTC for `arch` ('sm_90')."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"launch_features.cu", 0, [], [])
    options = [f"-arch={arch}".encode(), b"-std=c++17"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    if int(err):
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise AssertionError(log.decode())
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    data = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, data)
    return data


class Cubins(Binaries):
    """SOURCE's cubins, one per device arch (sm_80, sm_90)."""

    cubin_archs = ("sm_80", "sm_90")

    def binary_for(self, cc, driver=None):
        arch = f"sm_{cc[0]}{cc[1]}"
        return arch, arch

    def read(self, table, variant, binary):
        return cubin(binary)


def tree(text):
    return parse(text).tree if isinstance(text, str) else text


def array(name, shape, intent="in", **extra):
    return {"name": name, "dtype": "float32", "kind": "array", "shape": [tree(s) for s in shape], "intent": intent, **extra}


def computed(name, value):
    return {"name": name, "dtype": "int32", "kind": "scalar", "value": tree(value)}


def tensor_map(name, source, box, swizzle="none", oob_fill="zero", when=None, order=None):
    decl = {"array": source, "box": [tree(b) for b in box], "swizzle": swizzle, "l2_promotion": "none", "oob_fill": oob_fill}
    if when is not None:
        decl["when"] = tree(when)
    if order is not None:
        decl["order"] = order
    return {"name": name, "dtype": "", "kind": "tensor-map", "tensor_map": decl}


def key(name, source, axis, bucket):
    return {"name": name, "from": source, "axis": axis, "buckets": [bucket], "mapping": "nearest"}


def kernel(entry, args, keys, config, shared="0", cluster=None) -> Kernel:
    """One kernel of one variant (`config`), its entry selected at every bucket on sm_80 and sm_90."""
    launch = {"grid": [tree("cdiv(n, 128)" if keys[0]["name"] == "n" else "cdiv(m, 128)")], "block": [128], "shared": tree(shared)}
    if cluster is not None:
        launch["cluster"] = [tree(c) for c in cluster]
    bucket = [k["buckets"][0] for k in keys]
    entry_row = [{"bucket": bucket, "variant": "v0", "tuned": False, "provenance": {"reason": "default"}}]
    spec = {
        "entry": entry, "doc": "", "args": args, "key": keys, "type_params": {}, "constants": [], "launch": launch,
        "variants": {"v0": {"config": config, "binaries": {}}}, "select": {"-": {"sm_80": entry_row, "sm_90": entry_row}},
    }  # fmt: skip
    return Kernel(KernelTable.from_json(entry, spec), Cubins())


def big_smem(shared="n * 4"):
    return kernel("big_smem", [array("x", ["n"], "out"), computed("n", "n")], [key("n", "x", 0, 1024)], {}, shared=shared)


def clustered(cx):
    args = [array("x", ["n"], "out"), computed("n", "n")]
    return kernel("clustered", args, [key("n", "x", 0, 1024)], {"CX": cx}, cluster=["CX", "1", "1"])


def tma_rows(bm=64, bk=32, swizzle="none", strides=None, oob_fill="zero"):
    layout = {"strides": strides} if strides else {}
    args = [
        array("a", ["m", "k"], **layout),
        tensor_map("a_map", "a", ["BM", "BK"], swizzle, oob_fill),
        array("out", ["m"], "out"),
        computed("m", "m"),
        computed("k", "k"),
    ]
    return kernel("tma_rows", args, [key("m", "a", 0, 1024), key("k", "a", 1, 64)], {"BM": bm, "BK": bk})


@pytest.fixture
def standin(monkeypatch):
    found = install(monkeypatch, runtime, ccs=[(9, 0)])
    yield found
    runtime.use_gpu(None)


@pytest.fixture
def sm80(monkeypatch):
    found = install(monkeypatch, runtime, ccs=[(8, 0)])
    yield found
    runtime.use_gpu(None)


class Cai:
    """An array exposing exactly the interface it is given (a pointer inside an allocation, strides)."""

    def __init__(self, ptr, shape, strides=None, typestr="<f4"):
        self.ptr = ptr
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "strides": strides, "version": 3}


# ---- dynamic shared memory above 48 KiB ------------------------------------------------------


def test_shared_memory_past_48k_sets_the_functions_attribute_once_and_again_only_for_more(standin):
    k = big_smem()
    for n in (30_000, 30_000, 25_000, 40_000, 30_000):  # 120000, 120000, 100000, 160000, 120000 bytes
        k(DeviceArray.empty(standin, (n,)))
    assert [launch.shmem for launch in standin.launches] == [120_000, 120_000, 100_000, 160_000, 120_000]
    assert standin.shared_set == [("big_smem", 120_000), ("big_smem", 160_000)]  # once per function, then only larger
    assert standin.calls["cuFuncGetAttribute"] == 1  # the static shared memory, asked once
    assert standin.refused == []


def test_a_small_launch_asks_nothing_of_the_function(standin):
    k = big_smem("1024")
    k(DeviceArray.empty(standin, (1000,)))
    assert standin.launches[-1].shmem == 1024 and "cuFuncSetAttribute" not in standin.calls


def test_shared_memory_beyond_48k_less_the_static_needs_the_opt_in_too(standin):
    """48 KiB holds static and dynamic together: 48 KiB dynamic beside 1 KiB static opts in."""
    k = big_smem("49152")
    k(DeviceArray.empty(standin, (1000,)))
    assert standin.shared_set == [("big_smem", 49_152)] and standin.refused == []


def test_shared_memory_past_the_devices_opt_in_limit_is_an_error_naming_kernel_bytes_and_limit(sm80):
    k = big_smem()
    with pytest.raises(
        ValueError, match=r"big_smem .*asks 200000 bytes of dynamic shared memory \(besides 1024 bytes of static\).*sm_80.* 166912"
    ):
        k(DeviceArray.empty(sm80, (50_000,)))
    assert sm80.launches == [] and "cuFuncSetAttribute" not in sm80.calls
    k(DeviceArray.empty(sm80, (41_000,)))  # 164000 + 1024 static: within sm_80's 166912
    assert sm80.launches[-1].shmem == 164_000


def test_the_stand_in_refuses_shared_memory_past_48k_without_the_attribute(standin):
    big_smem("1024")(DeviceArray.empty(standin, (128,)))
    (function,) = standin.functions_loaded
    driver = standin.api().driver
    x = DeviceArray.empty(standin, (128,))
    values = [x.ptr.to_bytes(8, "little"), np.int32(128).tobytes()]
    slots = [ctypes.create_string_buffer(v, len(v)) for v in values]
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(s) for s in slots])
    cuda_standin.FakeDevice(0).set_current()
    launch = lambda shmem: driver.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, shmem, 1, ctypes.addressof(pointers), 0)  # noqa: E731
    assert launch(64 * 1024) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert "cuFuncSetAttribute not called" in standin.refused[-1]
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert driver.cuFuncSetAttribute(function, attr, 232_448 - 1024 + 1) == (R.CUDA_ERROR_INVALID_VALUE,)  # past opt-in less static
    assert driver.cuFuncSetAttribute(function, attr, 64 * 1024) == (R.CUDA_SUCCESS,)
    assert launch(64 * 1024) == (R.CUDA_SUCCESS,)
    assert launch(64 * 1024 + 4) == (R.CUDA_ERROR_INVALID_VALUE,)  # more than the attribute allows
    static = driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)
    assert static == (R.CUDA_SUCCESS, 1024)  # from the cubin's .nv.shared section
    optin = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0)
    assert optin == (R.CUDA_SUCCESS, 232_448)


# ---- thread-block clusters ---------------------------------------------------------------------


def test_a_cluster_launches_with_cuLaunchKernelEx_on_both_paths(standin):
    k = clustered(2)
    arrays = [DeviceArray.empty(standin, (4096,)) for _ in range(3)]
    for x in arrays:
        k(x)
    assert [launch.cluster for launch in standin.launches] == [(2, 1, 1)] * 3
    assert [launch.grid for launch in standin.launches] == [(32, 1, 1)] * 3
    assert [int(launch.param(0, "uint64")) for launch in standin.launches] == [x.ptr for x in arrays]
    assert standin.calls["cuLaunchKernelEx"] == 3 and k.checked_calls == 1  # the fast path launches clusters too
    assert standin.refused == []


def test_a_one_block_cluster_is_a_plain_launch(standin):
    clustered(1)(DeviceArray.empty(standin, (4096,)))
    assert standin.launches[-1].cluster is None and "cuLaunchKernelEx" not in standin.calls


@pytest.mark.parametrize(
    ("cx", "n", "message"),
    [
        (2, 3 * 128, r"grid \(3, 1, 1\) is not a multiple of cluster \(2, 1, 1\) in x"),
        (16, 4096, r"cluster \(16, 1, 1\) has 16 blocks; a portable cluster has at most 8"),
        (0, 4096, r"cluster \(0, 1, 1\) is invalid"),
    ],
)
def test_a_cluster_that_cannot_launch_is_an_error_before_the_driver(standin, cx, n, message):
    with pytest.raises(ValueError, match=r"clustered \(variant v0, n=\d+\): " + message):
        clustered(cx)(DeviceArray.empty(standin, (n,)))
    assert standin.launches == [] and "cuLaunchKernelEx" not in standin.calls


def test_a_cluster_on_a_device_before_sm_90_is_an_error_before_the_driver(sm80):
    with pytest.raises(ValueError, match=r"needs sm_90 or newer; the device is sm_80"):
        clustered(2)(DeviceArray.empty(sm80, (4096,)))
    assert sm80.launches == []


def test_the_stand_in_checks_a_cluster_launchs_config(standin):
    clustered(1)(DeviceArray.empty(standin, (128,)))
    (function,) = standin.functions_loaded
    driver = standin.api().driver
    x = DeviceArray.empty(standin, (4096,))
    values = [x.ptr.to_bytes(8, "little"), np.int32(4096).tobytes()]
    slots = [ctypes.create_string_buffer(v, len(v)) for v in values]
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(s) for s in slots])
    cuda_standin.FakeDevice(0).set_current()

    def launch(grid, cluster):
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        config.attrs, config.numAttrs = [attr], 1
        return driver.cuLaunchKernelEx(config, function, ctypes.addressof(pointers), 0)

    assert launch(32, (4, 1, 1)) == (R.CUDA_SUCCESS,) and standin.launches[-1].cluster == (4, 1, 1)
    assert launch(30, (4, 1, 1)) == (R.CUDA_ERROR_INVALID_CLUSTER_SIZE,)
    assert launch(32, (16, 1, 1)) == (R.CUDA_ERROR_INVALID_CLUSTER_SIZE,)
    assert launch(32, (8, 1, 1)) == (R.CUDA_SUCCESS,)  # 8 blocks: the portable limit
    assert launch(32, (2, 2, 1)) == (R.CUDA_ERROR_INVALID_CLUSTER_SIZE,)  # y: a grid of 1 is no multiple of 2


COMPILED_CLUSTER = r"""
extern "C" __global__ void __cluster_dims__(2, 1, 1) paired(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f;
}
"""


def test_the_stand_in_holds_a_kernel_to_the_cluster_it_was_compiled_with(standin):
    """EIATTR_CTA_PER_CLUSTER: a grid of whole clusters even through cuLaunchKernel, and no other
    cluster through cuLaunchKernelEx."""
    data = cubin("sm_90", COMPILED_CLUSTER)
    assert cuda_standin.cubin_cluster(data, "paired") == (2, 1, 1) and cuda_standin.cubin_cluster(cubin("sm_90"), "clustered") is None
    driver = standin.api().driver
    cuda_standin.FakeDevice(0).set_current()
    module = driver.cuModuleLoadData(data)[1]
    function = driver.cuModuleGetFunction(module, b"paired")[1]
    x = DeviceArray.empty(standin, (4096,))
    slots = [ctypes.create_string_buffer(v, len(v)) for v in (x.ptr.to_bytes(8, "little"), np.int32(4096).tobytes())]
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(s) for s in slots])
    assert driver.cuLaunchKernel(function, 32, 1, 1, 128, 1, 1, 0, 1, ctypes.addressof(pointers), 0) == (R.CUDA_SUCCESS,)
    assert standin.launches[-1].cluster == (2, 1, 1)
    assert driver.cuLaunchKernel(function, 31, 1, 1, 128, 1, 1, 0, 1, ctypes.addressof(pointers), 0) == (R.CUDA_ERROR_INVALID_CLUSTER_SIZE,)
    head = (function, 32, 1, 1, 128, 1, 1, 0)
    config = ExConfig(driver, head, (4, 1, 1)).config
    assert driver.cuLaunchKernelEx(config, function, ctypes.addressof(pointers), 0) == (R.CUDA_ERROR_INVALID_CLUSTER_SIZE,)
    assert standin.refused[-1].endswith("cluster (4, 1, 1); compiled with (2, 1, 1)")


# ---- tensor maps (TMA) ---------------------------------------------------------------------------


def test_a_tensor_map_is_encoded_from_its_array_and_passed_by_value(standin):
    k = tma_rows(bm=64, bk=32, swizzle="128B")
    a, out = DeviceArray.empty(standin, (1024, 64)), DeviceArray.empty(standin, (1024,))
    k(a, out)
    launch = standin.launches[-1]
    assert [len(p) for p in launch.params] == [8, 128, 8, 4, 4]
    assert int(launch.param(0, "uint64")) == a.ptr and int(launch.param(2, "uint64")) == out.ptr
    found = decode_tensor_map(launch.params[1])
    assert found == {
        "dtype": 7, "rank": 2, "address": a.ptr, "swizzle": 3, "l2_promotion": 0, "oob_fill": 0,
        "dims": [64, 1024], "strides": [64 * 4], "box": [32, 64], "element_strides": [1, 1],
    }  # fmt: skip  # FLOAT32, innermost first, byte strides of the outer dims, box reversed
    assert standin.refused == []


def test_a_fast_path_call_with_a_new_pointer_encodes_again_and_a_known_one_does_not(standin):
    k = tma_rows()
    first, second = DeviceArray.empty(standin, (1024, 64)), DeviceArray.empty(standin, (1024, 64))
    out = DeviceArray.empty(standin, (1024,))
    for a in (first, second, first, second):
        k(a, out)
    assert [decode_tensor_map(launch.params[1])["address"] for launch in standin.launches] == [first.ptr, second.ptr] * 2
    assert k.checked_calls == 1  # the fast path encodes per pointer
    assert standin.encoded == 2  # and keeps what it encoded: each pointer once


def test_a_parameter_buffer_places_a_tensor_map_on_64_bytes():
    layout = [("pointer", 0, None), (TENSOR_MAP, None, None), ("int32", None, 7), (TENSOR_MAP, None, None), ("float32", 1, None)]
    buffer = ParamBuffer(layout)
    addresses = list((ctypes.c_void_p * 5).from_address(buffer.address))
    assert addresses[1] % 64 == 0 and addresses[3] % 64 == 0
    assert [addresses[c] - addresses[0] for c in (1, 3)] == list(buffer.map_offsets)
    spans = sorted(zip(addresses, [8, 128, 4, 128, 4]))
    assert all(a + size <= b for (a, size), (b, _) in itertools.pairwise(spans))
    buffer.convert.pack_into(buffer.storage, 0, 0x7F00_0000_0100, 2.5)
    buffer.storage[buffer.map_offsets[0] : buffer.map_offsets[0] + 128] = bytes(range(128))
    assert ctypes.string_at(addresses[1], 128) == bytes(range(128)) and ctypes.string_at(addresses[2], 4) == np.int32(7).tobytes()
    assert ctypes.string_at(addresses[4], 4) == np.float32(2.5).tobytes()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bk": 2}, r"the box's innermost dim is 2 x 4 bytes \(float32\) = 8 bytes; TMA needs a multiple of 16 bytes"),
        ({"bk": 300}, r"the box \(64, 300\) \(outermost first\) has a dim outside 1..256"),
        ({"bk": 16, "swizzle": "32B"}, r"the box's innermost dim is 64 bytes; swizzle 32B allows at most 32"),
    ],
)
def test_a_bad_box_is_an_error_naming_the_tensor_map(standin, options, message):
    k = tma_rows(**options)
    with pytest.raises(ValueError, match=r"tma_rows\(\): tensor map 'a_map': " + message):
        k(DeviceArray.empty(standin, (1024, 64)), DeviceArray.empty(standin, (1024,)))
    assert standin.launches == [] and standin.encoded == 0


def test_a_misaligned_array_is_an_error_naming_the_tensor_map(standin):
    k = tma_rows()
    base = DeviceArray.empty(standin, (1025, 64))
    out = DeviceArray.empty(standin, (1024,))
    with pytest.raises(ValueError, match=r"tensor map 'a_map': the array's address must be 16-byte aligned .*offset by 4 bytes"):
        k(Cai(base.ptr + 4, (1024, 64)), out)  # the checked path
    assert standin.launches == []
    k(Cai(base.ptr, (1024, 64)), out)
    with pytest.raises(ValueError, match=r"tensor map 'a_map': the array's address must be 16-byte aligned .*offset by 4 bytes"):
        k(Cai(base.ptr + 4, (1024, 64)), out)  # on the fast path too
    assert len(standin.launches) == 1 and k.checked_calls == 1  # a plan holds the layout; each pointer is checked as encoded


def test_a_strided_source_array_is_encoded_with_its_strides_and_checked(standin):
    k = tma_rows(strides="inner")
    buffer = DeviceArray.empty(standin, (1024, 80))
    out = DeviceArray.empty(standin, (1024,))
    k(Cai(buffer.ptr, (1024, 64), strides=(80 * 4, 4)), out)  # a padded matrix: 320-byte rows
    assert decode_tensor_map(standin.launches[-1].params[1])["strides"] == [320]
    with pytest.raises(ValueError, match=r"tensor map 'a_map': array 'a' has stride 65 elements \(260 bytes\) on dim 0"):
        k(Cai(buffer.ptr, (1024, 64), strides=(65 * 4, 4)), out)


def test_the_driver_rules_are_checked_in_the_driver_order():
    decl = TensorMapDecl("a", (), "none", "none", "nan", None, "declared")
    args = tensor_map_args(
        "k(): tensor map 'm'",
        TensorMapDecl("a", (), "64B", "128B", "zero", None, "declared"),
        "bfloat16",
        (7, 5, 32),
        (320, 64, 1),
        (1, 4, 32),
    )
    assert args == ("BFLOAT16", 3, (32, 5, 7), (128, 640), (32, 4, 1), "64B", "L2_128B", "NONE")
    with pytest.raises(ValueError, match="oob-fill 'nan' needs a floating-point array"):
        tensor_map_args("k", decl, "int32", (8, 8), (8, 1), (8, 8))
    with pytest.raises(ValueError, match="dtype int16, which TMA cannot copy"):
        tensor_map_args("k", decl, "int16", (8, 8), (8, 1), (8, 8))
    with pytest.raises(ValueError, match="has 6 dimensions; a tensor map has 1 to 5"):
        tensor_map_args("k", decl, "float32", (1,) * 6, (1,) * 6, (4,) * 6)
    with pytest.raises(ValueError, match="innermost stride 2 elements"):
        tensor_map_args("k", decl, "float32", (8, 8), (16, 2), (8, 4))


def test_the_stand_in_checks_an_encode_as_the_driver_documents(standin):
    driver = standin.api().driver
    cuda_standin.FakeDevice(0).set_current()
    a = DeviceArray.empty(standin, (64, 64))
    T = driver.CUtensorMapDataType

    u64, u32 = driver.cuuint64_t, driver.cuuint32_t

    def encode(dtype=T.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, address=a.ptr, strides=(256,), box=(32, 8), oob=0):
        return driver.cuTensorMapEncodeTiled(
            dtype, 2, address, [u64(64), u64(64)], [u64(s) for s in strides], [u32(b) for b in box], [u32(1), u32(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            driver.CUtensorMapFloatOOBfill(oob),
        )  # fmt: skip

    err, tensor_map = encode()
    assert err == R.CUDA_SUCCESS
    assert decode_tensor_map(ctypes.string_at(tensor_map.getPtr(), 128))["box"] == [32, 8]
    assert encode(address=a.ptr + 8)[0] == R.CUDA_ERROR_INVALID_VALUE and "not 16-byte aligned" in standin.refused[-1]
    assert encode(strides=(100,))[0] == R.CUDA_ERROR_INVALID_VALUE
    assert encode(box=(64, 8))[0] == R.CUDA_ERROR_INVALID_VALUE and "swizzle span 128" in standin.refused[-1]
    assert encode(box=(3, 8))[0] == R.CUDA_ERROR_INVALID_VALUE
    assert encode(dtype=T.CU_TENSOR_MAP_DATA_TYPE_INT32, oob=1)[0] == R.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(TypeError, match=r"Cannot convert int to cuda\.bindings\.driver\.cuuint64_t"):  # as the bindings refuse
        driver.cuTensorMapEncodeTiled(T.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, a.ptr, [64], [], [u32(32)], [u32(1)], 0, 0, 0, 0)


def test_the_stand_in_refuses_128_bytes_that_are_no_encoded_map_but_zeros(standin):
    k = tma_rows()
    a, out = DeviceArray.empty(standin, (1024, 64)), DeviceArray.empty(standin, (1024,))
    k(a, out)
    (function,) = standin.functions_loaded
    assert cuda_standin.cubin_param_offsets(cubin("sm_90"), "tma_rows")[1] % 64 == 0  # the compiler placed it on 64
    driver = standin.api().driver
    buffer = ParamBuffer([("pointer", 0, None), (TENSOR_MAP, None, None), ("pointer", 1, None), ("int32", 2, None), ("int32", 3, None)])
    buffer.convert.pack_into(buffer.storage, 0, a.ptr, out.ptr, 1024, 64)
    cuda_standin.FakeDevice(0).set_current()
    assert driver.cuLaunchKernel(function, 8, 1, 1, 128, 1, 1, 0, 1, buffer.address, 0) == (R.CUDA_SUCCESS,)  # zeros: a map not read
    offset = buffer.map_offsets[0]
    buffer.storage[offset : offset + 128] = bytes(range(128))
    assert driver.cuLaunchKernel(function, 8, 1, 1, 128, 1, 1, 0, 1, buffer.address, 0) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert standin.refused[-1].endswith("parameter 1 is 128 bytes but no tensor map this stand-in encoded")


# ---- maps some variants read (`when`), maps in memory order, the fallback ------------------------


def tma_rows_two(strides="any", order="memory", plain_row=True):
    """tma_rows with two variants: TMA = 1 (reads a_map, the choice at m = 1024) and TMA = 0 (reads
    no map: `when = "TMA == 1"`, the choice at m = 16), a in any strides, its map in memory order."""
    args = [
        array("a", ["m", "k"], strides=strides),
        tensor_map("a_map", "a", ["BM", "BK"], when="TMA == 1", order=order),
        array("out", ["m"], "out"),
        computed("m", "m"),
        computed("k", "k"),
    ]
    keys = [{"name": "m", "from": "a", "axis": 0, "buckets": [16, 1024], "mapping": "nearest"}, key("k", "a", 1, 64)]
    rows = [
        {"bucket": [16, 64], "variant": "plain" if plain_row else "tma", "tuned": True, "provenance": {}},
        {"bucket": [1024, 64], "variant": "tma", "tuned": True, "provenance": {}},
    ]
    spec = {
        "entry": "tma_rows", "doc": "", "args": args, "key": keys, "type_params": {}, "constants": [],
        "launch": {"grid": [tree("cdiv(m, 128)")], "block": [128], "shared": 0},
        "variants": {"plain": {"config": {"TMA": 0, "BM": 64, "BK": 32}, "binaries": {}}, "tma": {"config": {"TMA": 1, "BM": 64, "BK": 32}, "binaries": {}}},
        "select": {"-": {"sm_80": rows, "sm_90": rows}},
    }  # fmt: skip
    return Kernel(KernelTable.from_json("tma_rows", spec), Cubins())


def test_a_map_the_variant_does_not_read_is_zeros_and_never_encoded(standin):
    k = tma_rows_two()
    a, out = DeviceArray.empty(standin, (16, 64)), DeviceArray.empty(standin, (16,))
    k(a, out)  # m = 16: the `plain` variant
    assert standin.launches[-1].params[1] == bytes(128) and standin.encoded == 0
    assert k.select(m=16, k=64, arch=(9, 0)).config["TMA"] == 0
    big, out2 = DeviceArray.empty(standin, (1024, 64)), DeviceArray.empty(standin, (1024,))
    k(big, out2)  # m = 1024: the `tma` variant, its map encoded
    assert decode_tensor_map(standin.launches[-1].params[1])["address"] == big.ptr and standin.encoded == 1


def test_a_map_in_memory_order_puts_the_unit_stride_axis_innermost(standin):
    k = tma_rows_two()
    store = DeviceArray.empty(standin, (64, 1024))  # a column-major [1024, 64]: a view of its transpose
    out = DeviceArray.empty(standin, (1024,))
    k(Cai(store.ptr, (1024, 64), strides=(4, 1024 * 4)), out)
    found = decode_tensor_map(standin.launches[-1].params[1])
    assert (found["dims"], found["strides"], found["box"]) == ([1024, 64], [1024 * 4], [64, 32])  # m innermost, then k
    k(DeviceArray.empty(standin, (1024, 64)), out)  # row-major: the declared order
    found = decode_tensor_map(standin.launches[-1].params[1])
    assert (found["dims"], found["strides"], found["box"]) == ([64, 1024], [64 * 4], [32, 64])


def test_the_driver_args_of_a_memory_order_map():
    decl = TensorMapDecl("a", (), "none", "none", "zero", None, "memory")
    args = tensor_map_args("k(): tensor map 'm'", decl, "bfloat16", (4096, 1024), (1, 4096), (128, 64))  # B = W.T, [k, n]
    assert args[2:5] == ((4096, 1024), (4096 * 2,), (128, 64))  # k innermost: K-major boxes
    with pytest.raises(ValueError, match=r"strides \(2, 8192\) \(elements\); a tensor map in memory order needs an axis of stride 1"):
        tensor_map_args("k(): tensor map 'm'", decl, "bfloat16", (4096, 1024), (2, 8192), (128, 64))


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda s, base: Cai(base.ptr, (1024, 64), strides=(8, 2048 * 4)), "no unit-stride axis (every other row)"),
        (lambda s, base: Cai(base.ptr, (1024, 60), strides=(61 * 4, 4)), "rows 244 bytes apart: not a multiple of 16"),
        (lambda s, base: Cai(base.ptr + 4, (1024, 64)), "an address 4 bytes past 16-byte alignment"),
    ],
    ids=["no-unit-axis", "pitch", "misaligned"],
)
def test_a_call_tma_cannot_serve_runs_the_rows_variant_that_reads_no_map(standin, make, why):
    k = tma_rows_two()
    base = DeviceArray.empty(standin, (2048, 64))
    out = DeviceArray.empty(standin, (1024,))
    for _ in range(2):  # the checked path, then again: no fast plan of the fallback for this signature
        k(make(standin, base), out)
        assert standin.launches[-1].params[1] == bytes(128), why  # the `plain` variant: no map
    assert standin.encoded == 0
    calls = k.checked_calls
    k(Cai(base.ptr, (1024, 64)), out)  # an aligned, row-major call of the bucket: its own variant, TMA
    assert decode_tensor_map(standin.launches[-1].params[1]) is not None
    k(Cai(base.ptr, (1024, 64)), out)
    assert k.checked_calls == calls + 1, "the aligned call's plan is a fast one"
    if why.startswith("an address"):
        k(make(standin, base), out)  # misaligned again, with the aligned plan recorded: the checked path, the fallback
        assert standin.launches[-1].params[1] == bytes(128) and k.checked_calls == calls + 2


def test_without_a_variant_that_reads_no_map_the_call_is_an_error_naming_why(standin):
    k = tma_rows_two(plain_row=False)  # both buckets chose the variant that reads the map
    base = DeviceArray.empty(standin, (2048, 64))
    with pytest.raises(
        ValueError, match=r"variant tma reads a tensor map the call cannot give \(.*not 16-byte aligned\), and the wheel ships no variant"
    ):
        k(Cai(base.ptr + 4, (1024, 64)), DeviceArray.empty(standin, (1024,)))
    assert standin.launches == []


def test_the_tuner_launches_the_variant_it_names_and_never_falls_back(standin):
    """runtime.launching.variant_launch (what the tuning worker times): `tma` with a layout TMA
    cannot read is that variant's error, not a launch of another variant."""
    from hatch_autotune.runtime.launching import variant_launch

    k = tma_rows_two()
    base, out = DeviceArray.empty(standin, (2048, 64)), DeviceArray.empty(standin, (1024,))
    call = k.checks.prepare([Cai(base.ptr, (1024, 64), strides=(8, 2048 * 4)), out], runtime.cuda_seam.current.default_stream, {})
    with pytest.raises(ValueError, match=r"tensor map 'a_map'.*a tensor map in memory order needs an axis of stride 1"):
        variant_launch(k, "tma", call, 0)(0)
    variant_launch(k, "plain", call, 0)(0)
    assert len(standin.launches) == 1 and standin.launches[-1].params[1] == bytes(128)


# ---- the tuning worker launches as the wheel does ------------------------------------------------


def worker(standin, tmp_path, k: Kernel, host: dict):
    """A WorkerState after hello, holding a bucket of `k` (its one variant v0) with `host`'s arrays."""
    from hatch_autotune.tuning.protocol import Hello
    from hatch_autotune.tuning.worker_memory import DeviceArray as WorkerArray
    from hatch_autotune.tuning.worker_state import WorkerState, _Bucket, _Cubins

    state = WorkerState()
    reply = state.hello(Hello(0, flush_l2=False))
    path = tmp_path / "v0.cubin"
    path.write_bytes(cubin("sm_90"))
    cubins = _Cubins({"v0": str(path)}, "sm_90")
    table = KernelTable(k.declaration, k.variants, {})
    arrays = {name: WorkerArray(state.cuda.driver, value, keep_pristine=False) for name, value in host.items()}
    state.bucket = _Bucket(Kernel(table, cubins), arrays, {}, [], set(), None, {}, cubins, {}, {}, None, None, frozenset())
    return state, reply


def test_the_worker_launches_a_large_shared_memory_config_through_the_runtime(standin, tmp_path):
    state, reply = worker(standin, tmp_path, big_smem(), {"x": np.zeros(30_000, np.float32)})
    assert reply.device.limits.max_shared_memory_per_block_optin == 232_448  # the device attribute, for the per-arch prune
    assert reply.device.limits.max_shared_memory_per_block == 49_152
    launch = state._launcher("v0")
    launch(state.timer.stream)
    launch(state.timer.stream)
    assert [record.shmem for record in standin.launches] == [120_000, 120_000]
    assert standin.shared_set == [("big_smem", 120_000)]  # set once, as the wheel's runtime sets it
    assert standin.calls["cuLaunchKernel"] == 2 and standin.refused == []
    assert all(record.stream is state.timer.stream for record in standin.launches)


def test_the_worker_launches_a_cluster_and_a_tensor_map_as_the_wheel_does(standin, tmp_path):
    state, _ = worker(standin, tmp_path, clustered(4), {"x": np.zeros(4096, np.float32)})
    launch = state._launcher("v0")
    other = cuda_standin.FakeDevice(0).create_stream()
    launch(state.timer.stream)
    launch(other)  # only hStream changes on the prebuilt CUlaunchConfig
    assert [(r.cluster, r.stream) for r in standin.launches] == [((4, 1, 1), state.timer.stream), ((4, 1, 1), other)]
    assert standin.calls["cuLaunchKernelEx"] == 2
    host = {"a": np.zeros((1024, 64), np.float32), "out": np.zeros(1024, np.float32)}
    state, _ = worker(standin, tmp_path, tma_rows(), host)
    state._launcher("v0")(state.timer.stream)
    found = decode_tensor_map(standin.launches[-1].params[1])
    assert found["address"] == state.bucket.arrays["a"].ptr and found["box"] == [32, 64]


def test_the_limits_carry_the_opt_in_shared_memory_and_read_an_older_worker():
    from hatch_autotune.tuning.protocol import Limits

    limits = Limits(1024, 65536, 49152, 232_448)
    assert Limits.from_json(limits.to_json()) == limits
    older = {"max_threads_per_block": 1024, "max_registers_per_block": 65536, "max_shared_memory_per_block": 49152}
    assert Limits.from_json(older).max_shared_memory_per_block_optin == 49152  # no opt-in said: none assumed
    assert Limits(1024, 65536, 49152).max_shared_memory_per_block_optin == 49152
    assert "max_shared_memory_per_block_optin" not in Limits(1024, 65536, 49152).to_json()  # the wire format of before
