"""The showcase kernels' machine code, checked without a GPU: example_pkg's binaries compiled by
the project's own stage (real NVRTC, the build's compile jobs) and disassembled with the CUDA
binary utilities from PyPI (tests/sass.py), for every arch the example targets.

Which binaries: per kernel, type instance and arch, the declared default and the lock's winners
that are still current for the template (the build's own rule: Plan.winner_index, so a stale
entry, whose checksum no longer matches the rendered space, is left out, as the build leaves it
out), and the fixed SAMPLES of each row below. A test id says which one it is: `default`,
`winner`, `default+winner` or `sample`.

What they must show: GENERAL for every binary (no local memory, no stack, registers that let the
block launch), and each kernel's row of TABLE: instructions that must or must not appear (the
128-bit global and shared accesses the templates are written for) and the hot loop's FFMA count
and density. The tests at the end prove each check can fail, so that none of them is vacuous.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import sass
from conftest import EXAMPLE, load_project, threads_per_block

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import CompileJob, compile_all, compile_one
from hatch_autotune.declare.kernel import KernelSpec
from hatch_autotune.lock import LockEntry, LockFile
from hatch_autotune.plan.planner import Plan, make_plan

MISSING = sass.missing_tools()
needs_tools = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

Env = Mapping[str, Any]  # a config's axes, its type parameters (T, T_size), arch ('sm_90') and sm (90)

# --- the table -----------------------------------------------------------------------------

MAX_REGISTERS = 255  # per thread, any arch the example targets
REGISTER_FILE = 65536  # 32-bit registers per block (and per SM) on sm_80 and sm_90


@dataclass(frozen=True)
class Expect:
    """One property of a kernel's binaries, for the configs `when` picks (given the Env)."""

    why: str  # what the design relies on: said when the property does not hold
    when: Callable[[Env], bool] = lambda env: True
    has: tuple[str, ...] = ()  # instruction patterns that must appear (sass.Instruction.matches)
    lacks: tuple[str, ...] = ()  # and that must not
    hot_loop_density: float | Callable[[Env], float] | None = None  # the hot loop's FFMA / instructions at least this
    hot_loop_ffma: Callable[[Env], int] | None = None  # and at least this many FFMA in it


@dataclass(frozen=True)
class Row:
    """A kernel's expectations and the configs checked besides its default and current winners.
    A sample is a partial config: axes not named take the default's values, type parameters and
    constants not named mean every type instance, an `arch` not named every arch. `pending`: the row's properties are not expected to hold
    yet (xfail, not strict: an XPASS says it is time to clear it)."""

    kernel: str
    expect: tuple[Expect, ...]
    samples: tuple[Mapping[str, Any], ...] = ()
    pending: str | None = None


TABLE: dict[str, Row] = {
    row.kernel: row
    for row in (
        Row(
            "saxpy",
            expect=(
                Expect(
                    "VEC elements of 16 bytes move as one 128-bit access",
                    when=lambda env: env["VEC"] * env["T_size"] == 16,
                    has=("LDG.E.128", "STG.E.128"),
                ),
                Expect(
                    "VEC=1 float32 is the scalar path: no 128-bit global access",
                    when=lambda env: env["T"] == "float32" and env["VEC"] == 1,
                    lacks=("LDG.128", "STG.128"),
                ),
            ),
            samples=(
                {"T": "float32", "BLOCK": 128, "VEC": 4, "ITEMS": 4},
                {"T": "float32", "BLOCK": 1024, "VEC": 2, "ITEMS": 4},
                {"T": "float16", "BLOCK": 512, "VEC": 4, "ITEMS": 2},
            ),
        ),
        Row(
            "row_softmax",
            expect=(
                Expect(
                    "VEC=4 reads and writes rows as float4",
                    when=lambda env: env.get("VEC") == 4,
                    has=("LDG.E.128", "STG.E.128"),
                ),
            ),
            samples=(
                {"BLOCK": 128, "VEC": 4, "ITEMS": 8, "ROWS": 4},
                {"BLOCK": 64, "VEC": 2, "ITEMS": 2, "ROWS": 1},
                {"BLOCK": 1024, "VEC": 1, "ITEMS": 8, "ROWS": 1},
            ),
        ),
        Row(
            "sgemm",
            expect=(
                Expect(
                    "16-byte cp.async global -> shared, float4 shared loads, an FFMA-dense main loop",
                    when=lambda env: env["sm"] >= 80,
                    has=("LDGSTS.128", "LDS.128"),
                    hot_loop_density=lambda env: sgemm_density_floor(env),
                    hot_loop_ffma=lambda env: env["TM"] * env["TN"] * min(env["UNROLL"], env["BK"]),  # the unrolled steps of k
                ),
                Expect(
                    "split-K: the cluster's barriers and 8-byte loads of the other blocks' partial tiles",
                    when=lambda env: env["SPLITK"] > 1,
                    has=("UCGABAR_ARV", "UCGABAR_WAIT", "LD.E.64"),
                    lacks=("LDL", "STL"),
                ),
            ),
            samples=(
                {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "STAGES": 4, "UNROLL": 4},
                {"BM": 128, "BN": 64, "BK": 8, "WM": 32, "WN": 32, "TM": 8, "TN": 4, "STAGES": 4, "UNROLL": 4},
                {"BM": 256, "BN": 64, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "STAGES": 4, "UNROLL": 32},
                # split-K over a cluster of 8 (sm_90 and newer)
                {
                    "arch": "sm_90",
                    "BM": 64,
                    "BN": 64,
                    "BK": 16,
                    "WM": 32,
                    "WN": 32,
                    "TM": 4,
                    "TN": 8,
                    "STAGES": 3,
                    "UNROLL": 32,
                    "SPLITK": 8,
                },
            ),
        ),
        Row(
            "gemm",
            expect=(
                Expect(
                    "16-byte cp.async global -> shared, ldmatrix, tensor-core MMAs with float accumulation",
                    when=lambda env: not env["WGMMA"],
                    has=("LDGSTS.128", "LDSM.16", "HMMA.16816.F32"),
                    lacks=("LDL", "STL"),
                ),
                Expect(
                    "k-contiguous tiles (A row-major, B = W.T) are read with plain ldmatrix",
                    when=lambda env: not env["WGMMA"] and (bool(env["A_unit_stride"]) or not env["B_unit_stride"]),
                    has=("LDSM.16.M88.4",),
                ),
                Expect(
                    "the other tiles (A column-major, B row-major) with ldmatrix .trans",
                    when=lambda env: not env["WGMMA"] and (not env["A_unit_stride"] or bool(env["B_unit_stride"])),
                    has=("LDSM.16.MT88.4",),
                ),
                Expect(
                    "sm_90a: warpgroup MMAs fed by TMA tile loads through mbarriers, nothing of the mma.sync path",
                    when=lambda env: bool(env["WGMMA"]),
                    has=("HGMMA", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "SYNCS.ARRIVE.TRANS64", "WARPGROUP.ARRIVE"),
                    lacks=("LDL", "STL", "HMMA", "LDGSTS", "LDSM"),
                ),
                Expect(
                    "split-K: the cluster's barriers and 8-byte loads of the other blocks' partial tiles",
                    when=lambda env: env["SPLITK"] > 1,
                    has=("UCGABAR_ARV", "UCGABAR_WAIT", "LD.E.64"),
                ),
            ),
            samples=(
                {"T": "bfloat16", "BM": 16, "BN": 128, "BK": 64, "WM": 16, "WN": 32, "STAGES": 3},
                {"T": "float16", "BM": 256, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4},
                # split-K over a cluster of 4 (sm_90 and newer)
                {"T": "bfloat16", "arch": "sm_90", "BM": 16, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "STAGES": 2, "SPLITK": 4},
                # the sm_90a path (its instance: A row-major, B = W.T; its arch only)
                {
                    "T": "bfloat16",
                    "A_unit_stride": True,
                    "B_unit_stride": False,
                    "arch": "sm_90a",
                    "WGMMA": 1,
                    "BM": 128,
                    "BN": 256,
                    "BK": 64,
                    "WM": 64,
                    "WN": 64,
                    "STAGES": 4,
                },
                {
                    "T": "float16",
                    "A_unit_stride": True,
                    "B_unit_stride": False,
                    "arch": "sm_90a",
                    "WGMMA": 1,
                    "BM": 256,
                    "BN": 128,
                    "BK": 64,
                    "WM": 128,
                    "WN": 64,
                    "STAGES": 3,
                },
            ),
        ),
        *(
            Row(
                kernel,
                expect=(Expect("the vector path moves rows 16 bytes at a time", has=("LDG.E.128", "STG.E.128")),),
                samples=({"BLOCK": 128, "ROWS": 4, "ITEMS": 8}, {"BLOCK": 1024, "ROWS": 1, "ITEMS": 2}),
            )
            for kernel in ("rmsnorm", "add_rmsnorm")
        ),
    )
}


def sgemm_density_floor(env: dict) -> float:
    """The least FFMA share of SGEMM's hot loop. Per step of k a lane issues TM*TN FFMAs fed by
    (TM+TN)/4 LDS.128, the ideal share. A partial unroll makes the hot loop that step alone
    (measured 0.96-0.98 of the ideal over the space, NVRTC 13.5, sm_90); a full unroll makes it
    the whole slice, with its cp.async copies, the wait and the barrier (0.80-0.93)."""
    ffma = env["TM"] * env["TN"]
    ideal = ffma / (ffma + (env["TM"] + env["TN"]) / 4)
    return (0.95 if env["UNROLL"] < env["BK"] else 0.78) * ideal


# --- the checks ----------------------------------------------------------------------------


def general_problems(usage: sass.Usage, code: Sequence[sass.Instruction], threads: int, bounds: tuple[int, int] | None) -> list[str]:
    """What breaks the rules every binary keeps: no local memory (neither LOCAL nor a stack
    frame nor LDL/STL: a spill or a local array), registers within 255 and within the register
    file for the block, and, under `__launch_bounds__(N, minBlocks)`, a block of at most N
    threads and registers within 65536 / (N * minBlocks)."""
    out = []
    if usage.local:
        out.append(f"LOCAL:{usage.local}: local memory per thread")
    if usage.stack:
        out.append(f"STACK:{usage.stack}: a stack frame per thread (a local array or a spill)")
    local_ops = {op: n for op, n in sass.opcodes(code).items() if op.split(".")[0] in ("LDL", "STL")}
    if local_ops:
        out.append(f"local memory instructions {local_ops}")
    if usage.registers > MAX_REGISTERS:
        out.append(f"REG:{usage.registers} > {MAX_REGISTERS}")
    if usage.registers * threads > REGISTER_FILE:
        out.append(f"REG:{usage.registers} x {threads} threads = {usage.registers * threads} > {REGISTER_FILE}: the block cannot launch")
    if bounds is not None:
        n, min_blocks = bounds
        if threads > n:
            out.append(f"the block has {threads} threads, more than __launch_bounds__({n}): the launch fails")
        cap = REGISTER_FILE // (n * min_blocks)
        if usage.registers > cap:
            out.append(
                f"REG:{usage.registers} > {REGISTER_FILE} / ({n} x {min_blocks}) = {cap}, what __launch_bounds__({n}, {min_blocks}) allows"
            )
    return out


def expect_problems(expect: Expect, env: Env, code: Sequence[sass.Instruction]) -> list[str]:
    """What of one Expect the code does not show (whatever its `when` says)."""
    out = []
    for pattern in expect.has:
        if not sass.count(code, pattern):
            out.append(f"no {pattern}")
    for pattern in expect.lacks:
        if n := sass.count(code, pattern):
            out.append(f"{n} x {pattern}")
    if expect.hot_loop_density is not None or expect.hot_loop_ffma is not None:
        loop = sass.hot_loop(code)
        if loop is None:
            out.append("no loop with an FFMA")
        else:
            where = f"hot loop {loop.start:#x}..{loop.end:#x}: {loop.ffma} FFMA of {loop.size} instructions"
            least_density = expect.hot_loop_density(env) if callable(expect.hot_loop_density) else expect.hot_loop_density
            if least_density is not None and loop.ffma_density < least_density:
                out.append(f"{where}, density {loop.ffma_density:.3f} < {least_density}")
            if expect.hot_loop_ffma is not None and loop.ffma < (least := expect.hot_loop_ffma(env)):
                out.append(f"{where}, fewer than {least} FFMA")
    return [f"{p} ({expect.why})" for p in out]


def summary(code: Sequence[sass.Instruction]) -> str:
    """The memory and FFMA instructions of the code, counted: what a failure shows."""
    wanted = ("LDG", "STG", "LDS", "STS", "LDGSTS", "LDL", "STL", "FFMA")
    return str({op: n for op, n in sass.opcodes(code).items() if op.split(".")[0] in wanted})


# --- the binaries --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One binary to check: a config of a type instance on an arch, and why it is checked."""

    kernel: str
    types: tuple[tuple[str, Any], ...]
    config: tuple[tuple[str, Any], ...]
    arch: str
    roles: tuple[str, ...]  # default, winner, sample
    index: int | None  # in the instance's canonical configs; None: a sample outside the space
    problem: str | None = None  # why a sample cannot be checked

    @property
    def id(self) -> str:
        types = "".join(f"-{v}" for _, v in self.types)
        config = ",".join(f"{k}={v}" for k, v in self.config)
        return f"{self.kernel}{types}-{self.arch}-{'+'.join(self.roles)}-{config}"

    def env(self, spec: KernelSpec) -> dict[str, Any]:
        return {
            **dict(self.config),
            **dict(self.types),
            **spec.type_env(dict(self.types)),
            "arch": self.arch,
            "sm": int("".join(ch for ch in self.arch.split("_")[1] if ch.isdigit())),
        }


@functools.cache
def example_plan() -> Plan:
    """example_pkg rendered and planned for its archs, with its lock read (the build's view)."""
    project = load_project(EXAMPLE)
    return make_plan(project, project.archs or (), log=lambda line: None)


def cases_of(plan: Plan) -> list[Case]:
    """The cases of a plan: per instance and arch its default, its lock's current winners, and
    the samples of its kernel's row."""
    out: list[Case] = []
    for inst in plan.instances:
        spec, types = inst.spec, inst.types
        for arch in plan.archs:
            roles: dict[int, list[str]] = {inst.default_index: ["default"]}
            for point in inst.points[arch]:
                index = plan.winner_index(inst, point)
                if index is not None and "winner" not in roles.setdefault(index, []):
                    roles[index].append("winner")
            samples: list[Case] = []
            row = TABLE.get(spec.name)
            for sample in row.samples if row else ():
                if any(sample.get(t, v) != v for t, v in types.items()) or sample.get("arch", arch) != arch:
                    continue  # another instance's, or another arch's (a sample may name the one arch it runs on)
                config = {**spec.default, **{k: v for k, v in sample.items() if k not in spec.types and k not in types and k != "arch"}}
                index = inst.index_of(config)
                if index is None:
                    unknown = sorted(set(config) - set(spec.space))
                    why = f"names {', '.join(unknown)}, not an axis" if unknown else "is not in the space (or breaks a constraint)"
                    problem = f"TABLE[{spec.name!r}] sample {dict(sample)} {why} of kernel {spec.name}: update the sample"
                    samples.append(Case(spec.name, tuple(types.items()), tuple(config.items()), arch, ("sample",), None, problem))
                elif index not in roles:
                    roles[index] = ["sample"]
            for index in sorted(roles):
                out.append(Case(spec.name, tuple(types.items()), inst.variants[index].config, arch, tuple(roles[index]), index))
            out.extend(samples)
    return out


CASES = cases_of(example_plan())


@dataclass(frozen=True)
class Binary:
    """A case's compiled binary, read: its instructions, resource usage and launch bounds."""

    case: Case
    code: tuple[sass.Instruction, ...]
    usage: sass.Usage
    threads: int  # per block, the most over the kernel's buckets
    bounds: tuple[int, int] | None


@pytest.fixture(scope="module")
def binaries(session_cache) -> dict[str, Binary]:
    """Every case compiled in one batch (the session's compile cache) and read by the tools,
    two at a time: case id -> Binary."""
    if MISSING:
        pytest.skip(MISSING)
    plan = example_plan()
    instances = {(inst.spec.name, tuple(inst.types.items())): inst for inst in plan.instances}
    todo = [(c, c.index) for c in CASES if c.index is not None]
    jobs = [instances[(c.kernel, c.types)].compile_job(index, c.arch) for c, index in todo]
    results = compile_all(jobs, CompileCache(session_cache))
    failed = [f"{c.id}:\n{r.log[-2000:]}" for (c, _), r in zip(todo, results) if not r.ok]
    assert not failed, "did not compile:\n" + "\n".join(failed)

    def read(item: tuple[tuple[Case, int], Any]) -> Binary:
        (case, index), result = item
        inst = instances[(case.kernel, case.types)]
        spec, cubin = inst.spec, result.binary
        variant = inst.variants[index]
        return Binary(
            case,
            tuple(sass.function_sass(cubin, spec.entry)),
            sass.resource_usage(cubin)[spec.entry],
            threads_per_block(spec, dict(case.types), dict(case.config)),
            sass.launch_bounds(variant.source, spec.entry),
        )

    with ThreadPoolExecutor(2) as pool:
        return {b.case.id: b for b in pool.map(read, zip(todo, results))}


def _binary(binaries: dict[str, Binary], case: Case) -> Binary:
    if case.problem:
        pytest.fail(case.problem)
    return binaries[case.id]


# --- the tests -----------------------------------------------------------------------------


@needs_tools
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_no_local_memory_and_registers_fit(binaries, case):
    b = _binary(binaries, case)
    problems = general_problems(b.usage, b.code, b.threads, b.bounds)
    assert not problems, f"{case.id}: {b.usage}, {b.threads} threads, launch bounds {b.bounds}:\n  " + "\n  ".join(problems)


def _row_params() -> list[Any]:
    """A parameter per (case, Expect) the Expect's `when` picks; a pending row's are xfail."""
    params = []
    spec_of = {inst.spec.name: inst.spec for inst in example_plan().instances}
    for case in CASES:
        row = TABLE.get(case.kernel)
        for n, expect in enumerate(row.expect if row else ()):
            if case.problem is None and not expect.when(case.env(spec_of[case.kernel])):
                continue
            marks = [pytest.mark.xfail(reason=row.pending, strict=False)] if row and row.pending else []
            params.append(pytest.param(case, n, id=f"{case.id}-expect{n}", marks=marks))
    return params


@needs_tools
@pytest.mark.parametrize("case, n", _row_params())
def test_table(binaries, case, n):
    b = _binary(binaries, case)
    spec = {inst.spec.name: inst.spec for inst in example_plan().instances}[case.kernel]
    problems = expect_problems(TABLE[case.kernel].expect[n], case.env(spec), b.code)
    assert not problems, f"{case.id}: {summary(b.code)}\n  " + "\n  ".join(problems)


def test_every_kernel_has_a_row_and_is_checked():
    """A kernel added to example_pkg gets a row (and so its binaries are checked), and every row
    has at least one config that its expectations apply to."""
    kernels = {inst.spec.name for inst in example_plan().instances}
    assert set(TABLE) == kernels
    picked = {p.values[0].kernel for p in _row_params()}
    assert picked == kernels, f"no config is checked against the rows of {sorted(kernels - picked)}"


# --- the checks can fail ---------------------------------------------------------------------


def _cubin(source: str, entry: str = "k", arch: str = "sm_90") -> bytes:
    ok, binary, log = compile_one(CompileJob(source, arch, entry))
    assert ok and binary, log
    return binary


LOCAL_ARRAY = """
extern "C" __global__ void __launch_bounds__(256) k(const float* x, const int* idx, float* y, int n) {
    float local[256];  // indexed by a value read at run time: it cannot live in registers
    for (int i = 0; i < 256; ++i) local[i] = x[i * n + threadIdx.x];
    y[threadIdx.x] = local[idx[threadIdx.x]];
}
"""

SCALAR_LOOP = """
extern "C" __global__ void k(const float* __restrict__ x, const float* __restrict__ y, float* out, int n) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc = fmaf(x[i], y[i], acc);  // loads dominate
    out[threadIdx.x] = acc;
}
"""


@needs_tools
def test_a_local_array_is_reported():
    cubin = _cubin(LOCAL_ARRAY)
    problems = general_problems(sass.resource_usage(cubin)["k"], sass.function_sass(cubin, "k"), 256, sass.launch_bounds(LOCAL_ARRAY, "k"))
    assert any(p.startswith("STACK:") for p in problems), problems
    assert any(p.startswith("local memory instructions") and "LDL" in p for p in problems), problems


@needs_tools
def test_scalar_loads_and_a_thin_loop_are_reported():
    code = sass.function_sass(_cubin(SCALAR_LOOP), "k")
    assert sass.count(code, "LDG") and not sass.count(code, "LDG.128")
    vector = TABLE["saxpy"].expect[0]
    assert expect_problems(vector, {}, code) == [f"no LDG.E.128 ({vector.why})", f"no STG.E.128 ({vector.why})"]
    gemm = TABLE["sgemm"].expect[0]
    problems = expect_problems(gemm, {"TM": 8, "TN": 8, "BK": 8, "UNROLL": 8}, code)
    loop = sass.hot_loop(code)
    assert loop is not None and loop.ffma >= 1
    assert any("density" in p for p in problems) and any("fewer than 512 FFMA" in p for p in problems), problems
    assert any(p.startswith("no LDGSTS.128") for p in problems) and any(p.startswith("no LDS.128") for p in problems)


@needs_tools
def test_the_scalar_saxpy_lacks_what_the_vector_row_wants(binaries):
    """On a real binary: the default saxpy (VEC=1) is reported by the 16-byte row."""
    (case,) = [c for c in CASES if c.kernel == "saxpy" and c.types == (("T", "float32"),) and c.arch == "sm_90" and "default" in c.roles]
    assert dict(case.config)["VEC"] == 1
    assert expect_problems(TABLE["saxpy"].expect[0], {}, binaries[case.id].code)


def test_current_winners_are_checked_and_stale_ones_are_not():
    """The lock's winners become cases only while their entry is current: here a lock written
    for the rendered saxpy (as a tuner would), with one entry made stale."""
    project = load_project(EXAMPLE)
    plan = make_plan(project, project.archs or (), log=lambda line: None, kernels=["saxpy"], lock=LockFile())
    inst = next(i for i in plan.instances if i.types == {"T": "float32"})
    current, stale = {"BLOCK": 128, "VEC": 4, "ITEMS": 2}, {"BLOCK": 64, "VEC": 2, "ITEMS": 8}
    first, second, *_ = inst.points["sm_90"]
    for point, config, checksum in ((first, current, first.checksum), (second, stale, "0" * 64)):
        plan.lock.entries[point.eid] = LockEntry(checksum=checksum, config=config, tuned=True)
    picked = {(c.arch, c.config): c.roles for c in cases_of(plan) if c.types == (("T", "float32"),)}
    assert picked[("sm_90", tuple(current.items()))] == ("winner",)
    assert ("sm_90", tuple(stale.items())) not in picked and ("sm_80", tuple(current.items())) not in picked
    assert picked[("sm_90", tuple(inst.variants[inst.default_index].config))] == ("default",)


def test_register_limits_are_reported():
    fine = sass.Usage(registers=64, shared=0, local=0, stack=0)
    assert general_problems(fine, (), 1024, None) == []
    assert general_problems(sass.Usage(registers=128, shared=0, local=0, stack=0), (), 1024, None)[0].endswith("the block cannot launch")
    assert "allows" in general_problems(sass.Usage(registers=160, shared=0, local=0, stack=0), (), 128, (256, 2))[0]
    assert "the launch fails" in general_problems(fine, (), 512, (256, 1))[0]


# --- the parsers, on text as the tools print it ---------------------------------------------

NVDISASM_TEXT = """\
	.section	.text.k,"ax",@progbits
k:
.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
.L_x_1:
        /*0020*/                   LDS.128 R8, [R3] ;
        /*0030*/                   FFMA R0, R8, R9, R0 ;
        /*0040*/                   FFMA.FTZ R0, R10, R11, R0 ;
        /*0050*/              @!P0 BRA `(.L_x_1) ;
        /*0060*/                   LDG.E.128.CONSTANT R4, desc[UR4][R6.64] ;
        /*0070*/               @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
.L_x_2:
        /*0090*/                   BRA `(.L_x_2);
        /*00a0*/                   NOP;
"""

CUOBJDUMP_TEXT = """\
		Function : k
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   FFMA R0, R1, R2, R0 ;                 /* 0x0000000201007223 */
                                                                         /* 0x000fe20000000000 */
        /*0010*/               @P0 BRA 0x0 ;                             /* 0xfffffffc00000947 */
        /*0020*/                   EXIT ;                                /* 0x000000000000794d */
"""


def test_sass_is_parsed_with_loops_and_the_hot_one():
    code = sass.parse_sass(NVDISASM_TEXT)["k"]
    assert [i.opcode for i in code][:3] == ["LDC", "LDGSTS.E.BYPASS.128", "LDS.128"]
    assert code[5].guard == "@!P0" and code[5].target == 0x20 and code[-2].target == 0x90
    assert sass.count(code, "LDGSTS.128") == 1 and sass.count(code, "LDG.E.128") == 1 and sass.count(code, "LDG.128.E") == 1
    assert sass.count(code, "LDS.64") == 0 and sass.count(code, "FFMA") == 2
    assert [(lp.start, lp.end) for lp in sass.loops(code)] == [(0x20, 0x50), (0x10, 0x70)]  # not the trap at 0x90
    hot = sass.hot_loop(code)
    assert hot is not None and (hot.start, hot.ffma, hot.size) == (0x20, 2, 4) and hot.ffma_density == 0.5
    (loop,) = sass.loops(sass.parse_sass(CUOBJDUMP_TEXT)["k"])
    assert (loop.start, loop.end, loop.ffma) == (0, 0x10, 1)


def test_usage_and_launch_bounds_are_parsed():
    text = " Common:\n  GLOBAL:0\n Function k:\n  REG:80 STACK:16 SHARED:9344 LOCAL:8 CONSTANT[0]:552 TEXTURE:0\n"
    assert sass.parse_usage(text) == {"k": sass.Usage(registers=80, shared=9344, local=8, stack=16)}
    assert sass.launch_bounds('extern "C" __global__ void __launch_bounds__(256) k(int n)', "k") == (256, 1)
    assert sass.launch_bounds("__global__ void __launch_bounds__((128 / 32) * (64 / 32) * 32, 2u) k()", "k") == (256, 2)
    assert sass.launch_bounds("__global__ void __launch_bounds__(256) other()", "k") is None
    assert sass.launch_bounds("__global__ void k()", "k") is None
    with pytest.raises(ValueError, match="NT"):
        sass.launch_bounds("__global__ void __launch_bounds__(NT) k()", "k")
