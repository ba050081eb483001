"""Arch-specific (`sm_XYa`) and family (`sm_XYf`) targets: which archs a project may declare
(checked against what the real NVRTC compiles), which binary of a wheel runs on a device and
why, which target archs a build machine's GPU tunes, and what `show` says about it."""

from __future__ import annotations

import importlib
import sys

import pytest
from conftest import build, load_project, write_tiny_project
from cuda_standin import cubin_sm
from sass import _run_on_cubin, missing_tools

from hatch_autotune import cli
from hatch_autotune.cli import views
from hatch_autotune.compile.nvrtc import CompileJob, check_archs, compile_one, supported_archs
from hatch_autotune.declare.config import ConfigError
from hatch_autotune.declare.validate import BAD, v_arch
from hatch_autotune.inspection.model import Row, Source, binaries_lines
from hatch_autotune.lock import Bucket
from hatch_autotune.plan.devices import Gpu, tunable_targets, tuning_gpus
from hatch_autotune.plan.planner import ptx_archs
from hatch_autotune.runtime.selection import REASONS, SUFFIX_FLOOR, binary_reason, choose_arch, runs_on, runs_where
from hatch_autotune.wheel.payload import write_package

TRIVIAL = 'extern "C" __global__ void k() {}'
WGMMA = 'extern "C" __global__ void k() { asm volatile("wgmma.fence.sync.aligned;"); }'  # Hopper's sm_90a only
TMA = (  # a TMA copy: plain sm_90 has it
    'extern "C" __global__ void k(unsigned long long desc, unsigned int smem, unsigned int bar) {'
    ' asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];"'
    ' :: "r"(smem), "l"(desc), "r"(0), "r"(bar) : "memory"); }'
)
TCGEN05 = 'extern "C" __global__ void k() { asm volatile("tcgen05.fence::before_thread_sync;"); }'  # 10.x's 'a' and 'f'


# ---- the run-time rule -------------------------------------------------------------------------

RUNS = [
    # arch, device, runs
    ("sm_90a", (9, 0), True),
    ("sm_90a", (10, 0), False),
    ("sm_100a", (10, 3), False),
    ("sm_103a", (10, 3), True),
    ("sm_100f", (10, 0), True),
    ("sm_100f", (10, 3), True),
    ("sm_103f", (10, 0), False),
    ("sm_103f", (10, 3), True),
    ("sm_100f", (12, 0), False),  # a family is one major
    ("sm_120f", (12, 1), True),
    ("sm_80", (8, 6), True),
    ("sm_86", (8, 0), False),
    ("sm_80", (9, 0), False),  # a cubin never crosses majors
    ("compute_80", (12, 0), True),  # plain PTX runs forward
    ("compute_90", (8, 9), False),
    ("compute_90a", (9, 0), True),
    ("compute_90a", (10, 0), False),
    ("compute_100f", (10, 3), True),
    ("compute_100f", (11, 0), False),
]


@pytest.mark.parametrize("arch,device,runs", RUNS)
def test_runs_on(arch, device, runs):
    assert runs_on(arch, device) is runs


CHOICES = [
    # device, cubins, PTX, (binary, kind, reason)
    ((9, 0), ["sm_80", "sm_90"], [], ("sm_90", "cubin", "exact")),
    ((9, 0), ["sm_90", "sm_90a"], [], ("sm_90a", "cubin", "arch-specific")),
    ((8, 6), ["sm_80", "sm_90a"], [], ("sm_80", "cubin", "same-major older minor")),
    ((8, 9), ["sm_80", "sm_86", "sm_90"], [], ("sm_86", "cubin", "same-major older minor")),
    ((10, 0), ["sm_100", "sm_100a", "sm_100f"], [], ("sm_100a", "cubin", "arch-specific")),
    ((10, 3), ["sm_100", "sm_100a", "sm_100f"], [], ("sm_100f", "cubin", "family")),
    ((10, 3), ["sm_100f", "sm_103f"], [], ("sm_103f", "cubin", "family")),
    ((10, 0), ["sm_100f", "sm_103f"], [], ("sm_100f", "cubin", "family")),
    ((10, 3), ["sm_103", "sm_100f"], [], ("sm_103", "cubin", "exact")),  # its own compute capability first (DESIGN.md)
    ((10, 3), ["sm_103", "sm_103f", "sm_100f"], [], ("sm_103f", "cubin", "family")),  # then, at that minor, the most specific
    ((10, 3), ["sm_100f", "sm_103a"], [], ("sm_103a", "cubin", "arch-specific")),
    ((10, 3), ["sm_100", "sm_100a"], [], ("sm_100", "cubin", "same-major older minor")),
    ((12, 1), ["sm_100f", "sm_120f"], [], ("sm_120f", "cubin", "family")),
    ((12, 0), ["sm_90", "sm_100f"], ["compute_90"], ("compute_90", "ptx", "PTX JIT")),
    ((10, 0), ["sm_80", "sm_90a"], ["compute_90"], ("compute_90", "ptx", "PTX JIT")),
    ((10, 3), ["sm_80"], ["compute_100f"], ("compute_100f", "ptx", "PTX JIT")),
    ((9, 0), ["sm_80"], ["compute_80", "compute_90a"], ("compute_90a", "ptx", "PTX JIT")),
    ((10, 0), [], ["compute_80", "compute_90a"], ("compute_80", "ptx", "PTX JIT")),
]


@pytest.mark.parametrize("device,cubins,ptx,expected", CHOICES)
def test_choose_arch_takes_the_most_specific_binary(device, cubins, ptx, expected):
    binary, kind = choose_arch(device, cubins, ptx)
    assert (binary, kind, binary_reason(binary, device)) == expected
    assert runs_on(binary, device)
    assert binary_reason(binary, device) in REASONS


NO_BINARY = [
    # device, cubins, PTX, what the error says
    ((10, 3), ["sm_100a"], [], r"compute capability 10\.3 \(sm_103\): it has cubins for sm_100a and PTX for no arch"),
    ((10, 0), ["sm_103f"], [], r"rebuild the wheel with sm_100 in `archs` \(an 'a' binary runs only on its own"),
    ((12, 0), ["sm_100f"], ["compute_100f"], r"cubins for sm_100f and PTX for compute_100f; rebuild the wheel with sm_120"),
    ((8, 0), ["sm_86"], [], r"compute capability 8\.0 \(sm_80\).*rebuild the wheel with sm_80 in `archs`$"),
]


@pytest.mark.parametrize("device,cubins,ptx,message", NO_BINARY)
def test_no_binary_for_the_device_names_it_the_wheel_and_the_fix(device, cubins, ptx, message):
    with pytest.raises(RuntimeError, match=message):
        choose_arch(device, cubins, ptx)


def test_the_suffix_rule_is_said_only_where_it_explains_the_miss():
    with pytest.raises(RuntimeError) as info:
        choose_arch((12, 0), ["sm_90a", "sm_100f"], [])
    assert "rebuild the wheel with sm_120 in `archs`" in str(info.value) and "'a' binary" not in str(info.value)


def test_where_each_binary_runs_in_words():
    assert runs_where("sm_80") == "sm_80: 8.0 and later 8.x"
    assert runs_where("sm_90a") == "sm_90a: 9.0 only (arch-specific)"
    assert runs_where("sm_100f") == "sm_100f: 10.0 and later 10.x (family)"
    assert runs_where("compute_90") == "compute_90: 9.0 and later (PTX JIT)"
    assert runs_where("compute_100f") == "compute_100f: 10.0 and later 10.x (family, PTX JIT)"
    with pytest.raises(ValueError, match="not a CUDA arch: 'sm_90x'"):
        runs_where("sm_90x")


def test_ptx_is_made_from_the_newest_plain_arch_only():
    assert ptx_archs(("sm_80", "sm_90", "sm_90a", "sm_100f")) == {"sm_90": "compute_90"}
    assert ptx_archs(("sm_90a", "sm_100a", "sm_100f")) == {}


# ---- what a project may declare ----------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_75", "sm_90a", "sm_100a", "sm_100f", "sm_103f", "sm_110f", "sm_120a", "sm_121f"])
def test_declared_archs_accepted(arch):
    errors: list[str] = []
    assert v_arch(arch, "archs[0]", errors) == arch and errors == []


@pytest.mark.parametrize(
    "arch,message",
    [
        (
            "sm_80a",
            "expected an arch-specific 'a' target of sm_90 or newer (NVRTC takes 'a' from sm_90a up); for compute capability 8.0 use 'sm_80', got",
        ),
        ("sm_89a", "for compute capability 8.9 use 'sm_89', got"),
        (
            "sm_90f",
            "expected a family 'f' target of sm_100 or newer (NVRTC takes 'f' from sm_100f up); for compute capability 9.0 use 'sm_90' or 'sm_90a', got",
        ),
        ("sm_86f", "family 'f' target of sm_100 or newer"),
        ("sm_70", "expected an arch NVRTC 13 can target (sm_75 or newer)"),
        ("sm_90x", "expected a CUDA arch 'sm_XY', 'sm_XYa' (arch-specific) or 'sm_XYf' (family), e.g. 'sm_80', 'sm_90a' or 'sm_100f'"),
        ("sm_90af", "expected a CUDA arch 'sm_XY'"),
        ("sm_90A", "expected a CUDA arch 'sm_XY'"),
        ("compute_90a", "expected a CUDA arch 'sm_XY'"),
        (90, "expected a CUDA arch 'sm_XY'"),
    ],
)
def test_declared_archs_refused_with_what_is_expected(arch, message):
    errors: list[str] = []
    assert v_arch(arch, "tool.hatch.build.hooks.autotune.archs[0]", errors) is BAD
    assert len(errors) == 1 and errors[0].startswith("tool.hatch.build.hooks.autotune.archs[0]: ") and message in errors[0], errors


def test_the_environment_variable_takes_the_same_archs(tmp_path):
    root = write_tiny_project(tmp_path / "tiny")
    assert load_project(root, env={"HATCH_AUTOTUNE_ARCHS": "sm_90a, sm_100f,sm_120a"}).archs == ("sm_90a", "sm_100f", "sm_120a")
    with pytest.raises(ConfigError) as info:
        load_project(root, env={"HATCH_AUTOTUNE_ARCHS": "sm_90,sm_90f,sm_80a"})
    text = str(info.value)
    assert "environment variable HATCH_AUTOTUNE_ARCHS[1]: expected a family 'f' target of sm_100" in text
    assert "environment variable HATCH_AUTOTUNE_ARCHS[2]: expected an arch-specific 'a' target of sm_90" in text


def _nvrtc_compiles(arch: str) -> bool:
    ok, binary, _ = compile_one(CompileJob(TRIVIAL, arch, "k"))
    return ok and bool(binary)


def test_the_declaration_rule_is_what_the_installed_nvrtc_compiles():
    """For every arch this NVRTC supports, each suffix is accepted exactly when NVRTC compiles it
    (NVRTC 13.5: 'a' from sm_90, 'f' from sm_100): a newer NVRTC that moves a floor fails here."""
    for number in supported_archs():
        for suffix in ("", *SUFFIX_FLOOR):
            arch = f"sm_{number}{suffix}"
            errors: list[str] = []
            declared = v_arch(arch, "archs[0]", errors) is not BAD
            assert declared == _nvrtc_compiles(arch), (arch, errors)
    check_archs(["sm_90a", "sm_100f", "sm_103a", "sm_120f"])  # the compiler's own check strips the suffix


# ---- real NVRTC builds of 'a' and 'f' targets -------------------------------------------------


def _cuobjdump_elf(cubin: bytes) -> list[str]:
    return _run_on_cubin("cuobjdump", ["-elf"], cubin).splitlines()


def test_arch_specific_instructions_need_their_target():
    """wgmma needs sm_90a; tcgen05 needs sm_100a or sm_100f (and is not in 12.x); a TMA copy
    needs no suffix (docs/archs.md says so)."""
    for source, archs, refusal in (
        (WGMMA, {"sm_90": False, "sm_90a": True, "sm_100f": False}, "not supported on .target"),
        (
            TCGEN05,
            {"sm_100": False, "sm_100a": True, "sm_100f": True, "sm_103f": True, "sm_110f": True, "sm_120f": False},
            "not supported on .target",
        ),
        (TMA, {"sm_80": False, "sm_90": True, "sm_100": True}, "requires .target sm_90 or higher"),
    ):
        for arch, compiles in archs.items():
            ok, _, log = compile_one(CompileJob(source, arch, "k"))
            assert ok is compiles, (arch, log)
            if not ok:
                assert refusal in log


@pytest.mark.parametrize(
    "arch,source", [("sm_90a", WGMMA), ("sm_100a", TCGEN05), ("sm_100f", TCGEN05), ("sm_103f", TCGEN05), ("sm_120a", TRIVIAL)]
)
def test_a_and_f_targets_compile_to_cubins_of_their_arch(arch, source):
    ok, binary, log = compile_one(CompileJob(source, arch, "k"))
    assert ok and binary, log
    number = int(arch[3:-1])
    assert cubin_sm(binary) == number  # the ELF header's SM; the suffix is elsewhere
    if missing_tools():
        pytest.skip(missing_tools())
    lines = _cuobjdump_elf(binary)
    header = lines[1]
    assert f"-arch {arch}" in "\n".join(lines)  # the toolkit note records the target
    if arch.endswith("a"):
        assert f"sm={number}a," in header  # marked arch-specific: only this compute capability loads it
    else:
        assert f"sm={number}," in header  # NVRTC 13.5 writes the family cubin's header like a plain one


# ---- the build side: which target archs a GPU tunes ---------------------------------------------


@pytest.mark.parametrize(
    "gpu,tunes,not_tunes",
    [
        ("sm_90", ["sm_90", "sm_90a"], ["sm_80", "sm_100f", "sm_100a"]),
        ("sm_103", ["sm_103", "sm_103a", "sm_103f", "sm_100f"], ["sm_100a", "sm_100", "sm_90a"]),
        ("sm_100", ["sm_100", "sm_100a", "sm_100f"], ["sm_103f", "sm_103a"]),
        ("sm_86", ["sm_86"], ["sm_80"]),  # sm_80 runs on 8.6, but its entries are the 8.0 GPU's
        ("sm_121", ["sm_121", "sm_120f"], ["sm_120", "sm_120a"]),
    ],
)
def test_which_target_archs_a_gpu_tunes(gpu, tunes, not_tunes):
    g = Gpu(0, gpu, None)
    assert [t for t in tunes if g.can_tune(t)] == tunes
    assert [t for t in not_tunes if g.can_tune(t)] == []
    assert all(runs_on(t, g.cc) for t in tunes)  # what it tunes, it also runs


def test_tuning_gpus_are_the_nearest_that_can():
    b200, b300a, b300b, h200 = Gpu(0, "sm_100", "B200"), Gpu(1, "sm_103", "B300"), Gpu(2, "sm_103", "B300"), Gpu(3, "sm_90", "H200")
    gpus = [b300a, h200, b200, b300b]
    assert tuning_gpus("sm_100f", gpus) == [b200]  # the family's own minor first: one kind of GPU per target
    assert tuning_gpus("sm_100f", [b300a, h200, b300b]) == [b300a, b300b]
    assert tuning_gpus("sm_103a", gpus) == [b300a, b300b]
    assert tuning_gpus("sm_100a", [b300a, b300b]) == []
    assert tuning_gpus("sm_90a", gpus) == [h200]
    targets = ("sm_80", "sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_120")
    assert tunable_targets(targets, [b300a, h200]) == ("sm_90", "sm_90a", "sm_100f")
    assert tunable_targets(targets, []) == ()


# ---- select() and show ------------------------------------------------------------------------


@pytest.fixture
def suffixed_package(tmp_path):
    """The tiny project built for sm_90, sm_90a and sm_100f (PTX from sm_90), its generated
    package importable from tmp_path/site."""
    root = write_tiny_project(tmp_path / "tiny")
    env = {"HATCH_AUTOTUNE_ARCHS": "sm_90,sm_90a,sm_100f", "HATCH_AUTOTUNE_MODE": "offline"}
    result = build(root, tmp_path / "cache", env=env)
    out = tmp_path / "site" / "tinypkg" / "kernels"
    out.parent.mkdir(parents=True)
    (out.parent / "__init__.py").write_text("")
    write_package(out, load_project(root, env), result)
    sys.path.insert(0, str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("tinypkg")]:
        del sys.modules[name]
    yield importlib.import_module("tinypkg.kernels")
    sys.path.remove(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("tinypkg")]:
        del sys.modules[name]


def test_select_says_which_binary_runs_and_why(suffixed_package):
    scale = suffixed_package.scale
    said = {}
    for device in ("9.0", "10.0", "10.3", "12.0"):
        sel = scale.select(arch=device, n=4096)
        said[device] = (sel.arch, sel.binary, sel.reason)
    assert said == {
        "9.0": ("sm_90a", "sm_90a", "arch-specific"),
        "10.0": ("sm_100f", "sm_100f", "family"),
        "10.3": ("sm_100f", "sm_100f", "family"),
        "12.0": ("sm_90", "compute_90", "PTX JIT"),
    }
    assert "reason='family'" in repr(scale.select(arch="sm_103", n=4096))
    assert cubin_sm(scale.binary(scale.select(arch="sm_90", n=1))) == 90
    with pytest.raises(RuntimeError, match=r"compute capability 8\.9 \(sm_89\).*cubins for sm_90, sm_90a, sm_100f"):
        scale.select(arch="sm_89", n=1)


def _row(arch: str) -> Row:
    return Row("k", "-", arch, Bucket.from_values(["n"], [1024]), {"BLOCK": 128}, False)


RULE = (
    "a device runs, of the binaries that run on it, the one of the newest minor not above its own (its own first), "
    "at that minor arch-specific, else family, else plain; else PTX (select() names the one and why)"
)


def test_show_says_where_each_binary_runs(monkeypatch, capsys):
    rows = [_row(a) for a in ("sm_100f", "sm_90a", "sm_80")]
    src = Source("x.whl", "wheel", {r.eid: r for r in rows}, ["k"], ptx={"sm_80": "compute_80"})
    monkeypatch.setattr(views, "load_source", lambda arg: src)

    assert cli.main(["show", "x.whl"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = lines.index("x.whl (wheel): 3 entries, 0 tuned, 3 default")
    assert lines[at + 1 : at + 3] == [
        "where the binaries run: sm_80: 8.0 and later 8.x; compute_80: 8.0 and later (PTX JIT); sm_90a: 9.0 only (arch-specific); "
        "sm_100f: 10.0 and later 10.x (family)",
        RULE,
    ]


def test_binaries_lines_leave_out_what_they_cannot_read():
    assert binaries_lines([_row("sm_90"), _row("bogus")], {"sm_90": "compute_9x"}) == [
        "where the binaries run: sm_90: 9.0 and later 9.x",
        RULE,
    ]
    assert binaries_lines([_row("bogus")], {}) == []
    assert binaries_lines([], {}) == []
