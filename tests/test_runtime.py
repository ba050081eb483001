"""Shared run-time logic: expression trees, key -> bucket mapping, arch fallback, dtype sizes,
the table's entries, the one funnel for CUDA results; and the runtime package vendored whole."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hatch_autotune.declare import expr
from hatch_autotune.runtime import (
    DTYPE_SIZES,
    CudaCallError,
    DriverTooOldError,
    ExpressionError,
    TableEntry,
    as_compute_capability,
    check_cuda,
    choose_arch,
    compile_expr,
    cuda_version,
    instance_env,
    map_to_bucket,
    table_bytes,
)
from hatch_autotune.wheel.payload import runtime_files

BUCKETS = [1024, 4096, 65536]


@pytest.mark.parametrize(
    "value,mapping,expected",
    [
        (1024, "nearest", 1024),  # on a bucket
        (4096, "floor", 4096),
        (2047, "nearest", 1024),  # log2 2047 is nearer 10 than 12
        (2048, "nearest", 1024),  # exact log2 midpoint: ties go to the smaller bucket
        (2049, "nearest", 4096),
        (16384, "nearest", 4096),  # midpoint of 12 and 16 in log2 is 14 -> tie -> smaller
        (16385, "nearest", 65536),
        (3000, "floor", 1024),
        (3000, "ceil", 4096),
        (1, "nearest", 1024),  # below the range clamps
        (1, "ceil", 1024),
        (10**12, "floor", 65536),  # above the range clamps
        (10**12, "ceil", 65536),
        (4096, "exact", 4096),
    ],
)
def test_map_to_bucket(value, mapping, expected):
    assert map_to_bucket(value, BUCKETS, mapping) == expected


def test_exact_mapping_rejects_other_values():
    with pytest.raises(ValueError, match="head_dim=100 is not one of the exact buckets"):
        map_to_bucket(100, [64, 128], "exact", "head_dim")


@pytest.mark.parametrize(
    "device,cubins,ptx,expected",
    [
        ((9, 0), ["sm_80", "sm_90"], [], ("sm_90", "cubin")),
        ((8, 6), ["sm_80", "sm_90"], [], ("sm_80", "cubin")),
        ((8, 9), ["sm_80", "sm_86", "sm_90"], [], ("sm_86", "cubin")),
        ((9, 0), ["sm_90", "sm_90a"], [], ("sm_90a", "cubin")),  # arch-specific preferred on its own device
        ((10, 0), ["sm_80", "sm_90a"], ["compute_90"], ("compute_90", "ptx")),
        ((12, 0), ["sm_80", "sm_90"], ["compute_80", "compute_90"], ("compute_90", "ptx")),
    ],
)
def test_choose_arch(device, cubins, ptx, expected):
    assert choose_arch(device, cubins, ptx) == expected


def test_arch_specific_cubin_runs_only_on_its_own_device():
    with pytest.raises(RuntimeError, match=r"compute capability 10.0 \(sm_100\).*cubins for sm_90a"):
        choose_arch((10, 0), ["sm_90a"], [])
    with pytest.raises(RuntimeError, match=r"compute capability 7.5"):
        choose_arch((7, 5), ["sm_80"], ["compute_80"])  # PTX newer than the device cannot JIT


# a wheel with NVRTC 12 cubins for sm_90 (they load on every CUDA 12 driver), NVRTC 13 ones for
# sm_90a and sm_100 (arch-specific: only NVRTC 13 had them, say) and PTX of ISA 8.8 (CUDA 12.9)
FLOORS = {"sm_90": (12, 0), "sm_90a": (13, 0), "sm_100": (13, 0), "compute_90": (12, 9)}


@pytest.mark.parametrize(
    "device,driver,expected",
    [
        ((9, 0), None, ("sm_90a", "cubin")),  # no driver asked (select(arch=...)): as on a new enough one
        ((9, 0), (13, 0), ("sm_90a", "cubin")),
        ((9, 0), (12, 4), ("sm_90", "cubin")),  # the arch-specific cubin needs 13: the plain one serves
        ((10, 0), (13, 0), ("sm_100", "cubin")),
        ((10, 0), (12, 9), ("compute_90", "ptx")),  # sm_100's cubin needs 13; the PTX JITs on 12.9
    ],
)
def test_choose_arch_skips_what_the_driver_cannot_load(device, driver, expected):
    assert choose_arch(device, ["sm_90", "sm_90a", "sm_100"], ["compute_90"], driver, FLOORS) == expected


def test_a_driver_too_old_for_every_binary_that_runs_is_named_with_each_floor():
    with pytest.raises(DriverTooOldError) as err:
        choose_arch((10, 0), ["sm_90", "sm_90a", "sm_100"], ["compute_90"], (12, 4), FLOORS)
    assert str(err.value).startswith(
        "no binary of this wheel that runs on a device of compute capability 10.0 loads with this driver, CUDA 12.4: "
        "compute_90 needs CUDA 12.9 (driver R575 or newer), sm_100 needs CUDA 13.0 (driver R580 or newer) "
    )
    assert "update the NVIDIA driver to CUDA 12.9 (driver R575 or newer)" in str(err.value)  # the least upgrade
    assert 'min-cuda = "12"' in str(err.value) and "nvidia-cuda-nvrtc==12.4.*" in str(err.value)
    # a device no binary runs on at all is the other error, whatever the driver
    with pytest.raises(RuntimeError, match=r"no binary in this wheel runs on a device of compute capability 8\.0") as err:
        choose_arch((8, 0), ["sm_90"], [], (12, 4), FLOORS)
    assert not isinstance(err.value, DriverTooOldError)


@pytest.mark.parametrize("text,version", [("12.0", (12, 0)), ("13.5", (13, 5)), ("12.10", (12, 10))])
def test_cuda_version(text, version):
    assert cuda_version(text) == version


@pytest.mark.parametrize("text", ["12", "12.0.1", " 12.0", 12.0, None, "v12.0"])
def test_cuda_version_refuses_what_is_not_one(text):
    with pytest.raises(ValueError, match="not a CUDA version"):
        cuda_version(text)


@pytest.mark.parametrize(
    "arch,cc", [("sm_86", (8, 6)), ("8.6", (8, 6)), (86, (8, 6)), ((9, 0), (9, 0)), ("sm_120", (12, 0)), ("sm_90a", (9, 0))]
)
def test_as_compute_capability(arch, cc):
    assert as_compute_capability(arch) == cc


def test_as_compute_capability_rejects_junk():
    with pytest.raises(ValueError, match="not a CUDA arch"):
        as_compute_capability("hopper")
    with pytest.raises(TypeError, match="arch: expected"):
        as_compute_capability(9.0)


@pytest.mark.parametrize(
    "text,env,expected",
    [
        ("cdiv(n, BLOCK * VEC)", {"n": 1000, "BLOCK": 128, "VEC": 4}, 2),
        ("64 <= (BM // TM) * (BN // TN) <= 512", {"BM": 64, "TM": 4, "BN": 64, "TN": 4}, True),
        ("64 <= (BM // TM) * (BN // TN) <= 512", {"BM": 128, "TM": 2, "BN": 128, "TN": 2}, False),
        ("min(a, b) + max(a, b) ** 2 % 7", {"a": 3, "b": 5}, 3 + 25 % 7),
        ("x if x > 0 else -x", {"x": -4}, 4),
        ("not (a == 1 or b != 2) and True", {"a": 2, "b": 2}, True),
        ("n / 2", {"n": 3}, 1.5),
        (7, {}, 7),
    ],
)
def test_expressions_evaluate(text, env, expected):
    e = expr.parse(text)
    assert e(env) == expected
    assert compile_expr(e.tree)(env) == expected  # what the wheel evaluates, from the tree alone


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("open('f')", "calling open()"),
        ("x.y", "Attribute"),
        ("x[0]", "Subscript"),
        ("'s'", "the constant 's'"),
        ("lambda: 1", "Lambda"),
        ("cdiv(1)", "cdiv() with other than 2"),
        ("max(a=1)", "keywords"),
        ("a <", "invalid expression"),
        ("(x := 3)", "NamedExpr"),
    ],
)
def test_expressions_outside_the_whitelist_are_rejected(text, fragment):
    with pytest.raises(expr.ExprSyntaxError) as info:
        expr.parse(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("tree", [["eval", "x"], ["call", "open", 1], ["n"], "n", None, ["cmp", 1, ["<>", 2]]])
def test_foreign_trees_are_rejected(tree):
    with pytest.raises(ExpressionError):
        compile_expr(tree)


def test_instance_env_gives_byte_sizes_and_constants():
    import numpy as np

    assert {name: np.dtype(name).itemsize for name in DTYPE_SIZES} == DTYPE_SIZES
    assert instance_env({"T": "float16", "U": "uint64"}) == {"T_size": 2, "U_size": 8}
    assert instance_env({}) == {}
    # constants are named as they are: the same names shapes, constraints and geometry use
    assert instance_env({"T": "float32", "RADIUS": 3, "CAUSAL": False}) == {"T_size": 4, "RADIUS": 3, "CAUSAL": False}


def test_check_cuda_is_one_funnel_for_driver_and_nvrtc_results():
    from cuda.bindings import driver, nvrtc

    ok = driver.CUresult.CUDA_SUCCESS
    assert check_cuda((ok,), "cuInit") is None
    assert check_cuda((ok, 7), "cuDeviceGetCount") == 7
    assert check_cuda((nvrtc.nvrtcResult.NVRTC_SUCCESS, 13, 5), "nvrtcVersion") == (13, 5)
    with pytest.raises(CudaCallError, match=r"^cuMemAlloc \(L2 flush buffer\) failed: CUDA_ERROR_OUT_OF_MEMORY$") as err:
        check_cuda((driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc (L2 flush buffer)")
    assert (err.value.call, err.value.error) == ("cuMemAlloc (L2 flush buffer)", "CUDA_ERROR_OUT_OF_MEMORY")
    with pytest.raises(CudaCallError, match=r"^nvrtcGetPTX failed: NVRTC_ERROR_INVALID_PROGRAM$"):
        check_cuda((nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_PROGRAM,), "nvrtcGetPTX")


TUNED = {
    "bucket": [256, 128],
    "variant": "4af72858583e7a51",
    "tuned": True,
    "provenance": {"cc": "9.0", "gpu": "NVIDIA H200", "nvrtc": "13.0", "median_ms": 0.004416, "default_ms": 0.004752},
}
UNTUNED = {"bucket": [4096], "variant": "7a391a8a9ea75b26", "tuned": False, "provenance": {"reason": "no lock entry"}}


def test_a_table_entry_keeps_times_and_reason_apart_and_writes_the_same_json():
    tuned, untuned = TableEntry.from_json(TUNED), TableEntry.from_json(UNTUNED)
    assert tuned.bucket == (256, 128) and tuned.tuned and tuned.reason == ""
    assert (tuned.median_ms, tuned.default_ms) == (0.004416, 0.004752)
    assert tuned.provenance == {"cc": "9.0", "gpu": "NVIDIA H200", "nvrtc": "13.0"}  # where, not how fast
    assert not untuned.tuned and untuned.reason == "no lock entry" and untuned.provenance == {}
    assert (untuned.median_ms, untuned.default_ms) == (None, None)
    for raw, entry in ((TUNED, tuned), (UNTUNED, untuned)):
        assert table_bytes(entry.to_json()) == table_bytes(raw)  # the table's bytes do not change
        assert TableEntry.from_json(entry.to_json()) == entry
    with pytest.raises(AttributeError, match="immutable"):
        tuned.tuned = False  # type: ignore[misc]


PROBE = """
import json, sys
import vendored_pkg._runtime as rt
print(json.dumps({
    "file": rt.__file__,
    "modules": sorted(m for m in sys.modules if m.startswith(("hatch_autotune", "cuda", "numpy"))),
    "selection": rt.Selection.__module__,
    "arch": rt.choose_arch((8, 6), ["sm_80"], []),
}))
"""


def test_the_runtime_is_vendored_whole_and_imports_under_any_name(tmp_path):
    """What the wheel writer copies: every module, importing each other relatively, so that
    the package works as `<module>/_runtime/` with neither hatch-autotune nor CUDA loaded."""
    files = runtime_files()
    assert list(files) == sorted(files) and "_runtime/__init__.py" in files and "_runtime/kernel.py" in files
    assert all(name.endswith(".py") and "__pycache__" not in name for name in files)
    (tmp_path / "vendored_pkg").mkdir()
    (tmp_path / "vendored_pkg" / "__init__.py").write_text("")
    for rel, data in files.items():
        (tmp_path / "vendored_pkg" / rel).parent.mkdir(exist_ok=True)
        (tmp_path / "vendored_pkg" / rel).write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["file"] == str(tmp_path / "vendored_pkg" / "_runtime" / "__init__.py")
    assert found["modules"] == [] and found["selection"] == "vendored_pkg._runtime.selection"
    assert found["arch"] == ["sm_80", "cubin"]
