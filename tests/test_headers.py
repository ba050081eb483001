"""Header sets (issue #51): the toolkit's CUDA and CCCL headers and pinned third-party sets, on
the real NVRTC, no CUDA toolkit needed.

- tests/consumers/llm_kit, an LLM-inference kernel library (cuda_bf16.h and cuda_fp8.h
  arithmetic, CUB's BlockReduce, mma.h's WMMA, cooperative groups' reduce, cuda::pipeline,
  cuda::std::complex, inline-PTX wgmma for sm_90a), built offline for sm_80, sm_89, sm_90,
  sm_90a, sm_100a and sm_120; a warm rebuild compiles nothing and gives the same package byte
  for byte; the SASS says the headers did what they are for (HMMA from WMMA, HGMMA only in the
  sm_90a cubin, LDGSTS from cuda::pipeline, F2FP from the FP8 conversions);
- a set's identity is the content of its folders: a new version of a set recompiles exactly the
  kernels that declare it, and the same headers in another folder change nothing;
- precompiled headers give the same binaries and keep their per-process paths out of the log;
- declaration errors name the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import textwrap
from pathlib import Path

import pytest
from conftest import build, load_project
from sass import function_sass, missing_tools, opcodes

from hatch_autotune.compile import headers as headers_mod
from hatch_autotune.compile import pch as pch_mod
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import compile_all, compile_one
from hatch_autotune.compile.pch import MAX_PCH_FILES
from hatch_autotune.compile.render import render_kernel
from hatch_autotune.declare.validate import ConfigError
from hatch_autotune.errors import BuildError
from hatch_autotune.wheel.payload import write_package

LLM_KIT = Path(__file__).parent / "consumers" / "llm_kit"
ARCHS = ("sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120")
OFFLINE = {"HATCH_AUTOTUNE_MODE": "offline"}


def package_bytes(folder: Path) -> dict[str, str]:
    """Every file of a generated package, by its path, as a sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def llm_kit(tmp_path_factory):
    """llm_kit built offline twice on one compile cache: (project, first result, second result,
    first package folder, second package folder). The cache is this fixture's own, not the
    session's: a cubin compiled while a precompiled header is loaded orders its globals otherwise
    (an equivalent cubin, other bytes), so another worker building llm_kit at the same time could
    overwrite an entry with bytes the first build did not ship (seen in CI: staged_scale sm_90a)."""
    project = load_project(LLM_KIT, OFFLINE)
    assert project.archs == ARCHS
    out = tmp_path_factory.mktemp("llm-kit")
    cache = tmp_path_factory.mktemp("llm-kit-cache")
    results = []
    for i in range(2):
        result = build(LLM_KIT, cache, env=OFFLINE)
        write_package(out / f"build{i}", project, result)
        results.append(result)
    return project, results[0], results[1], out / "build0", out / "build1"


def test_every_header_family_compiles_for_every_arch(llm_kit):
    project, first, _, _, _ = llm_kit
    assert first.counts["failed"] == 0
    shipped = {(kb.spec.name, arch) for kb in first.kernels for (_source, arch) in kb.binaries}
    assert {(name, arch) for name in project.kernels for arch in ARCHS} <= shipped


def test_a_warm_rebuild_compiles_nothing_and_is_byte_identical(llm_kit):
    _, _, second, one, two = llm_kit
    assert second.counts["compiled"] == 0 and second.counts["failed"] == 0
    assert package_bytes(one) == package_bytes(two)


def test_the_cubins_do_not_depend_on_where_the_headers_were_extracted(tmp_path):
    """The same bundle in two folders: one identity, one binary; NVRTC is given the folder."""
    spec = load_project(LLM_KIT, OFFLINE).kernels["fp8_quant"]
    (toolkit,) = spec.header_sets
    here = headers_mod.resolve_header_set(toolkit, tmp_path / "a")
    there = headers_mod.resolve_header_set(toolkit, tmp_path / "b")
    assert here.identity == there.identity and here.options != there.options
    (variants, *_) = render_kernel(spec).values()
    job = variants[0].compile_job("sm_90", spec.entry, spec.nvrtc_options)
    jobs = [dataclasses.replace(job, header_sets=(s,)) for s in (here, there)]
    assert jobs[0].cache_key("x") == jobs[1].cache_key("x")
    (ok_a, cubin_a, _), (ok_b, cubin_b, _) = (compile_one(j) for j in jobs)
    assert ok_a and ok_b and cubin_a == cubin_b


def test_precompiled_headers_give_the_same_binary_and_a_clean_log(monkeypatch, tmp_path):
    spec = load_project(LLM_KIT, OFFLINE).kernels["rmsnorm"]
    (variants,) = render_kernel(spec).values()
    jobs = [v.compile_job("sm_90", spec.entry, spec.nvrtc_options) for v in variants[:4]]
    with_pch = [compile_one(j, str(tmp_path)) for j in jobs]  # the first writes the PCH, the others load it
    (folder,) = tmp_path.iterdir()  # this process's
    assert 1 <= len(list(folder.iterdir())) <= MAX_PCH_FILES
    without = [compile_one(j) for j in jobs]
    for (ok, cubin, log), (ok0, cubin0, log0) in zip(with_pch, without):
        assert ok and ok0 and cubin == cubin0
        assert "precompiled header" not in log and "#639" not in log and "pch" not in log.lower()
        assert untimed(log) == untimed(log0)


def test_a_batch_leaves_no_precompiled_headers_behind(monkeypatch, tmp_path):
    """NVRTC's own PCH folder outlives a pool worker (4 GB each in a six-arch build): compile_all
    gives each process a folder in one of its own and removes it; a process keeps at most
    MAX_PCH_FILES; a job with no sibling to share a PCH with compiles without one."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[int] = []
    prune = pch_mod.prune_pch
    monkeypatch.setattr(pch_mod, "prune_pch", lambda folder: (prune(folder), seen.append(len(os.listdir(folder)))))
    project = load_project(LLM_KIT, OFFLINE)
    jobs = []
    for name in ("rmsnorm", "argmax", "wmma_gemm"):
        spec = project.kernels[name]
        (variants,) = render_kernel(spec).values()
        jobs += [v.compile_job("sm_90", spec.entry, spec.nvrtc_options) for v in variants[: 3 if name != "wmma_gemm" else 1]]
    results = compile_all(jobs, None, workers=1)
    assert all(r.ok for r in results)
    assert len(seen) == 6 and max(seen) <= MAX_PCH_FILES  # wmma_gemm's single job compiled without
    assert list(tmp_path.iterdir()) == []


def test_ptx_is_compiled_without_precompiled_headers(monkeypatch, tmp_path):
    """A compile that loads a PCH declares the headers' template globals in another order than
    the one that made it (seen in CI: staged_scale's compute_120 PTX from two builds on one
    cache); the cubins are the same, the PTX text is not. So a PTX job never takes part in a PCH,
    and a cache key always says what its PTX is."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[int] = []
    prune = pch_mod.prune_pch
    monkeypatch.setattr(pch_mod, "prune_pch", lambda folder: (prune(folder), seen.append(len(os.listdir(folder)))))
    spec = load_project(LLM_KIT, OFFLINE).kernels["rmsnorm"]
    (variants,) = render_kernel(spec).values()
    ptx = [v.compile_job("compute_90", spec.entry, spec.nvrtc_options) for v in variants[:3]]
    results = compile_all(ptx, None, workers=1)
    assert all(r.ok for r in results) and seen == []
    cubins = [v.compile_job("sm_90", spec.entry, spec.nvrtc_options) for v in variants[:2]]
    assert all(r.ok for r in compile_all(cubins, None, workers=1)) and len(seen) == 2  # cubin siblings still share one


def untimed(log: str) -> str:
    """A compile log without ptxas's timings, which differ from run to run."""
    return "\n".join(line for line in log.splitlines() if "Compile time" not in line)


@pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))
@pytest.mark.parametrize(
    ("kernel", "arch", "expected", "absent"),
    [
        ("wgmma_tile", "sm_90a", {"HGMMA.64", "WARPGROUP.ARRIVE"}, set()),  # the sm_90a-only path
        ("wgmma_tile", "sm_90", set(), {"HGMMA.64"}),  # same source, the guarded fallback
        ("wgmma_tile", "sm_100a", set(), {"HGMMA.64"}),  # wgmma is sm_90a's alone
        ("wmma_gemm", "sm_80", {"HMMA.16816.F32"}, set()),  # mma.h's WMMA on the tensor cores
        ("wmma_gemm", "sm_120", {"HMMA.16816.F32"}, set()),
        ("staged_scale", "sm_80", {"LDGSTS.E"}, set()),  # cuda::pipeline's memcpy_async as cp.async
        ("fp8_quant", "sm_89", {"F2FP.SATFINITE"}, set()),  # cuda_fp8.h's conversion: one instruction from sm_89
        ("fp8_quant", "sm_80", set(), {"F2FP"}),  # before sm_89, emulated
        ("argmax", "sm_90", {"SHFL.BFLY"}, set()),  # cooperative groups' reduce over the warp
        ("rmsnorm", "sm_90", {"SHFL.DOWN", "BAR.SYNC", "HMUL2.BF16_V2"}, set()),  # CUB's BlockReduce, cuda_bf16.h's __hmul
        # issue #52's kernels (each config's own SASS: tests/test_llm_kit_launch.py)
        (
            "rope_inplace",
            "sm_90",
            {"LDG.E.U16", "STG.E.U16"},
            {"LDG.E.64", "LDG.E.128", "STG.E.64", "STG.E.128"},
        ),  # a strided row: 2-byte accesses only
        ("bias_gelu", "sm_90", {"ISETP.NE.AND.EX"}, set()),  # the optional bias: one 64-bit test of the pointer against null
        ("tma_copy", "sm_90a", {"UTMALDG.2D", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64.TRYWAIT"}, set()),  # TMA and its mbarrier
        ("tma_copy", "sm_89", set(), {"UTMALDG", "SYNCS.ARRIVE.TRANS64"}),  # before sm_90: the guarded plain loads
    ],
)
def test_the_sass_shows_what_the_headers_are_for(llm_kit, kernel, arch, expected, absent):
    _, result, _, _, _ = llm_kit
    (kb,) = [kb for kb in result.kernels if kb.spec.name == kernel]
    cubins = [r.binary for (_source, a), r in kb.binaries.items() if a == arch and r.ok]
    assert cubins
    for cubin in cubins:
        assert cubin is not None
        found = opcodes(function_sass(cubin, kb.spec.entry))
        names = {name for name in found}
        for pattern in expected:
            assert any(_matches(name, pattern) for name in names), (pattern, sorted(names))
        for pattern in absent:
            assert not any(_matches(name, pattern) for name in names), (pattern, sorted(names))


def _matches(opcode: str, pattern: str) -> bool:
    """`OP.MOD` matches an instruction of that opcode with at least those modifiers."""
    head, *mods = pattern.split(".")
    have_head, *have = opcode.split(".")
    return head == have_head and set(mods) <= set(have)


# ---- a third-party set from a pinned distribution ------------------------------------------------------

LIB_TEMPLATE = """\
#include <mylib/scale.h>
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    int i = blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i < n) y[i] = mylib::factor() * x[i];
}
"""
PLAIN_TEMPLATE = LIB_TEMPLATE.replace("#include <mylib/scale.h>\n", "").replace("mylib::factor()", "2.0f")

PROJECT = """\
[build-system]
requires = ["hatchling", "hatch-autotune"]
build-backend = "hatchling.build"

[project]
name = "libpkg"
version = "0.1.0"

[tool.hatch.build.targets.wheel]
packages = ["libpkg"]

[tool.hatch.build.targets.wheel.hooks.autotune]
module = "libpkg.kernels"
archs = ["sm_80", "sm_90"]

[tool.hatch.build.targets.wheel.hooks.autotune.header-sets.mylib]
include = [{{ distribution = "mylib-headers", version = "{version}", path = "mylib_headers/include" }}]

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scaled]
template = "lib.cu.j2"
headers = ["mylib"]
{kernel_tail}

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.plain]
template = "plain.cu.j2"
{kernel_tail}
"""
KERNEL_TAIL = """\
args = [
  { name = "x", dtype = "float32", shape = ["n"], intent = "in" },
  { name = "y", dtype = "float32", shape = ["n"], intent = "out" },
  { name = "n", dtype = "int32", value = "n" },
]
key = { n = { buckets = [1024, 65536] } }
space = { BLOCK = [64, 128] }
default = { BLOCK = 128 }
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]"""


def install_fake_headers(site: Path, version: str, factor: str) -> None:
    """A distribution `mylib-headers` at `version` whose header returns `factor`, as pip leaves one."""
    for old in site.glob("mylib_headers-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"mylib_headers-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mylib-headers\nVersion: {version}\n")
    header = site / "mylib_headers" / "include" / "mylib" / "scale.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(f"#pragma once\nnamespace mylib {{ __device__ inline float factor() {{ return {factor}f; }} }}\n")
    importlib.invalidate_caches()
    headers_mod.resolve_header_set.cache_clear()


def write_lib_project(root: Path, version: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "lib.cu.j2").write_text(LIB_TEMPLATE)
    (root / "plain.cu.j2").write_text(PLAIN_TEMPLATE)
    (root / "pyproject.toml").write_text(PROJECT.format(version=version, kernel_tail=KERNEL_TAIL))
    (root / "libpkg").mkdir(exist_ok=True)
    (root / "libpkg" / "__init__.py").write_text("")
    return root


def source_hashes(root: Path) -> dict[str, set[str]]:
    project = load_project(root, OFFLINE)
    return {name: {v.source_hash for vs in render_kernel(spec).values() for v in vs} for name, spec in project.kernels.items()}


def test_a_new_version_of_a_set_recompiles_exactly_the_kernels_that_use_it(tmp_path, monkeypatch):
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    install_fake_headers(site, "1.0", "2.0")
    root = write_lib_project(tmp_path / "proj", "1.0")
    cache = tmp_path / "cache"
    first = build(root, cache, env=OFFLINE)
    assert first.counts == {"compiled": 6, "cached": 0, "failed": 0}  # 2 kernels x (2 cubins + 1 PTX)
    before = source_hashes(root)

    install_fake_headers(site, "1.1", "3.0")  # the new release changes a header
    write_lib_project(root, "1.1")
    second = build(root, cache, env=OFFLINE)
    assert second.counts == {"compiled": 3, "cached": 3, "failed": 0}  # the `scaled` kernel's only
    after = source_hashes(root)
    assert after["plain"] == before["plain"] and after["scaled"].isdisjoint(before["scaled"])  # so its lock entries are stale

    install_fake_headers(site, "1.2", "3.0")  # a release whose headers did not change: nothing to do
    write_lib_project(root, "1.2")
    assert build(root, cache, env=OFFLINE).counts == {"compiled": 0, "cached": 6, "failed": 0}


def test_a_set_pinned_to_another_version_than_installed_is_a_clear_error(tmp_path, monkeypatch):
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    install_fake_headers(site, "1.0", "2.0")
    root = write_lib_project(tmp_path / "proj", "2.0")
    with pytest.raises(
        BuildError, match=r"header-sets\.mylib\.include\[0\]: mylib-headers 1\.0 is installed, the header set is pinned to 2\.0"
    ):
        build(root, tmp_path / "cache", env=OFFLINE)


def test_a_set_from_a_missing_distribution_says_what_to_install(tmp_path):
    headers_mod.resolve_header_set.cache_clear()
    root = write_lib_project(tmp_path / "proj", "1.0")
    with pytest.raises(BuildError, match=r"the distribution 'mylib-headers' is not installed; add 'mylib-headers==1\.0'"):
        build(root, tmp_path / "cache", env=OFFLINE)


def test_a_folder_the_distribution_lacks_is_named(tmp_path, monkeypatch):
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    install_fake_headers(site, "1.0", "2.0")
    root = write_lib_project(tmp_path / "proj", "1.0")
    text = (root / "pyproject.toml").read_text().replace("mylib_headers/include", "mylib_headers/nowhere")
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(BuildError, match=r"has no folder 'mylib_headers/nowhere'"):
        build(root, tmp_path / "cache", env=OFFLINE)


def test_without_the_set_the_include_fails_to_compile_with_nvrtcs_message(tmp_path):
    root = write_lib_project(tmp_path / "proj", "1.0")
    text = (root / "pyproject.toml").read_text().replace('headers = ["mylib"]\n', "")
    text = (
        text[: text.index("[tool.hatch.build.targets.wheel.hooks.autotune.header-sets")]
        + text[text.index("[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scaled]") :]
    )
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(BuildError, match=r"mylib/scale\.h"):
        build(root, tmp_path / "cache", env=OFFLINE)


# ---- the declaration ----------------------------------------------------------------------------------


def declaration_errors(tmp_path: Path, table: str, kernel_extra: str = "", dtype: str = "float32") -> list[str]:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    (root / "k.cu.j2").write_text(PLAIN_TEMPLATE)
    text = textwrap.dedent(
        f"""\
        [tool.hatch.build.targets.wheel.hooks.autotune]
        module = "p.kernels"
        {table}

        [tool.hatch.build.targets.wheel.hooks.autotune.kernels.k]
        template = "k.cu.j2"
        {kernel_extra}
        """
    ) + KERNEL_TAIL.replace('dtype = "float32", shape = ["n"], intent = "in"', f'dtype = "{dtype}", shape = ["n"], intent = "in"')
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_project(root)
    return info.value.errors


def test_an_unknown_set_is_named_with_the_known_ones(tmp_path):
    (error,) = declaration_errors(tmp_path, "", 'headers = ["cutlass"]')
    assert "kernels.k.headers: unknown header set 'cutlass'; expected 'cuda'" in error and "(declared: none)" in error


def test_the_builtin_name_cannot_be_redeclared(tmp_path):
    errors = declaration_errors(
        tmp_path,
        '[tool.hatch.build.targets.wheel.hooks.autotune.header-sets.cuda]\ninclude = [{ distribution = "x", version = "1", path = "i" }]',
    )
    assert any("header-sets.cuda: `cuda` is the built-in set" in e for e in errors)


def test_a_bad_folder_entry_names_its_key(tmp_path):
    errors = declaration_errors(
        tmp_path,
        '[tool.hatch.build.targets.wheel.hooks.autotune.header-sets.lib]\ninclude = [{ distribution = "x", version = "1", path = "../up" }]',
    )
    assert any("header-sets.lib.include[0].path: expected a relative folder inside the distribution" in e for e in errors)


def test_a_toolkit_dtype_without_the_toolkits_headers_says_what_to_add(tmp_path):
    (error,) = declaration_errors(tmp_path, "", dtype="bfloat16")
    assert "argument 'x' is bfloat16, whose C type (__nv_bfloat16) the toolkit's headers define" in error
    assert 'headers = ["cuda"]' in error


def test_the_hook_tables_headers_are_every_kernels_default(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "k.cu.j2").write_text(PLAIN_TEMPLATE)
    (root / "pyproject.toml").write_text(
        '[tool.hatch.build.targets.wheel.hooks.autotune]\nmodule = "p.kernels"\nheaders = ["cuda"]\n\n'
        '[tool.hatch.build.targets.wheel.hooks.autotune.kernels.k]\ntemplate = "k.cu.j2"\n' + KERNEL_TAIL + "\n\n"
        '[tool.hatch.build.targets.wheel.hooks.autotune.kernels.bare]\ntemplate = "k.cu.j2"\nheaders = []\n' + KERNEL_TAIL
    )
    project = load_project(root)
    assert [s.name for s in project.kernels["k"].header_sets] == ["cuda"] and project.kernels["k"].toolkit_headers
    assert project.kernels["bare"].header_sets == () and not project.kernels["bare"].toolkit_headers


def test_toolkit_c_types_follow_the_declaration():
    project = load_project(LLM_KIT, OFFLINE)
    rendered = render_kernel(project.kernels["fp8_quant"])
    sources = {key: variants[0].source for key, variants in rendered.items()}
    assert "__nv_fp8_e4m3* __restrict__ q" in sources["Q=float8_e4m3fn,T=bfloat16"]
    assert "const __nv_bfloat16* __restrict__ x" in sources["Q=float8_e5m2,T=bfloat16"]


def test_compile_all_keys_header_sets_by_content(tmp_path):
    """A cached binary is found again by a job whose set has the same identity, wherever its folder."""
    spec = load_project(LLM_KIT, OFFLINE).kernels["wmma_gemm"]
    (variants,) = render_kernel(spec).values()
    job = variants[0].compile_job("sm_80", spec.entry, spec.nvrtc_options)
    cache = CompileCache(tmp_path / "cache")
    (first,) = compile_all([job], cache)
    moved = dataclasses.replace(job.header_sets[0], options=("--use-bundled-headers=/nonexistent-folder",))
    (again,) = compile_all([dataclasses.replace(job, header_sets=(moved,))], cache)
    assert first.ok and again.cached and again.binary == first.binary
    other = dataclasses.replace(job.header_sets[0], identity="0" * 64)
    (changed,) = compile_all([dataclasses.replace(job, header_sets=(other,))], cache)
    assert not changed.cached


# ---- the built package, called: bfloat16, FP8 and complex arguments over the driver stand-in -------


@pytest.fixture
def llm_kernels(llm_kit, tmp_path, monkeypatch):
    """llm_kit's generated package imported, its runtime over the driver stand-in (one 9.0 GPU)."""
    import shutil

    from conftest import imported_kernels
    from cuda_standin import install

    _, _, _, package, _ = llm_kit
    shutil.copytree(LLM_KIT / "src" / "llm_kit", tmp_path / "llm_kit")
    shutil.copytree(package, tmp_path / "llm_kit" / "kernels")
    with imported_kernels(tmp_path, "llm_kit") as kernels:
        standin = install(monkeypatch, kernels._runtime, ccs=((9, 0), (10, 3)))
        try:
            yield kernels, standin
        finally:
            kernels._runtime.use_gpu(None)


def test_the_arch_specific_cubin_is_chosen_on_its_own_device_only(llm_kernels):
    kernels, _ = llm_kernels
    on_h100 = kernels.wgmma_tile.select((9, 0), tiles=64)
    assert (on_h100.arch, on_h100.binary, on_h100.reason) == ("sm_90a", "sm_90a", "arch-specific")
    on_a100 = kernels.wgmma_tile.select((8, 0), tiles=64)
    assert (on_a100.binary, on_a100.reason) == ("sm_80", "exact")
    on_l40 = kernels.wgmma_tile.select((8, 9), tiles=64)
    assert on_l40.binary == "sm_89"
    assert kernels.wgmma_tile.select((10, 0), tiles=64).binary == "sm_100a"
    with pytest.raises(RuntimeError, match=r"compute capability 10\.3 .*sm_100a"):  # an `a` cubin is for 10.0 alone
        kernels.wgmma_tile.select((10, 3), tiles=64)


def test_bfloat16_and_fp8_arrays_are_taken_as_themselves_and_launched(llm_kernels, monkeypatch):
    import ml_dtypes
    import numpy as np
    from standin_arrays import install_cupy, install_torch

    kernels, standin = llm_kernels
    cupy = install_cupy(monkeypatch, standin)
    x = cupy.ndarray((1 << 16,), np.dtype(ml_dtypes.bfloat16))
    for q_dtype in ("float8_e4m3fn", "float8_e5m2"):
        q = cupy.ndarray((1 << 16,), np.dtype(getattr(ml_dtypes, q_dtype)))
        kernels.fp8_quant(x, q, 0.5)
        launch = standin.launches[-1]
        assert [int.from_bytes(p, "little") for p in launch.params[:2]] == [x.data.ptr, q.data.ptr]
        assert launch.params[2] == np.float32(0.5).tobytes()
        selection = kernels.fp8_quant.select((9, 0), n=1 << 16, T="bfloat16", Q=q_dtype)
        assert selection.types == {"T": "bfloat16", "Q": q_dtype}
    torch_ = install_torch(monkeypatch, standin)
    rows, cols = 16, 1024
    a, w, y = torch_.Tensor((rows, cols), "bfloat16"), torch_.Tensor((cols,), "bfloat16"), torch_.Tensor((rows, cols), "bfloat16")
    kernels.rmsnorm(a, w, y, 1e-6)
    launch = standin.launches[-1]
    assert launch.params[3:5] == [np.int32(cols).tobytes(), np.float32(1e-6).tobytes()]
    wrong = torch_.Tensor((rows, cols), "float16")
    with pytest.raises(TypeError, match=r"^rmsnorm\(\): argument 'x' has dtype float16.*bfloat16"):
        kernels.rmsnorm(wrong, w, y, 1e-6)


def test_a_dlpack_only_bfloat16_array_is_named_by_its_type_code(llm_kernels):
    import torch
    from standin_arrays import DLPackArray

    kernels, _ = llm_kernels
    tiles = 4
    a, b, d = (
        DLPackArray(torch.zeros(tiles, n, dtype=dt)) for n, dt in ((1024, torch.bfloat16), (128, torch.bfloat16), (512, torch.float32))
    )
    call = kernels.wgmma_tile.prepare(a, b, d)
    assert call.key == {"tiles": tiles}
    with pytest.raises(TypeError, match=r"argument 'b' has dtype float16"):
        kernels.wgmma_tile.prepare(a, DLPackArray(torch.zeros(tiles, 128, dtype=torch.float16)), d)


def test_the_pytorch_operators_trace_bfloat16_and_fp8_meta_tensors(llm_kernels):
    import importlib

    import torch

    ops = importlib.import_module("llm_kit.kernels.torch_ops")
    meta = {"device": "meta"}
    y = ops.rmsnorm(torch.empty(16, 1024, dtype=torch.bfloat16, **meta), torch.empty(1024, dtype=torch.bfloat16, **meta), 1e-6)
    assert (y.dtype, tuple(y.shape), y.device.type) == (torch.bfloat16, (16, 1024), "meta")
    with pytest.raises((TypeError, RuntimeError), match=r"bfloat16"):
        ops.rmsnorm(torch.empty(16, 1024, dtype=torch.float16, **meta), torch.empty(1024, dtype=torch.float16, **meta), 1e-6)
    assert not hasattr(ops, "fp8_quant")  # Q is fixed by the output alone: only the `_out` form
    x = torch.empty(1 << 16, dtype=torch.bfloat16, **meta)
    ops.fp8_quant_out(x, torch.empty(1 << 16, dtype=torch.float8_e4m3fn, **meta), 0.25)
    with pytest.raises((TypeError, RuntimeError), match=r"float8_e4m3fn"):
        ops.fp8_quant_out(x, torch.empty(1 << 16, dtype=torch.int8, **meta), 0.25)


# ---- CUTLASS/CuTe: a pinned third-party set with the CCCL it was made for ------------------------------

CUTLASS_DISTS = {"nvidia-cutlass": "4.2.0.0", "nvidia-cuda-cccl": "13.0.85", "nvidia-cuda-runtime": "13.0.96"}
CUTE_TEMPLATE = """\
#include <cute/tensor.hpp>
using namespace cute;

extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    // a (4, BLOCK / 4) column-major layout over each block's slice of y
    auto layout = make_layout(make_shape(Int<4>{}, Int<{{ BLOCK }} / 4>{}));
    const int base = blockIdx.x * {{ BLOCK }};
    Tensor out = make_tensor(make_gmem_ptr(y + base), layout);
    const int i = base + threadIdx.x;
    if (i < n) out(threadIdx.x % 4, threadIdx.x / 4) = 2.0f * x[i];
}
"""


@pytest.fixture(scope="module")
def cutlass_site(tmp_path_factory) -> Path:
    """CUTLASS 4.2's headers with the CCCL (3.0, CUDA 13.0's) and runtime headers they compile
    against under NVRTC (CuTe 4.2 does not compile against the bundle's CCCL 3.5), installed as
    pip leaves them (into a folder of their own: they are a project's build requirements)."""
    import subprocess
    import sys

    site = tmp_path_factory.mktemp("cutlass-site")
    pins = [f"{name}=={version}" for name, version in CUTLASS_DISTS.items()]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *pins], check=True, timeout=600)
    return site


def test_cute_compiles_from_a_pinned_cutlass_set(cutlass_site, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(cutlass_site))
    importlib.invalidate_caches()
    headers_mod.resolve_header_set.cache_clear()
    root = tmp_path / "proj"
    root.mkdir()
    (root / "cute.cu.j2").write_text(CUTE_TEMPLATE)
    folders = {
        "nvidia-cutlass": "cutlass_library/source/include",
        "nvidia-cuda-cccl": "nvidia/cu13/include/cccl",
        "nvidia-cuda-runtime": "nvidia/cu13/include",  # cuda_runtime_api.h, and cccl/ as `cccl/cuda/std/...`
    }
    include = ", ".join(f'{{ distribution = "{d}", version = "{v}", path = "{folders[d]}" }}' for d, v in CUTLASS_DISTS.items())
    (root / "pyproject.toml").write_text(
        '[tool.hatch.build.targets.wheel.hooks.autotune]\nmodule = "p.kernels"\narchs = ["sm_90"]\n\n'
        f"[tool.hatch.build.targets.wheel.hooks.autotune.header-sets.cutlass]\ninclude = [{include}]\n\n"
        '[tool.hatch.build.targets.wheel.hooks.autotune.kernels.cute_scale]\ntemplate = "cute.cu.j2"\nheaders = ["cutlass"]\n'
        'nvrtc-options = ["-default-device"]  # CUTLASS\'s constexpr helpers carry no __device__\n' + KERNEL_TAIL
    )
    result = build(root, tmp_path / "cache", env=OFFLINE)
    assert result.counts == {"compiled": 2, "cached": 0, "failed": 0}  # the sm_90 cubin and its PTX
    (variants,) = render_kernel(load_project(root, OFFLINE).kernels["cute_scale"]).values()
    (cutlass,) = variants[0].header_sets
    assert cutlass.label.startswith("nvidia-cutlass 4.2.0.0 (cutlass_library/source/include)")


def test_render_names_the_header_sets_a_variant_uses(capsys):
    from hatch_autotune.cli import main

    assert main(["render", "rmsnorm", str(LLM_KIT)]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("// header set ")]
    assert line.startswith("// header set cuda: CUDA ") and "CCCL" in line and "sha256 " in line
    assert main(["render", "halo_sum", str(Path(__file__).parent / "consumers" / "stencil_kit")]) == 0
    assert "// no header sets (#include <...>)" in capsys.readouterr().out


# ---- the toolkit's set without NVRTC's bundle: the PyPI header distributions ------------------------


def test_without_a_bundle_the_toolkit_set_comes_from_the_header_distributions(monkeypatch, tmp_path):
    """An NVRTC older than 13.3 has no bundle: the set is found where cuda.pathfinder finds the
    toolkit's headers (the PyPI distributions). Here pathfinder is pointed at a copy of the
    bundle's files laid out as nvidia-cuda-runtime and nvidia-cuda-cccl lay them out; the set
    is then other folders with the same content: the same identity, the same cubin."""
    import shutil

    import cuda.pathfinder

    toolkit = load_project(LLM_KIT, OFFLINE).kernels["rmsnorm"].header_sets[0]
    bundled = headers_mod.resolve_header_set(toolkit, tmp_path / "cache")
    include = tmp_path / "site" / "nvidia" / "cu13" / "include"
    shutil.copytree(bundled.folders[0], include, ignore=shutil.ignore_patterns(".nvrtc_*"))
    folders = {"cudart": str(include), "cccl": str(include / "cccl")}
    monkeypatch.setattr(headers_mod, "bundle_available", lambda: False)
    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", folders.get)
    headers_mod.resolve_header_set.cache_clear()
    from_pypi = headers_mod.resolve_header_set(toolkit, tmp_path / "cache")
    assert from_pypi.options == (f"-I{include}", f"-I{include / 'cccl'}")
    assert from_pypi.identity != bundled.identity  # two folders hashed, not one: another set to the keys
    spec = load_project(LLM_KIT, OFFLINE).kernels["fp8_quant"]
    (variants, *_) = render_kernel(spec).values()
    job = variants[0].compile_job("sm_90", spec.entry, spec.nvrtc_options)
    ok_bundle, cubin_bundle, _ = compile_one(dataclasses.replace(job, header_sets=(bundled,)))
    ok_pypi, cubin_pypi, log = compile_one(dataclasses.replace(job, header_sets=(from_pypi,)))
    assert ok_bundle and ok_pypi, log
    assert cubin_pypi == cubin_bundle

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", lambda lib: None)
    headers_mod.resolve_header_set.cache_clear()
    with pytest.raises(BuildError, match=r"`cuda` needs the toolkit's cudart headers.*pip install nvidia-cuda-runtime nvidia-cuda-cccl"):
        headers_mod.resolve_header_set(toolkit, tmp_path / "cache")
    headers_mod.resolve_header_set.cache_clear()
