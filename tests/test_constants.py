"""Caller-chosen constants, boolean values in templates and `#include`d helper headers (issue
#12), on the consumer project tests/consumers/stencil_kit: its generated package is built by the
real pipeline (NVRTC) and driven down to the driver boundary through the stand-in (cuda.core's
real argument packing; no GPU here)."""

from __future__ import annotations

import hashlib
import inspect
import shutil
from pathlib import Path

import cuda_standin
import numpy as np
import pytest
from conftest import STENCIL_KIT as CONSUMER
from conftest import load_project, real_driver_runtime, tune_over_standin
from cuda_standin import DeviceArray, install

from hatch_autotune.compile.nvrtc import CompileJob
from hatch_autotune.compile.render import TemplateError, render_kernel
from hatch_autotune.declare.config import ConfigError
from hatch_autotune.plan.planner import make_plan
from hatch_autotune.runtime import choose_arch
from hatch_autotune.tuning.inputs import bucket_inputs, reference_outputs


def copy_consumer(dest: Path) -> Path:
    shutil.copytree(CONSUMER, dest, ignore=shutil.ignore_patterns("dist", "build", "*.egg-info", "__pycache__"))
    return dest


@pytest.fixture
def rt(stencil_kit):
    with real_driver_runtime(stencil_kit) as runtime:
        yield runtime


# ---- selection ------------------------------------------------------------------------------


def test_each_constant_value_selects_its_own_variant(stencil_kit):
    stencil = stencil_kit.stencil
    picks = {}
    for radius in (1, 3):
        for periodic in (False, True):
            sel = stencil.select(arch="sm_90", n=5000, RADIUS=radius, PERIODIC=periodic)
            assert sel.constants == {"RADIUS": radius, "PERIODIC": periodic} and sel.types == {}
            assert sel.config == {"BLOCK": 256, "USE_SMEM": True} and sel.tuned is False
            picks[(radius, periodic)] = hashlib.sha256(stencil.binary(sel)).hexdigest()
    assert len(set(picks.values())) == 4  # four instances, four binaries


@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        ({"PERIODIC": False}, TypeError, "stencil.select() needs constant RADIUS= (one of [1, 3])"),
        ({"RADIUS": 2, "PERIODIC": False}, ValueError, "constant RADIUS=2; expected one of [1, 3]"),
        ({"RADIUS": True, "PERIODIC": False}, ValueError, "constant RADIUS=True; expected one of [1, 3]"),  # True is not 1
        ({"RADIUS": 1, "PERIODIC": 0}, ValueError, "constant PERIODIC=0; expected one of [False, True]"),
        ({"RADIUS": "1", "PERIODIC": False}, ValueError, "constant RADIUS='1'"),
    ],
)
def test_select_refuses_a_missing_or_undeclared_constant(stencil_kit, kwargs, exc, message):
    with pytest.raises(exc) as info:
        stencil_kit.stencil.select(arch="sm_90", n=100, **kwargs)
    assert message in str(info.value)


def test_numpy_values_are_exact_constants(stencil_kit):
    sel = stencil_kit.stencil.select(arch="sm_90", n=100, RADIUS=np.int64(3), PERIODIC=np.bool_(True))
    assert sel.constants == {"RADIUS": 3, "PERIODIC": True} and type(sel.constants["RADIUS"]) is int


def test_signature_and_help_show_the_constants_as_keywords(stencil_kit):
    sig = inspect.signature(stencil_kit.stencil)
    assert str(sig) == "(x, y, *, RADIUS, PERIODIC, stream=None)"
    doc = stencil_kit.stencil.__doc__
    assert "RADIUS: constant, keyword only, one of [1, 3]" in doc and "PERIODIC: constant, keyword only, one of [False, True]" in doc


# ---- calls ----------------------------------------------------------------------------------


class FakeGPUArray:
    _next = 0x7F0000000000

    def __init__(self, shape, typestr="<f4"):
        FakeGPUArray._next += 1 << 20
        self.ptr = FakeGPUArray._next
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }


def test_shapes_and_computed_scalars_use_the_constants(stencil_kit):
    halo = stencil_kit.halo_sum
    call = halo.prepare(FakeGPUArray((100,)), FakeGPUArray((96,)), RADIUS=2)
    assert call.types == {"RADIUS": 2} and call.key == {"n": 100}
    assert call.c_args[2] == np.int32(96) and type(call.c_args[2]) is np.int32  # m = n - 2 * RADIUS
    with pytest.raises(ValueError, match=r"argument 'y' has shape \(96,\); expected \(92,\)"):
        halo.prepare(FakeGPUArray((100,)), FakeGPUArray((96,)), RADIUS=4)
    with pytest.raises(TypeError, match=r"halo_sum\(\) needs constant RADIUS="):
        halo.prepare(FakeGPUArray((100,)), FakeGPUArray((96,)))
    with pytest.raises(TypeError, match=r"takes 2 arguments \(x, y\), got 3; constants are passed by keyword \(RADIUS=\)"):
        halo.prepare(FakeGPUArray((100,)), FakeGPUArray((96,)), 2)
    with pytest.raises(TypeError, match="unexpected argument 'RADIUSS'"):
        halo.prepare(FakeGPUArray((100,)), FakeGPUArray((96,)), RADIUS=2, RADIUSS=2)


def test_calls_launch_the_instance_the_constants_name_also_on_the_fast_path(rt, stencil_kit, monkeypatch):
    standin = install(monkeypatch, rt)
    loaded = []
    monkeypatch.setitem(cuda_standin.EMULATORS, "stencil", lambda s, kernel, launch: loaded.append(kernel.code.data) or 0.0)
    stencil = rt.Library.load(stencil_kit._LIBRARY.directory).kernels["stencil"]
    n = 5000
    x = DeviceArray(standin, np.ones(n, np.float32))
    y = DeviceArray.empty(standin, (n,))
    calls = [(1, False), (3, True), (1, False), (3, True), (3, False)]  # repeats take the fast path
    for radius, periodic in calls:
        stencil(x, y, RADIUS=radius, PERIODIC=periodic)
    assert len(standin.launches) == len(calls) == len(loaded)
    for (radius, periodic), launch, code in zip(calls, standin.launches, loaded):
        sel = stencil.select(arch="sm_90", n=n, RADIUS=radius, PERIODIC=periodic)
        assert code == stencil.binary(sel)  # the cubin of this instance
        assert launch.shmem == (256 + 2 * radius) * 4  # shared = "(BLOCK + 2 * RADIUS) * 4 if USE_SMEM else 0"
        assert launch.grid == (20, 1, 1) and launch.block == (256, 1, 1)
    assert len(stencil._fast) == 3  # one plan per instance called
    with pytest.raises(ValueError, match="constant RADIUS=True"):  # a plan for RADIUS=1 exists; True is not 1
        stencil(x, y, RADIUS=True, PERIODIC=False)
    with pytest.raises(TypeError, match="needs constant PERIODIC="):
        stencil(x, y, RADIUS=1)
    assert len(standin.launches) == len(calls)


# ---- the build side -------------------------------------------------------------------------


def test_booleans_render_as_cpp_and_still_test_as_booleans(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    t = root / "cuda" / "transpose.cu.j2"
    t.write_text(t.read_text() + "// {{ PAD }} {{ PAD is true }} {{ 'on' if PAD else 'off' }} {{ TILE > 16 }} {{ PAD | int }}\n")
    sources = {
        v.config_dict["PAD"]: v.source for v in render_kernel(load_project(root).kernels["transpose"])["-"] if v.config_dict["TILE"] == 32
    }
    assert sources[True].endswith("// true true on true 1\n") and sources[False].endswith("// false false off true 0\n")
    variants = render_kernel(load_project(CONSUMER).kernels["transpose"])["-"]
    by_pad = {v.config_dict["PAD"]: v.source for v in variants if v.config_dict["TILE"] == 32}
    assert "constexpr bool PAD = true;" in by_pad[True] and "constexpr bool PAD = false;" in by_pad[False]
    stencil = render_kernel(load_project(CONSUMER).kernels["stencil"])
    assert sorted(stencil) == ["PERIODIC=false,RADIUS=1", "PERIODIC=false,RADIUS=3", "PERIODIC=true,RADIUS=1", "PERIODIC=true,RADIUS=3"]
    src = stencil["PERIODIC=true,RADIUS=3"][0].source
    assert "constexpr int RADIUS = 3;" in src and "constexpr bool PERIODIC = true;" in src and "True" not in src


def test_headers_reach_nvrtc_by_name_and_enter_hashes_and_checksums(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    project = load_project(root)
    plan = make_plan(project, ("sm_90",), log=lambda m: None)
    inst = next(i for i in plan.instances if i.spec.name == "stencil")
    variant = inst.variants[0]
    assert [name for name, _ in variant.headers] == ["common.cuh", "detail/weights.cuh", "scale.cuh"]
    job = inst.compile_job(0, "sm_90")
    assert job.headers == variant.headers
    assert job.cache_key("13.5") != CompileJob(job.source, job.arch, job.entry, job.options).cache_key("13.5")
    before = (variant.source_hash, inst.points["sm_90"][0].checksum, job.cache_key("13.5"))
    # editing a header two levels down changes what the binary is compiled from, and the lock entry
    scale = root / "cuda" / "detail" / "scale.cuh"
    scale.write_text(scale.read_text().replace("1.0f", "2.0f"))
    inst2 = next(i for i in make_plan(load_project(root), ("sm_90",), log=lambda m: None).instances if i.spec.name == "stencil")
    after = (inst2.variants[0].source_hash, inst2.points["sm_90"][0].checksum, inst2.compile_job(0, "sm_90").cache_key("13.5"))
    assert all(a != b for a, b in zip(before, after))
    assert inst2.variants[0].source == variant.source  # the rendered source itself did not change


def test_a_header_less_variant_hashes_as_before():
    variants = render_kernel(load_project(Path(__file__).parents[1] / "example_pkg").kernels["saxpy"])["T=float32"]
    assert all(v.headers == () and v.source_hash == hashlib.sha256(v.source.encode()).hexdigest() for v in variants)


def _kit_with(tmp_path, template_head: str, files: dict[str, str] | None = None) -> Path:
    root = copy_consumer(tmp_path / "kit")
    t = root / "cuda" / "halo_sum.cu.j2"
    t.write_text(template_head + "\n" + t.read_text())
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    "head,files,message",
    [
        ('#include "missing.cuh"', {}, '#include "missing.cuh" not found (looked for'),
        ('#include "../../outside.cuh"', {"../outside.cuh": "#pragma once\n"}, "outside the project"),
        (
            '#include "sub/a.cuh"\n#include "sub2/b.cuh"',
            {
                "cuda/sub/a.cuh": '#include "x.cuh"\n',
                "cuda/sub/x.cuh": "",
                "cuda/sub2/b.cuh": '#include "x.cuh"\n',
                "cuda/sub2/x.cuh": "// another\n",
            },
            "means",
        ),
    ],
    ids=["missing", "outside", "one-name-two-files"],
)
def test_include_problems_are_named_at_render_time(tmp_path, head, files, message):
    root = _kit_with(tmp_path, head, files)
    with pytest.raises(TemplateError) as info:
        render_kernel(load_project(root).kernels["halo_sum"])
    assert message in str(info.value) and "(kernel halo_sum, RADIUS=2, BLOCK=128)" in str(info.value)


def test_commented_out_includes_are_ignored(tmp_path):
    root = _kit_with(tmp_path, '// #include "missing.cuh"\n/* #include "gone.cuh" */')
    variants = render_kernel(load_project(root).kernels["halo_sum"])["RADIUS=2"]
    assert [name for name, _ in variants[0].headers] == ["common.cuh", "detail/weights.cuh", "scale.cuh"]


def _table(extra: str) -> str:
    text = (CONSUMER / "pyproject.toml").read_text()
    return text.replace("constants = { RADIUS = [2, 4] }", extra)


@pytest.mark.parametrize(
    "constants,message",
    [
        ("constants = { RADIUS = [] }", "kernels.halo_sum.constants.RADIUS: expected a non-empty array of integers or booleans"),
        ("constants = { RADIUS = [2, true] }", "expected values of one kind, all integers or all booleans"),
        ("constants = { RADIUS = [2, 2] }", "expected distinct values, got [2, 2]"),
        ("constants = { RADIUS = [2.5] }", "RADIUS[0]: expected an integer from -9223372036854775808 to 9223372036854775807, or a boolean"),
        ("constants = { RADIUS = [2], x = [1] }", "constant 'x' has the same name as argument x"),
        ("constants = { RADIUS = [2], stream = [1] }", "constant 'stream' has the same name as the call's `stream=`; rename it"),
        ("constants = { RADIUS = [2], arch = [1] }", "constant 'arch' has the same name as select()'s `arch=`"),
        (
            'constants = { RADIUS = [2] }\ntypes = { self = ["float32"] }',
            "type parameter 'self' has the same name as the kernel object's `self`",
        ),
        ("constants = { RADIUS = [2], BLOCK = [1] }", "axis 'BLOCK' has the same name as constant BLOCK"),
        ("constants = { float32 = [1] }", "a constant may not be named like a dtype"),
        ("", "unknown name(s) RADIUS in 'n - 2 * RADIUS'; shapes may use the key dims, free dims (`dims`) and constants"),
    ],
)
def test_bad_constants_are_named_with_their_key_path(tmp_path, constants, message):
    root = copy_consumer(tmp_path / "kit")
    (root / "pyproject.toml").write_text(_table(constants))
    with pytest.raises(ConfigError) as info:
        load_project(root)
    assert message in str(info.value)


def test_constants_are_checked_in_shapes_and_geometry_for_every_value(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    (root / "pyproject.toml").write_text(_table("constants = { RADIUS = [2, 4000] }"))
    with pytest.raises(ConfigError, match=r"shape\[0\] of argument 'y': 'n - 2 \* RADIUS' gives -3904, outside"):
        load_project(root)


def test_the_default_violating_a_constraint_names_it_once(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    text = (
        (root / "pyproject.toml")
        .read_text()
        .replace('constraints = ["BLOCK >= 2 * RADIUS"]', 'constraints = ["BLOCK >= 2 * RADIUS", "BLOCK < 200"]')
    )
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_project(root)
    lines = [e for e in info.value.errors if "violates" in e]
    assert lines == [
        "tool.hatch.build.targets.wheel.hooks.autotune.kernels.stencil.default: the default {'BLOCK': 256, 'USE_SMEM': True} violates constraints[1] 'BLOCK < 200'"
    ]


def test_tuning_inputs_and_the_reference_see_the_constants(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    (root / "ref.py").write_text(
        "def halo(x, y, RADIUS):\n    return {'y': sum(x[d:len(x) - 2 * RADIUS + d] for d in range(2 * RADIUS + 1))}\n"
    )
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml")
        .read_text()
        .replace("constants = { RADIUS = [2, 4] }", 'constants = { RADIUS = [2, 4] }\nreference = "ref:halo"')
    )
    spec = load_project(root).kernels["halo_sum"]
    inputs = bucket_inputs(spec, {"RADIUS": 4}, {"n": 4096}, root)
    assert inputs["x"].shape == (4096,) and inputs["y"].shape == (4088,)
    expected = reference_outputs(spec, inputs, root, {"RADIUS": 4})
    assert np.allclose(expected["y"], sum(inputs["x"][d : 4088 + d] for d in range(9)))


def test_an_arch_no_nvrtc_can_target_says_so():
    with pytest.raises(RuntimeError) as info:
        choose_arch((7, 0), ["sm_80", "sm_90"], ["compute_90"])
    assert "NVRTC 13" in str(info.value) and "sm_75 and newer" in str(info.value) and "sm_70 in `archs`" not in str(info.value)
    with pytest.raises(RuntimeError, match="rebuild the wheel with sm_75 in `archs`"):
        choose_arch((7, 5), ["sm_80"], [])


# ---- tuning each instance through the real worker ---------------------------------------------

HALO_TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:RADIUS={{ RADIUS }};BLOCK={{ BLOCK }};SKEW={{ SKEW }}";
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int m)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i >= m) return;
    float acc = {{ 1 if SKEW else 0 }}.0f;
    for (int d = 0; d <= 2 * {{ RADIUS }}; ++d) acc += x[i + d];
    y[i] = acc;
}
"""

HALO_TABLE = """\
[tool.hatch.build.targets.wheel.hooks.autotune]
module = "halopkg.kernels"
archs = ["sm_90"]

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.halo]
template = "halo.cu.j2"
constants = { RADIUS = [1, 2] }
reference = "ref:halo"
args = [
  { name = "x", dtype = "float32", shape = ["n"], intent = "in" },
  { name = "y", dtype = "float32", shape = ["n - 2 * RADIUS"], intent = "out" },
  { name = "m", dtype = "int32", value = "n - 2 * RADIUS" },
]
key = { n = { from = "x", buckets = [5000] } }
space = { BLOCK = [128, 256], SKEW = [false, true] }
default = { BLOCK = 128, SKEW = false }
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
"""


def test_each_constant_value_is_tuned_and_verified_through_the_real_worker(tmp_path):
    from hatch_autotune.lock import LockFile

    root = tmp_path / "halo"
    (root / "src" / "halopkg").mkdir(parents=True)
    (root / "src" / "halopkg" / "__init__.py").write_text("")
    (root / "halo.cu.j2").write_text(HALO_TEMPLATE)
    (root / "ref.py").write_text(
        "def halo(x, y, RADIUS):\n    m = len(x) - 2 * RADIUS\n    return sum(x[d:m + d] for d in range(2 * RADIUS + 1))\n"
    )
    (root / "pyproject.toml").write_text('[project]\nname = "halopkg"\nversion = "0"\n\n' + HALO_TABLE)
    summary = tune_over_standin(root, tmp_path / "cache")
    assert sorted(eid for eid, _ in summary.tuned) == ["halo|RADIUS=1|sm_90|n=5000", "halo|RADIUS=2|sm_90|n=5000"]
    lock = LockFile.load(root / "autotune.lock.json")
    for eid, entry in lock.entries.items():
        status = {(m.config["BLOCK"], m.config["SKEW"]): m.status for m in entry.measurements}
        assert status[(128, True)] == status[(256, True)] == "rejected", (eid, status)  # SKEW is wrong for every RADIUS
        assert entry.config == {"BLOCK": 256, "SKEW": False}  # the verified, (synthetically) fastest


def _section(text: str, kernel: str) -> tuple[int, int]:
    start = text.index(f"kernels.{kernel}]")
    end = text.find("\n[", start)
    return start, end if end != -1 else len(text)


def test_names_a_call_or_select_cannot_take_by_keyword_are_refused(tmp_path):
    root = copy_consumer(tmp_path / "kit")
    text = (root / "pyproject.toml").read_text()
    a, b = _section(text, "halo_sum")
    renamed_arg = text[:a] + text[a:b].replace('{ name = "y"', '{ name = "stream"') + text[b:]
    a, b = _section(text, "stencil")
    stencil = text[a:b].replace("n = { from", "arch = { from").replace('["n"]', '["arch"]').replace('value = "n"', 'value = "arch"')
    renamed_dim = text[:a] + stencil.replace("cdiv(n,", "cdiv(arch,") + text[b:]
    for table, message in (
        (renamed_arg, "kernels.halo_sum: argument 'stream' has the same name as the call's `stream=`; rename it"),
        (renamed_dim, "kernels.stencil: key dim 'arch' has the same name as select()'s `arch=`; rename it"),
    ):
        (root / "pyproject.toml").write_text(table)
        with pytest.raises(ConfigError) as info:
            load_project(root)
        assert [e for e in info.value.errors if message in e], info.value.errors


def test_header_bounds_and_unreadable_headers_are_named(tmp_path):
    from hatch_autotune.compile.render import MAX_HEADER_MIB, MAX_HEADERS

    many = "".join(f'#include "h{i}.cuh"\n' for i in range(MAX_HEADERS + 1))
    cases = [
        (
            {"cuda/many.cuh": many, **{f"cuda/h{i}.cuh": "" for i in range(MAX_HEADERS + 1)}},
            '#include "many.cuh"',
            f"more than {MAX_HEADERS} headers reached by #include",
        ),
        (
            {"cuda/big.cuh": "/" * ((MAX_HEADER_MIB << 20) + 1)},
            '#include "big.cuh"',
            f"is larger than {MAX_HEADER_MIB} MiB, the most a header may have",
        ),
    ]
    for n, (files, head, message) in enumerate(cases):
        root = _kit_with(tmp_path / str(n), head, files)
        with pytest.raises(TemplateError) as info:
            render_kernel(load_project(root).kernels["halo_sum"])
        assert message in str(info.value) and "(kernel halo_sum, RADIUS=2, BLOCK=128)" in str(info.value)
    root = _kit_with(tmp_path / "binary", '#include "blob.cuh"')
    (root / "cuda" / "blob.cuh").write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(TemplateError, match=r"cannot read .*blob\.cuh"):
        render_kernel(load_project(root).kernels["halo_sum"])


def test_too_many_instances_are_refused_before_anything_is_rendered(tmp_path):
    from hatch_autotune.declare.config import MAX_INSTANCES

    root = copy_consumer(tmp_path / "kit")
    many = ", ".join(str(2 * i) for i in range(1, 41))
    (root / "pyproject.toml").write_text(_table(f"constants = {{ RADIUS = [2], A = [{many}], B = [{many}] }}"))
    with pytest.raises(ConfigError) as info:
        load_project(root)
    assert (
        f"the type parameters and constants make 1,600 instances, each rendered, compiled and tuned apart; at most {MAX_INSTANCES:,} are allowed"
        in str(info.value)
    )
