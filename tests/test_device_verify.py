"""Verification on the device (hatch_autotune/tuning/compare.cu, device_verify.py) judges every
case of tests/compare_cases.py as the host does (verify.compare_host):

a. compare_host against the counts worked out while the cases were built, and against a plain
   NumPy restatement of the rule (whole arrays, no chunks, the same work type: a float64 oracle
   would be another rule for float32 outputs);
b. THE RULE: compare.cu compiled as host C++ (g++ -O2 -ffp-contract=off) gives compare_host's counts,
   first indices and worst error on every case. This is the proof, without a GPU, that the CUDA
   source implements the rule; the same source built with a fused multiply-add shows that the
   cases would catch one;
c. NVRTC compiles the kernel for every pair for sm_80 and sm_90, with the parameters that
   DeviceComparer passes and no fused multiply-add in the comparison;
d. PLUMBING: DeviceComparer over the driver stand-in, with the real cubins and an emulated kernel
   (tests/standin_compare.py, which applies compare_host), returns compare_host's Mismatch. This
   checks the packing, the record's set-up and reading, and the downloads, not the rule;
e. on a GPU: DeviceComparer returns compare_host's Mismatch on every case, and on one large
   enough for the grid's cap.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import shutil
import subprocess

import cuda_standin
import numpy as np
import pytest
import standin_compare
from compare_cases import BF16, CASES, E4M3, E5M2, E8M0, FUSED_TOL, Case

import hatch_autotune.runtime as runtime
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import compile_all
from hatch_autotune.declare.args import DTYPES
from hatch_autotune.plan.devices import detect_gpu_arch
from hatch_autotune.runtime import check_cuda, cuda_api
from hatch_autotune.tuning.device_verify import (
    BLOCK,
    MAX_BLOCKS,
    PAIRS,
    RESULT_BYTES,
    DeviceComparer,
    compare_binaries,
    compile_job,
    decode_record,
    entry_name,
    grid_blocks,
    host_entry_name,
    source,
)
from hatch_autotune.tuning.dtypes import kind
from hatch_autotune.tuning.verify import Mismatch, compare, compare_host

IDS = [c.name for c in CASES]


def counts(m: Mismatch) -> tuple[int, int, int, int]:
    return m.unwritten, m.first_unwritten, m.differ, m.first_differ


def same(a: Mismatch, b: Mismatch) -> bool:
    """Field by field, a NaN equal to a NaN (got_at may be one: NaN against an infinity)."""
    for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b)):
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y or type(x) is not type(y):
            return False
    return True


def test_the_cases_cover_every_pair_and_the_grid():
    assert {c.pair for c in CASES} >= set(PAIRS)
    assert any(c.got.size > 2 * BLOCK * 4 and (c.expect or (0, 0, 0, 0))[3] > BLOCK * 4 for c in CASES)  # a first in a later block
    assert any(c.got.size == 0 for c in CASES) and any(c.got.size == 1 for c in CASES)


# ---- a. the host rule ---------------------------------------------------------------------------


NARROW = {BF16, E4M3, E5M2, E8M0}  # ml_dtypes' floats: each value is exactly a float32


def oracle(case: Case) -> tuple[tuple[int, int, int, int], float]:
    """The rule over whole arrays: ((unwritten, first, differ, first), worst error)."""
    g, e = case.got.ravel(), case.expected.ravel()
    first = lambda mask: int(np.flatnonzero(mask)[0]) if mask.any() else -1  # noqa: E731
    if g.dtype == e.dtype == np.bool_:
        g, e = g.view(np.uint8), e.view(np.uint8)  # bytes: the poison 0x5A is no bool
    exact = np.zeros(g.shape, bool)
    if g.dtype == e.dtype:
        words = min(g.itemsize, 8)
        per = g.itemsize // words
        exact = (g.view(f"u{words}").reshape(g.size, per) == e.view(f"u{words}").reshape(e.size, per)).all(axis=1)
    if np.iscomplexobj(g):  # float64 magnitudes, each step rounded
        with np.errstate(invalid="ignore", over="ignore"):
            gw, ew = g.astype(np.complex128), e.astype(np.complex128)
            gr, gi, er, ei = gw.real, gw.imag, ew.real, ew.imag
            nan_e = np.isnan(er) | np.isnan(ei)
            unwritten = (np.isnan(gr) | np.isnan(gi)) & ~nan_e & ~exact
            err = np.sqrt(np.square(gr - er) + np.square(gi - ei))
            tolerance = np.float64(case.atol) + np.float64(case.rtol) * np.sqrt(np.square(er) + np.square(ei))
            infinite = (np.isinf(er) | np.isinf(ei)) & ~nan_e
            differ = ((err > tolerance) | (infinite & (gw != ew))) & ~exact
        errors = np.where(np.isnan(err), np.inf, err)[differ]
    elif g.dtype.kind == "f" or g.dtype in NARROW:
        w = np.result_type(*(np.float32 if d in NARROW else d for d in (g.dtype, e.dtype)), np.float32).type
        with np.errstate(invalid="ignore", over="ignore"):
            gw, ew, rtol, atol = g.astype(w), e.astype(w), w(case.rtol), w(case.atol)
            unwritten = np.isnan(gw) & ~np.isnan(ew) & ~exact
            err = np.abs(gw - ew)
            tolerance = atol + rtol * np.abs(ew)
            differ = ((err > tolerance) | (np.isinf(ew) & (gw != ew))) & ~exact
        errors = np.where(np.isnan(err), np.inf, err)[differ]
    else:
        unwritten = np.zeros(g.shape, bool)
        differ = g != e
        errors = np.abs(g[differ].astype(np.float64) - e[differ].astype(np.float64))
    found = (int(unwritten.sum()), first(unwritten), int(differ.sum()), first(differ))
    return found, float(errors.max()) if errors.size else 0.0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_host_rule_counts_what_the_rule_says(case):
    m = compare_host(case.name, case.got, case.expected, case.rtol, case.atol)
    if case.expect is not None:
        assert counts(m) == case.expect
    assert (counts(m), m.worst_error) == oracle(case)
    assert m.message() == compare(case.name, case.got, case.expected, case.rtol, case.atol)
    assert (m.message() is None) == (m.unwritten == m.differ == 0)


def test_the_messages_are_the_ones_verification_always_gave():
    ints = compare_host("k", np.array([[1, 5]], np.int32), np.array([[1, 2]], np.int32), 0.0, 0.0)
    assert (
        ints.message()
        == "k: 1 element(s) differ (first at (0, 1): got np.int32(5), expected np.int32(2); rtol=0.0, atol=0.0; worst |error| 3)"
    )
    floats = compare_host("y", np.array([0.0, np.nan], np.float32), np.array([0.0, 1.0]), 1e-4, 1e-5)
    assert floats.message() == "y: 1 element(s) are NaN or unwritten, first at (1,)"
    assert (floats.got_dtype, floats.expected_dtype, floats.shape) == ("float32", "float64", (2,))


def test_every_dtype_has_its_compare_kernels():
    """Each output dtype against itself, bfloat16 and FP8 against float32 and float64 references
    (a user's reference computed wider), complex64 against complex128."""
    assert {(d, d) for d in DTYPES} <= set(PAIRS)
    narrow = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
    assert {(d, w) for d in narrow for w in ("float32", "float64")} <= set(PAIRS)
    assert ("complex64", "complex128") in PAIRS
    assert len(set(PAIRS)) == len(PAIRS)
    assert not {p for p in PAIRS if kind(p[0]) != kind(p[1]) or (p[0] != p[1] and kind(p[0]) not in ("float", "complex"))}


def test_the_messages_of_the_new_dtypes():
    """bfloat16 and FP8 values show as float64 scalars, complex as complex128, a bool's byte as
    a bool or, for the poison, as its byte."""
    bf16 = compare_host("y", np.array([1.0, 3.0], np.float32).astype(BF16), np.array([1.0, 2.0], np.float32), 2.0**-6, 2.0**-8)
    assert bf16.message() == (
        "y: 1 element(s) differ (first at (1,): got np.float64(3.0), expected np.float64(2.0); "
        "rtol=0.015625, atol=0.00390625; worst |error| 1)"
    )
    assert (bf16.got_dtype, bf16.expected_dtype) == ("bfloat16", "float32")
    z = compare_host("z", np.array([1 + 2j], np.complex64), np.array([1 + 1j]), 1e-4, 1e-5)
    assert "got np.complex128(1+2j), expected np.complex128(1+1j)" in z.message()
    poisoned = np.array([True, True])
    poisoned[1:].view(np.uint8)[...] = 0x5A
    b = compare_host("b", poisoned, np.array([True, False]), 0.0, 0.0)
    assert "first at (1,): got 0x5a (not a bool), expected np.False_" in b.message()
    assert "got np.False_, expected np.True_" in compare("b", np.array([False]), np.array([True]), 0.0, 0.0)


def test_a_complex_reference_for_a_real_output_is_refused():
    with pytest.raises(ValueError, match="y: a complex128 reference cannot verify a float32 output"):
        compare_host("y", np.zeros(3, np.float32), np.zeros(3, np.complex128), 0.0, 0.0)
    real_reference = compare_host("z", np.array([1 + 0j, 2 + 1j], np.complex64), np.array([1.0, 2.0]), 1e-4, 1e-5)
    assert (real_reference.differ, real_reference.first_differ, real_reference.worst_error) == (1, 1, 1.0)


def test_the_fused_case_tells_two_roundings_from_one():
    """A fused multiply-add rounds atol + rtol * |e| once: it would accept every output of this
    case that the rule rejects (the product of two float32 is exact in float64)."""
    case = next(c for c in CASES if "fused" in c.name and c.pair == ("float32", "float32"))
    rtol, atol = np.float32(FUSED_TOL[0]), np.float32(FUSED_TOL[1])
    fused = (np.float64(rtol) * np.abs(case.expected.astype(np.float64)) + np.float64(atol)).astype(np.float32)
    assert not (np.abs(case.got - case.expected) > fused).any()
    assert compare_host("y", case.got, case.expected, *FUSED_TOL).differ == 256


# ---- b. the CUDA source's rule, compiled as host C++ ------------------------------------------------

CXX = shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs g++ to compile compare.cu as host C++")


def build_host_library(directory, *flags: str) -> ctypes.CDLL:
    src = directory / "compare_host.cu"
    src.write_text(source(PAIRS))
    lib = directory / "compare_host.so"
    subprocess.run([CXX, *flags, "-Wall", "-Werror", "-shared", "-fPIC", "-x", "c++", str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def run_host(library: ctypes.CDLL, case: Case):
    fn = getattr(library, host_entry_name(*case.pair))
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
    fn.restype = None
    got, expected = np.require(case.got, requirements="C"), np.require(case.expected, requirements="C")
    record = (ctypes.c_ubyte * RESULT_BYTES)()
    fn(got.ctypes.data, expected.ctypes.data, got.size, case.rtol, case.atol, ctypes.addressof(record))
    return decode_record(bytes(record))


@pytest.fixture(scope="module")
def host_library(tmp_path_factory):
    if CXX is None:
        pytest.skip("needs g++ to compile compare.cu as host C++")
    return build_host_library(tmp_path_factory.mktemp("compare_host"), "-O2", "-ffp-contract=off")


@needs_cxx
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_cuda_source_as_host_cxx_applies_the_rule(host_library, case):
    found = run_host(host_library, case)
    m = compare_host(case.name, case.got, case.expected, case.rtol, case.atol)
    assert (found.unwritten, found.first_unwritten, found.differ, found.first_differ) == counts(m)
    assert found.worst_error == m.worst_error


@needs_cxx
def test_a_fused_multiply_add_in_the_source_would_be_caught(tmp_path):
    """The cases are not blind to contraction: the same source with FMA allowed disagrees."""
    with open("/proc/cpuinfo") as f:
        if not re.search(r"^flags\s*:.*\bfma\b", f.read(), re.M):
            pytest.skip("this CPU has no FMA instruction")
    fused = build_host_library(tmp_path, "-O2", "-mfma", "-ffp-contract=fast")  # -O2: g++ forms FMAs from there
    cases = [c for c in CASES if "fused" in c.name]
    assert {c.pair for c in cases} == {("float32", "float32"), ("complex128", "complex128")}
    for case in cases:
        assert run_host(fused, case).differ == 0, case.name  # the rule says 256


# ---- c. NVRTC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_the_kernel_for_every_pair(tmp_path, arch):
    cubins = compare_binaries(arch, PAIRS, CompileCache(tmp_path))
    assert set(cubins) == set(PAIRS)
    for pair, cubin in cubins.items():
        assert len(cubin) > 0, pair  # an empty cubin is what NVRTC returns for a virtual arch, without an error
        assert cuda_standin.cubin_sm(cubin) == int(arch[3:])
        # got, expected, n (uint64), rtol, atol (double), record: what DeviceComparer packs
        assert cuda_standin.cubin_params(cubin, entry_name(*pair)) == [8] * 6, pair
    assert compare_binaries(arch, PAIRS[:1], CompileCache(tmp_path)) == {PAIRS[0]: cubins[PAIRS[0]]}  # from the cache


def test_the_comparison_has_no_fused_multiply_add():
    """--fmad=false: the PTX multiplies and adds with explicit rounding (mul.rn, add.rn), which
    ptxas does not contract, so the SASS has no FMA either."""
    floats = [p for p in PAIRS if kind(p[0]) in ("float", "complex")]
    for pair, result in zip(floats, compile_all([compile_job("compute_90", *p) for p in floats], None)):
        assert result.ok, result.log
        ptx = result.binary.decode()
        assert "fma" not in ptx and re.search(r"mul\.rn\.f(32|64)", ptx) and re.search(r"add\.rn\.f(32|64)", ptx), pair


# ---- d. the stand-in: DeviceComparer's plumbing ---------------------------------------------------


@pytest.fixture(scope="module")
def sm90_cubins(tmp_path_factory):
    return compare_binaries("sm_90", PAIRS, CompileCache(tmp_path_factory.mktemp("compare_cache")))


@pytest.fixture
def standin(monkeypatch):
    runtime.use_gpu(None)
    standin = cuda_standin.install(monkeypatch, runtime, ccs=[(9, 0)])
    for entry in standin_compare.ENTRIES:
        monkeypatch.setitem(cuda_standin.EMULATORS, entry, standin_compare.compare_emulator)
    yield standin
    runtime.use_gpu(None)


def upload(cuda, host: np.ndarray):
    """A device copy of `host` (at least one byte, as the worker allocates)."""
    host = np.require(host, requirements="C")
    ptr = check_cuda(cuda.driver.cuMemAlloc(max(host.nbytes, 1)), "cuMemAlloc")
    if host.nbytes:
        check_cuda(cuda.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
    return ptr


def compare_on_device(cuda, comparer: DeviceComparer, stream, case: Case) -> Mismatch:
    got, expected = upload(cuda, case.got), upload(cuda, case.expected)
    try:
        return comparer.compare(
            case.name, int(got), int(expected), case.got.shape, case.got.dtype, case.expected.dtype, case.rtol, case.atol, stream
        )
    finally:
        check_cuda(cuda.driver.cuMemFree(got), "cuMemFree")
        check_cuda(cuda.driver.cuMemFree(expected), "cuMemFree")


def test_the_comparer_over_the_stand_in_returns_the_hosts_mismatch(standin, sm90_cubins):
    cuda = cuda_api()
    device = cuda.Device(0)
    device.set_current()
    stream = device.create_stream()
    comparer = DeviceComparer(cuda, sm90_cubins)
    for case in CASES:
        launches, downloads = len(standin.launches), standin.calls.get("cuMemcpyDtoH", 0)
        found = compare_on_device(cuda, comparer, stream, case)
        expected = compare_host(case.name, case.got, case.expected, case.rtol, case.atol)
        assert same(found, expected), (case.name, found, expected)
        assert found.message() == expected.message()
        new = standin.launches[launches:]
        if case.got.size == 0:
            assert not new
            continue
        (launch,) = new
        assert launch.entry == entry_name(*case.pair) and launch.stream is stream
        assert launch.block == (BLOCK, 1, 1) and launch.grid == (grid_blocks(case.got.size), 1, 1)
        # the record, and the two elements at the first difference only when there is one
        assert standin.calls["cuMemcpyDtoH"] - downloads == (3 if expected.differ else 1)
    comparer.free()
    assert grid_blocks(1) == 1 and grid_blocks(BLOCK * 4 + 1) == 2 and grid_blocks(1 << 40) == MAX_BLOCKS


def test_the_comparer_refuses_a_pair_without_a_kernel(standin, sm90_cubins):
    cuda = cuda_api()
    cuda.Device(0).set_current()
    comparer = DeviceComparer(cuda, {("float32", "float32"): sm90_cubins[("float32", "float32")]})
    stream = cuda.Device(0).create_stream()
    with pytest.raises(ValueError, match="no compare kernel for float64 outputs against float32 references"):
        comparer.compare("y", 0, 0, (3,), "float64", "float32", 0.0, 0.0, stream)
    with pytest.raises(
        ValueError, match=r"no compare kernel loaded for int32 outputs against int32 references \(loaded: float32/float32\)"
    ):
        comparer.compare("y", 0, 0, (3,), "int32", "int32", 0.0, 0.0, stream)
    comparer.free()


# ---- e. a GPU ------------------------------------------------------------------------------------

GPU_ARCH = detect_gpu_arch()


@pytest.mark.gpu
@pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")
def test_the_comparer_on_a_gpu_returns_the_hosts_mismatch(tmp_path):
    runtime.use_gpu(None)
    cuda = cuda_api()
    device = cuda.Device(0)
    device.set_current()
    stream = device.create_stream()
    comparer = DeviceComparer(cuda, compare_binaries(GPU_ARCH, PAIRS, CompileCache(tmp_path)))
    n = BLOCK * 4 * MAX_BLOCKS * 3 + 5  # past the grid's cap: every thread strides
    e = np.random.default_rng(9).standard_normal(n).astype(np.float32)
    g = e.copy()
    g[[n - 1, n // 2, BLOCK * 4 * MAX_BLOCKS + 7, 123_457]] += 1.0
    g[[n - 2, 999_999]] = np.nan
    large = Case("past the grid's cap", g, e, 1e-4, 1e-5, (2, 999_999, 4, 123_457))
    try:
        for case in [*CASES, large]:
            found = compare_on_device(cuda, comparer, stream, case)
            expected = compare_host(case.name, case.got, case.expected, case.rtol, case.atol)
            assert same(found, expected), (case.name, found, expected)
            if case.expect is not None:
                assert counts(found) == case.expect
    finally:
        comparer.free()
