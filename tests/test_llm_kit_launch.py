"""Issue #52's kernels of tests/consumers/llm_kit, proven on the CPU: compiled by the real NVRTC,
their SASS read, the package built offline, its kernels called through the generated runtime over
the driver stand-in (tests/cuda_standin.py), whose parameter bytes the tests read (rope_inplace is
emulated from them). No GPU has run them. rope_inplace: in-place RoPE on the q slice of a fused qkv
tensor (`strides = "inner"`), the cache length a free dim; bias_gelu: an optional bias;
smem_softmax: 125-196 KiB of dynamic shared memory and point constraints on `arch` and a key dim;
cluster_sum: a cluster launch; tma_copy: a CUtensorMap encoded per call and loaded by TMA."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import build, imported_kernels, load_project
from sass import function_sass, missing_tools, opcodes

from hatch_autotune.compile.nvrtc import compile_all
from hatch_autotune.compile.render import render_kernel
from hatch_autotune.wheel.payload import write_package

LLM_KIT = Path(__file__).parent / "consumers" / "llm_kit"
OFFLINE = {"HATCH_AUTOTUNE_MODE": "offline"}
NEW_KERNELS = ("rope_inplace", "bias_gelu", "smem_softmax", "cluster_sum", "tma_copy")


def _matches(opcode: str, pattern: str) -> bool:
    """`OP.MOD` matches an instruction of that opcode with at least those modifiers."""
    head, *mods = pattern.split(".")
    have_head, *have = opcode.split(".")
    return head == have_head and set(mods) <= set(have)


# ---- the SASS of each path, one config at a time (not only the shipped ones) --------------------------


def compiled(session_cache: Path, kernel: str, arch: str, config: dict[str, Any]) -> bytes:
    """The cubin of one config of a kernel for one arch, rendered and compiled as the build does."""
    from hatch_autotune.compile.cache import CompileCache

    spec = load_project(LLM_KIT, OFFLINE).kernels[kernel]
    (variant,) = [v for variants in render_kernel(spec).values() for v in variants if v.config_dict == config]
    (result,) = compile_all([variant.compile_job(arch, spec.entry, spec.nvrtc_options)], CompileCache(session_cache))
    assert result.ok and result.binary is not None, result.log
    return result.binary


@pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))
@pytest.mark.parametrize(
    ("kernel", "arch", "config", "expected", "absent"),
    [  # the shipped (default) configs' SASS is test_headers.py's: rope_inplace, bias_gelu, tma_copy
        # the row by one bulk copy into shared memory, completing on an mbarrier (sm_90 and newer)
        (
            "smem_softmax",
            "sm_90",
            {"STAGE": True, "BULK": True},
            {"UBLKCP.S.G", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64.TRYWAIT"},
            set(),
        ),
        ("smem_softmax", "sm_80", {"STAGE": True, "BULK": False}, {"STS", "LDS"}, {"UBLKCP", "SYNCS.ARRIVE.TRANS64"}),
        # the cluster barrier and generic loads of another block's shared memory (map_shared_rank)
        ("cluster_sum", "sm_90", {"BLOCK": 256, "CLUSTER": 2}, {"UCGABAR_ARV", "UCGABAR_WAIT", "LD.E"}, set()),
        ("cluster_sum", "sm_90", {"BLOCK": 256, "CLUSTER": 1}, set(), {"UCGABAR_ARV", "UCGABAR_WAIT", "LD.E"}),
        # TMA: the tensor load by descriptor and the transaction-count barrier
        ("tma_copy", "sm_90", {"BM": 32, "BK": 32}, {"UTMALDG.2D", "SYNCS.ARRIVE.TRANS64"}, set()),  # plain sm_90 has TMA too
        ("tma_copy", "sm_100a", {"BM": 64, "BK": 32}, {"UTMALDG.2D"}, set()),
        ("tma_copy", "sm_80", {"BM": 64, "BK": 32}, {"LDG.E.CONSTANT"}, {"UTMALDG", "SYNCS.ARRIVE.TRANS64"}),  # the plain path
    ],
)
def test_the_sass_shows_each_launch_feature(session_cache, kernel, arch, config, expected, absent):
    found = opcodes(function_sass(compiled(session_cache, kernel, arch, config), kernel))
    for pattern in expected:
        assert any(_matches(name, pattern) for name in found), (pattern, sorted(found))
    for pattern in absent:
        assert not any(_matches(name, pattern) for name in found), (pattern, sorted(found))


def test_the_tensor_map_parameter_is_64_byte_aligned_in_the_cubin(session_cache):
    """The driver copies a CUtensorMap parameter to the constant bank; the kernel's own alignas(64)
    puts it at a 64-byte aligned offset, 128 bytes long, between two 8-byte pointers."""
    from cuda_standin import cubin_param_offsets, cubin_params

    cubin = compiled(session_cache, "tma_copy", "sm_90a", {"BM": 64, "BK": 32})
    assert cubin_params(cubin, "tma_copy") == [8, 128, 8, 4, 4, 8]
    offsets = cubin_param_offsets(cubin, "tma_copy")
    assert offsets[1] % 64 == 0 and offsets[2] == offsets[1] + 128


def test_the_staged_rows_live_in_dynamic_shared_memory(session_cache):
    """The 125-196 KiB are the launch's (dynamic); the kernel's static shared memory is its
    reduction scratch (and sm_90's reserved kilobyte), so the opt-in covers the row alone."""
    from cuda_standin import cubin_static_shared

    for arch in ("sm_80", "sm_90"):
        cubin = compiled(session_cache, "smem_softmax", arch, {"STAGE": True, "BULK": False})
        assert cubin_static_shared(cubin, "smem_softmax") <= 2048


# ---- the package, built offline: what each arch and bucket runs ----------------------------------------


@pytest.fixture(scope="module")
def llm_kit(session_cache, tmp_path_factory):
    """llm_kit built offline (no lock: every point runs its default or the point's fallback):
    (project, result, package folder)."""
    project = load_project(LLM_KIT, OFFLINE)
    result = build(LLM_KIT, session_cache, env=OFFLINE)
    out = tmp_path_factory.mktemp("llm-kit-52") / "package"
    write_package(out, project, result)
    return project, result, out


def test_every_new_kernel_ships_a_binary_for_every_arch(llm_kit):
    project, result, _ = llm_kit
    assert result.counts["failed"] == 0
    shipped = {(kb.spec.name, arch) for kb in result.kernels for (_source, arch) in kb.binaries}
    assert {(name, arch) for name in NEW_KERNELS for arch in project.archs} <= shipped


@contextlib.contextmanager
def called(llm_kit, tmp_path: Path, monkeypatch, ccs=((9, 0),)):
    """llm_kit's generated package imported, its runtime over a stand-in of these devices:
    (kernels, standin, cupy)."""
    from cuda_standin import install
    from standin_arrays import install_cupy

    _, _, package = llm_kit
    site = tmp_path / "site"
    shutil.copytree(LLM_KIT / "src" / "llm_kit", site / "llm_kit")
    shutil.copytree(package, site / "llm_kit" / "kernels")
    with imported_kernels(site, "llm_kit") as kernels:
        standin = install(monkeypatch, kernels._runtime, ccs=ccs)
        try:
            yield kernels, standin, install_cupy(monkeypatch, standin)
        finally:
            kernels._runtime.use_gpu(None)


@pytest.fixture
def h100(llm_kit, tmp_path, monkeypatch):
    with called(llm_kit, tmp_path, monkeypatch) as got:
        yield got


@pytest.mark.parametrize(
    ("cc", "vocab", "config"),
    [
        ((9, 0), 32000, {"STAGE": True, "BULK": True}),  # the default: 128000 B, 16-byte rows
        ((9, 0), 50257, {"STAGE": True, "BULK": False}),  # rows of 201028 B are not 16-byte units: no bulk copy
        ((8, 0), 32000, {"STAGE": True, "BULK": False}),  # no cp.async.bulk before sm_90
        ((8, 0), 50257, {"STAGE": False, "BULK": False}),  # 201028 B > sm_80's 166912
        ((8, 9), 32000, {"STAGE": False, "BULK": False}),  # 128000 B > sm_89's 101376
        ((12, 0), 32000, {"STAGE": False, "BULK": False}),  # and sm_120's
    ],
)
def test_each_point_runs_the_first_config_its_constraints_and_shared_memory_allow(h100, cc, vocab, config):
    kernels, _, _ = h100
    selection = kernels.smem_softmax.select(cc, rows=64, vocab=vocab)
    assert dict(selection.config) == config


@pytest.mark.parametrize(
    ("cc", "cols", "cluster"),
    [((9, 0), 65536, 2), ((9, 0), 4096, 1), ((10, 0), 65536, 2), ((8, 0), 65536, 1), ((8, 9), 65536, 1)],
)
def test_a_cluster_config_runs_where_the_arch_and_the_bucket_allow_it(h100, cc, cols, cluster):
    kernels, _, _ = h100
    assert kernels.cluster_sum.select(cc, rows=16, cols=cols).config["CLUSTER"] == cluster


def test_show_says_why_each_point_falls_back(capsys):
    from hatch_autotune.cli import main

    assert main(["show", "-k", "smem_softmax", "-k", "cluster_sum", str(LLM_KIT)]) == 0
    out = capsys.readouterr().out
    for reason in (
        "smem_softmax on sm_80 at rows=64 vocab=50257: needs 201028 bytes of dynamic shared memory; sm_80 allows at most 166912 per block",
        "smem_softmax on sm_89 at rows=64 vocab=32000: needs 128000 bytes of dynamic shared memory; sm_89 allows at most 101376 per block",
        "smem_softmax on sm_90 at rows=64 vocab=50257: constraints[2] 'not BULK or vocab % 4 == 0' at vocab=50257: 1 config",
        "constraints[1] 'not BULK or arch >= 90' on sm_80",
        "cluster_sum on sm_90 at rows=16 cols=4096, rows=4096 cols=4096: constraints[1] 'CLUSTER == 1 or cols >= 16384' at cols=4096",
    ):
        assert reason in out, reason


# ---- calls over the stand-in ---------------------------------------------------------------------------


def _u64(param: bytes) -> int:
    return int.from_bytes(param, "little")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    import ml_dtypes

    return values.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def emulate_rope(standin, kernel, launch) -> float:
    """What rope_inplace.cu.j2 does, from the parameter bytes alone: q's pointer and element
    strides, head_dim and cache_len as the runtime passed them, tokens and heads as the grid."""
    q, positions, cos_cache, sin_cache = (_u64(p) for p in launch.params[:4])
    token_stride, head_stride = int(launch.param(4, "<i8")), int(launch.param(5, "<i8"))
    head_dim, cache_len = int(launch.param(6, "<i4")), int(launch.param(7, "<i4"))
    tokens, heads, _ = launch.grid
    half = head_dim // 2
    pos = standin.view(positions, "<i4", tokens)
    cos = standin.view(cos_cache, "<f4", cache_len * half).reshape(cache_len, half)
    sin = standin.view(sin_cache, "<f4", cache_len * half).reshape(cache_len, half)
    for t in range(tokens):
        if not 0 <= pos[t] < cache_len:
            continue
        for h in range(heads):
            row = standin.view(q + 2 * (t * token_stride + h * head_stride), "<u2", head_dim)
            x1, x2 = _bf16_to_f32(row[:half]), _bf16_to_f32(row[half:])
            c, s = cos[pos[t]], sin[pos[t]]
            row[:half], row[half:] = _f32_to_bf16(x1 * c - x2 * s), _f32_to_bf16(x2 * c + x1 * s)
    return 0.01


def rope_reference(qkv: np.ndarray, positions, cos, sin, heads: int, head_dim: int) -> np.ndarray:
    """NumPy: qkv with its q third rotated (in bfloat16 bits, as the kernel stores it)."""
    out = qkv.copy()
    half = head_dim // 2
    q = out[:, : heads * head_dim].reshape(len(positions), heads, head_dim)
    for t, p in enumerate(positions):
        if not 0 <= p < len(cos):
            continue
        x1, x2 = _bf16_to_f32(q[t, :, :half]), _bf16_to_f32(q[t, :, half:])
        q[t, :, :half], q[t, :, half:] = _f32_to_bf16(x1 * cos[p] - x2 * sin[p]), _f32_to_bf16(x2 * cos[p] + x1 * sin[p])
    out[:, : heads * head_dim] = q.reshape(len(positions), heads * head_dim)
    return out


def device_array(cupy, standin, host: np.ndarray, dtype: Any = None):
    """A stand-in CuPy array holding `host` (bfloat16 given as its uint16 bits and `dtype`)."""
    arr = cupy.ndarray(host.shape, dtype or host.dtype)
    standin.view(arr.data.ptr, host.dtype.str, host.size)[...] = host.ravel()
    return arr


def test_rope_rotates_the_q_slice_of_a_fused_qkv_tensor_in_place(h100, monkeypatch):
    """q is a [tokens, heads, head_dim] view of qkv [tokens, 3 * heads * head_dim]: launched on
    qkv's own memory with its element strides as scalars; k and v are not touched; the cache
    is 1000 long (its free dim's tuning size is 4096) and the call has 8 heads (32 tuned)."""
    import cuda_standin
    import ml_dtypes

    kernels, standin, cupy = h100
    monkeypatch.setitem(cuda_standin.EMULATORS, "rope_inplace", emulate_rope)
    tokens, heads, head_dim, cache_len = 16, 8, 64, 1000
    rng = np.random.default_rng(52)
    qkv_host = _f32_to_bf16(rng.standard_normal((tokens, 3 * heads * head_dim)))
    positions = rng.integers(0, cache_len, tokens).astype(np.int32)
    positions[3] = cache_len + 5  # past the cache: the kernel leaves the row
    angles = rng.uniform(0, 2 * np.pi, (cache_len, head_dim // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    qkv = device_array(cupy, standin, qkv_host, bf16)
    q = qkv.view_as((tokens, heads, head_dim), (3 * heads * head_dim * 2, head_dim * 2, 2))
    args = [device_array(cupy, standin, a) for a in (positions, cos, sin)]

    kernels.rope_inplace(q, *args)

    launch = standin.launches[-1]
    assert _u64(launch.params[0]) == qkv.data.ptr  # no copy: the kernel writes qkv itself
    assert [int(launch.param(i, dt)) for i, dt in ((4, "<i8"), (5, "<i8"), (6, "<i4"), (7, "<i4"))] == [
        3 * heads * head_dim,
        head_dim,
        head_dim,
        cache_len,
    ]
    assert launch.grid == (tokens, heads, 1)
    got = standin.view(qkv.data.ptr, "<u2", qkv_host.size).reshape(qkv_host.shape)
    np.testing.assert_array_equal(got, rope_reference(qkv_host, positions, cos, sin, heads, head_dim))
    assert (got[:, heads * head_dim :] == qkv_host[:, heads * head_dim :]).all()


def test_rope_takes_a_cache_of_any_length_but_one_length_for_both(h100):
    import ml_dtypes

    kernels, standin, cupy = h100
    tokens, heads, head_dim = 4, 2, 128
    q = cupy.ndarray((tokens, heads, head_dim), np.dtype(ml_dtypes.bfloat16))
    positions = cupy.ndarray((tokens,), "int32")
    for cache_len in (1, 4096, 131072):
        cos, sin = cupy.ndarray((cache_len, 64), "float32"), cupy.ndarray((cache_len, 64), "float32")
        kernels.rope_inplace(q, positions, cos, sin)
        assert int(standin.launches[-1].param(7, "<i4")) == cache_len
    checked = kernels.rope_inplace.checked_calls
    kernels.rope_inplace(q, positions, cos, sin)  # the same layouts again: the fast path
    assert kernels.rope_inplace.checked_calls == checked and int(standin.launches[-1].param(7, "<i4")) == 131072
    with pytest.raises(
        ValueError,
        match=r"^rope_inplace\(\): argument 'sin_cache' has shape \(2048, 64\); expected \(4096, 64\): its dim 0 is the free dim "
        r"cache_len, which is 4096 in 'cos_cache' \(cos_cache.shape\[0\]\) but 2048 in 'sin_cache'",
    ):
        kernels.rope_inplace(q, positions, cupy.ndarray((4096, 64), "float32"), cupy.ndarray((2048, 64), "float32"))
    with pytest.raises(ValueError, match=r"rope_inplace.*cos_cache"):  # head_dim // 2 is 64, not 32
        kernels.rope_inplace(q, positions, cupy.ndarray((4096, 32), "float32"), cupy.ndarray((4096, 32), "float32"))


def test_rope_refuses_a_q_whose_elements_are_not_adjacent_without_advising_a_copy(h100):
    import ml_dtypes

    kernels, _, cupy = h100
    tokens, heads, head_dim = 4, 2, 64
    base = cupy.ndarray((tokens, heads, 2 * head_dim), np.dtype(ml_dtypes.bfloat16))
    every_other = base.view_as((tokens, heads, head_dim), (heads * 2 * head_dim * 2, 2 * head_dim * 2, 4))
    positions, cache = cupy.ndarray((tokens,), "int32"), cupy.ndarray((16, 32), "float32")
    with pytest.raises(ValueError, match=r"rope_inplace.*'q'") as info:
        kernels.rope_inplace(every_other, positions, cache, cache)
    assert "copy" not in str(info.value)  # q is inout: the kernel would rotate the copy


def test_an_absent_bias_is_a_null_pointer_and_a_present_one_its_address(h100):
    kernels, standin, cupy = h100
    rows, cols = 16, 4096
    x, out, bias = cupy.ndarray((rows, cols), "float32"), cupy.ndarray((rows, cols), "float32"), cupy.ndarray((cols,), "float32")
    kernels.bias_gelu(x, None, out)
    params = standin.launches[-1].params
    assert params[1] == bytes(8) and _u64(params[0]) == x.data.ptr and _u64(params[2]) == out.data.ptr
    kernels.bias_gelu(x, bias, out)
    assert _u64(standin.launches[-1].params[1]) == bias.data.ptr
    kernels.bias_gelu(x, None, out)  # and back: the fast path does not keep the last call's pointer
    assert standin.launches[-1].params[1] == bytes(8)
    with pytest.raises(ValueError, match=r"bias_gelu.*'bias'"):
        kernels.bias_gelu(x, cupy.ndarray((cols + 1,), "float32"), out)
    with pytest.raises(TypeError, match=r"bias_gelu\(\): argument 'x' must be a GPU array"):  # x is not optional
        kernels.bias_gelu(None, bias, out)


def test_a_staged_row_asks_the_functions_opt_in_once_per_size(h100):
    """128000 B on sm_90 (> 48 KiB): cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) before the
    first launch (the stand-in refuses the launch without it), not again for the same size."""
    kernels, standin, cupy = h100
    rows = 64
    for vocab, shared in ((32000, 128000), (50257, 201028)):
        logits, probs = cupy.ndarray((rows, vocab), "float32"), cupy.ndarray((rows, vocab), "float32")
        for _ in range(3):
            kernels.smem_softmax(logits, probs)
            launch = standin.launches[-1]
            assert (launch.shmem, launch.grid, launch.block) == (shared, (rows, 1, 1), (1024, 1, 1))
    # once per loaded function (one per config: the bulk copy's and the plain loads'), not per call
    assert [value for entry, value in standin.shared_set if entry == "smem_softmax"] == [128000, 201028]


def test_a_vocabulary_not_checked_for_and_a_misaligned_pointer_are_refused(h100):
    """vocab's mapping is exact: the configs were excluded for 32000 and 50257 only; and the bulk
    copy needs 16-byte aligned rows (`align = 16`)."""
    kernels, _, cupy = h100
    with pytest.raises(ValueError, match=r"smem_softmax.*vocab"):
        kernels.smem_softmax(cupy.ndarray((64, 32001), "float32"), cupy.ndarray((64, 32001), "float32"))
    shifted = cupy.ndarray((64 * 32000 + 1,), "float32").view_as((64, 32000), (32000 * 4, 4), offset=4)  # 4-byte aligned
    with pytest.raises(ValueError, match=r"smem_softmax.*'logits'.*16"):
        kernels.smem_softmax(shifted, cupy.ndarray((64, 32000), "float32"))


def test_the_pytorch_operators_take_none_and_a_strided_view(h100):
    import importlib

    import torch

    ops = importlib.import_module("llm_kit.kernels.torch_ops")
    meta = {"device": "meta"}
    assert tuple(ops.bias_gelu(torch.empty(16, 4096, **meta), None).shape) == (16, 4096)  # `Tensor? bias`
    q = torch.empty(16, 3 * 8 * 64, dtype=torch.bfloat16, **meta)[:, : 8 * 64].view(16, 8, 64)  # q of a fused qkv
    cache = torch.empty(100, 32, **meta)
    ops.rope_inplace(q, torch.empty(16, dtype=torch.int32, **meta), cache, cache)
    with pytest.raises((ValueError, RuntimeError), match=r"rope_inplace.*'q'"):
        ops.rope_inplace(
            torch.empty(16, 8, 128, dtype=torch.bfloat16, **meta)[..., ::2], torch.empty(16, dtype=torch.int32, **meta), cache, cache
        )


def test_an_unstaged_point_launches_without_the_opt_in(llm_kit, tmp_path, monkeypatch):
    with called(llm_kit, tmp_path, monkeypatch, ccs=((8, 9),)) as (kernels, standin, cupy):
        kernels.smem_softmax(cupy.ndarray((64, 32000), "float32"), cupy.ndarray((64, 32000), "float32"))
        assert standin.launches[-1].shmem == 0 and not standin.shared_set


def test_a_long_row_launches_a_cluster_of_two_and_a_short_one_a_plain_grid(h100):
    kernels, standin, cupy = h100
    rows = 16
    kernels.cluster_sum(cupy.ndarray((rows, 65536), "float32"), cupy.ndarray((rows,), "float32"))
    launch = standin.launches[-1]
    assert (launch.cluster, launch.grid, launch.block) == ((2, 1, 1), (2 * rows, 1, 1), (256, 1, 1))
    launched_ex = standin.calls.get("cuLaunchKernelEx", 0)
    assert launched_ex >= 1
    kernels.cluster_sum(cupy.ndarray((rows, 4096), "float32"), cupy.ndarray((rows,), "float32"))
    launch = standin.launches[-1]
    assert launch.cluster is None and launch.grid == (rows, 1, 1)
    assert standin.calls.get("cuLaunchKernelEx", 0) == launched_ex  # a 1x1x1 cluster is a plain cuLaunchKernel


def test_an_sm80_device_never_launches_a_cluster(llm_kit, tmp_path, monkeypatch):
    with called(llm_kit, tmp_path, monkeypatch, ccs=((8, 0),)) as (kernels, standin, cupy):
        kernels.cluster_sum(cupy.ndarray((16, 65536), "float32"), cupy.ndarray((16,), "float32"))
        assert standin.launches[-1].cluster is None and standin.launches[-1].binary == "sm_80"


def test_the_tensor_map_is_encoded_from_a_padded_source_and_passed_by_value(h100, monkeypatch):
    """src is a [rows, cols] view of a [rows, ld] buffer (rows padded to 16 bytes): the map has its
    address, dims and byte strides innermost first, the box (BK, BM); the kernel also gets ld
    in elements; the same array again reuses the encoded map."""
    from cuda_standin import decode_tensor_map

    kernels, standin, cupy = h100
    rows, cols, ld = 256, 250, 256
    buf = cupy.ndarray((rows, ld), "float32")
    src = buf.view_as((rows, cols), (ld * 4, 4))
    dst = cupy.ndarray((rows, cols), "float32")
    kernels.tma_copy(src, dst)
    launch = standin.launches[-1]
    assert len(launch.params[1]) == 128
    bm, bk = (kernels.tma_copy.select((9, 0), rows=rows, cols=cols).config[k] for k in ("BM", "BK"))
    assert decode_tensor_map(launch.params[1]) == {
        "dtype": 7,  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        "rank": 2,
        "address": buf.data.ptr,
        "swizzle": 0,
        "l2_promotion": 0,
        "oob_fill": 0,
        "dims": [cols, rows],
        "strides": [ld * 4],
        "box": [bk, bm],
        "element_strides": [1, 1],
    }
    assert _u64(launch.params[0]) == buf.data.ptr and int(launch.param(5, "<i8")) == ld
    assert launch.grid == (-(-cols // bk), -(-rows // bm), 1)
    encoded = standin.encoded
    kernels.tma_copy(src, dst)
    assert standin.encoded == encoded  # cached per (pointer, shape, strides, box)


def test_a_source_whose_rows_are_not_16_byte_apart_is_refused_naming_the_map(h100):
    kernels, _, cupy = h100
    rows, cols = 256, 250
    buf = cupy.ndarray((rows, cols + 1), "float32")
    src = buf.view_as((rows, cols), ((cols + 1) * 4, 4))  # 1004-byte rows: TMA needs multiples of 16
    with pytest.raises(ValueError, match=r"tma_copy.*(src_map|'src').*16"):
        kernels.tma_copy(src, cupy.ndarray((rows, cols), "float32"))
