"""The build without hatchling: plan -> compile what ships -> choose -> (payload writes it).

hatch/plugin.py only adapts this to hatchling, so tests drive the whole build through
`build_payload`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..compile import nvrtc as compile_mod
from ..compile.cache import CompileCache
from ..compile.render import Variant
from ..declare.config import ProjectSpec
from ..errors import BuildError
from ..lock import tuned_with
from ..plan.devices import Gpu
from ..plan.planner import PROVENANCE_FIELDS, PROVENANCE_MAX_CHARS, Choice, Instance, Plan, Point, make_plan, resolve_archs
from ..runtime import parse_arch
from ..text import Log, examples, indent, instance_text, log_excerpt
from .outcome import CompileFailure, EntryOutcome, EntryStatus, Outcome


@dataclass
class KernelBuild:
    """Everything the packager needs about one kernel."""

    spec: Any  # KernelSpec
    variants: dict[str, list[Variant]]  # types_key -> variants in canonical order
    binaries: dict[tuple[str, str], compile_mod.CompileResult]  # (source_hash, arch) -> result, failed ones too
    choices: dict[tuple[str, str, tuple[int, ...]], Choice]  # (types_key, arch, bucket) -> choice
    lock_ids: dict[tuple[str, str, tuple[int, ...]], tuple[str, str]] = field(default_factory=dict)  # -> (lock entry id, checksum)


@dataclass
class BuildResult:
    archs: tuple[str, ...]
    ptx: dict[str, str]  # table arch -> PTX arch
    compiler: str
    kernels: list[KernelBuild]
    counts: dict[str, int]  # distinct variant binaries: compiled, cached, failed (compile.count)
    outcome: Outcome  # what the wheel records of this build (outcome.py)


PROGRESS_AT_LEAST = 20  # real compiles below this take a second or two: no progress lines


def _progress(jobs: Sequence[compile_mod.CompileJob], log: Log, every: float = 0.1) -> Callable[[compile_mod.CompileResult], None]:
    """An on_result callback for compile_all that logs `compiling: k/N done` about every 10% of
    the N binaries NVRTC really compiles (long compiles show life), and nothing when N is
    under PROGRESS_AT_LEAST, as in a build that finds everything in the cache. compile_all
    reports every cache hit before it compiles anything, so at the first real compile N is
    known: the distinct jobs less the hits so far."""
    distinct = len({j.binary_key for j in jobs})
    state = {"cached": 0, "done": 0, "total": 0, "next": 0}

    def tick(r: compile_mod.CompileResult) -> None:
        if r.cached:
            state["cached"] += 1
            return
        if not state["total"]:
            state["total"] = distinct - state["cached"]
            state["next"] = max(1, int(state["total"] * every)) if state["total"] >= PROGRESS_AT_LEAST else state["total"]
            if state["total"] >= PROGRESS_AT_LEAST:
                log(f"hatch-autotune: compiling {state['total']} variant binaries with NVRTC ({state['cached']} found in the cache)")
        state["done"] += 1
        if state["next"] <= state["done"] < state["total"]:
            log(f"hatch-autotune: compiling: {state['done']}/{state['total']} done")
            state["next"] += max(1, int(state["total"] * every))

    return tick


def counts_text(counts: dict[str, int]) -> str:
    """'8 variant binaries compiled, 4 from the cache, 0 failed': the build's one vocabulary.
    compiled: NVRTC ran and succeeded; from the cache: an earlier build's binary; failed: NVRTC
    (now or in the build that filled the cache) reported an error. Each distinct binary is in
    exactly one of the three, so they add up."""
    compiled = counts["compiled"]
    return (
        f"{compiled} variant binar{'y' if compiled == 1 else 'ies'} compiled, {counts['cached']} from the cache, {counts['failed']} failed"
    )


def _compile_step(
    jobs: Sequence[compile_mod.CompileJob], cache: CompileCache | None, what: str, log: Log, workers: int | None
) -> list[compile_mod.CompileResult]:
    """Compile one step's jobs, with progress, and say in one line what became of them."""
    results = compile_mod.compile_all(jobs, cache, workers=workers, on_result=_progress(jobs, log))
    counts = compile_mod.count(results)
    log(f"hatch-autotune: {what}: {counts_text(counts)}")
    return results


@dataclass
class Shipping:
    """What a plan ships: per (instance number, arch), each point's choice and the binaries
    compiled to make it."""

    choices: dict[tuple[int, str], dict[Point, Choice]]
    binaries: dict[tuple[int, str], dict[int, compile_mod.CompileResult]]
    results: list[compile_mod.CompileResult]  # every compile, for the counts

    def failures(self, plan: Plan) -> list[tuple[Instance, str, Variant, compile_mod.CompileResult]]:
        """Every variant that failed to compile, with its instance and arch, in plan order."""
        out = []
        for (n, arch), by_index in self.binaries.items():
            inst = plan.instances[n]
            out += [(inst, arch, inst.variants[i], r) for i, r in sorted(by_index.items()) if not r.ok]
        return out


def compile_shipped(plan: Plan, cache: CompileCache | None, *, log: Log = print, workers: int | None = None) -> Shipping:
    """Compile what ships (the lock's valid winners and the defaults) and choose each point's
    variant. A default that fails to compile is a BuildError (Plan.default_failure) unless the
    project sets default-may-fail; then, only there, the rest of that type instance is compiled
    to find the first config that compiles. BuildError when every variant of one fails."""
    usable: dict[tuple[int, str], dict[int, bool]] = {}  # variant index -> compiled
    shipping = Shipping({}, {}, [])

    def compile_wanted(wanted: dict[tuple[int, str], set[int]], what: str) -> None:
        keys = [(k, i) for k, indices in wanted.items() for i in sorted(indices)]
        jobs = [plan.instances[k[0]].compile_job(i, k[1]) for k, i in keys]
        results = _compile_step(jobs, cache, what, log, workers)
        for (k, i), r in zip(keys, results):
            usable.setdefault(k, {})[i] = r.ok
            shipping.binaries.setdefault(k, {})[i] = r
        shipping.results.extend(results)

    def choose(k: tuple[int, str]) -> dict[Point, Choice | None]:
        inst = plan.instances[k[0]]
        return {p: plan.choose(inst, p, usable[k]) for p in inst.points[k[1]]}

    compile_wanted(
        {(n, arch): plan.shipped(inst, arch) for n, inst in enumerate(plan.instances) for arch in plan.archs},
        "the lock's winners and the default configs",
    )
    broken = plan.broken_defaults(usable, shipping.binaries)  # the defaults, and where one may not run a point its fallback
    if broken and not plan.project.default_may_fail:
        raise BuildError(plan.default_failure(broken))
    chosen = {k: choose(k) for k in usable}
    # what may serve some point of the arch: a config excluded at every point is never compiled
    rest = {k: plan.compilable(plan.instances[k[0]], k[1]) - set(usable[k]) for k, c in chosen.items() if None in c.values()}
    if rest:
        compile_wanted(rest, "the rest of the type instances whose default config failed to compile (default-may-fail = true)")
        for k in rest:
            if not any(usable[k].values()):
                inst, first = plan.instances[k[0]], min(usable[k])
                raise BuildError(
                    f"hatch-autotune: every variant of kernel {inst.spec.name!r} ({instance_text(inst.types_key)}) failed to compile for {k[1]}; "
                    f"the first, {inst.variants[first].label}, failed with:\n{log_excerpt(shipping.binaries[k][first].log)}"
                )
            chosen[k] = choose(k)
    for k, c in chosen.items():  # every variant of an instance with an open choice is compiled by now
        shipping.choices[k] = {p: choice for p, choice in c.items() if choice is not None}
    return shipping


def _shipped_indices(choice: Choice) -> tuple[int, ...]:
    """The variants a point ships: its choice, and where that is a winner (tuned, or the plain
    arch's inherited) the point's default config too (Choice.default_index), which a run-time
    pin may force."""
    d = choice.default_index
    return (choice.variant_index,) if d is None or d == choice.variant_index else (choice.variant_index, d)


def record_outcome(plan: Plan, shipping: Shipping, shipped: int | None = None) -> Outcome:
    """The outcome record of a build (or of what a build would do, for `show PROJECT`): every
    point's status and reason, every failed compile."""
    entries = []
    for n, inst in enumerate(plan.instances):
        for arch in plan.archs:
            for p, choice in shipping.choices.get((n, arch), {}).items():
                entries.append(EntryOutcome(p.id, EntryStatus(choice.status), inst.configs[choice.variant_index], choice.reason))
    failures = Outcome.failures_of(
        [
            (inst.spec.name, inst.types_key, arch, v.label, v.config_dict, v.source_hash, r.log)
            for inst, arch, v, r in shipping.failures(plan)
        ]
    )
    return Outcome(tuple(entries), failures, shipped, plan.project.default_may_fail)


def _log_failures(outcome: Outcome, log: Log) -> None:
    """One warning per kernel whose variants failed to compile: how many, where, and the
    first one's first log lines; every failure and its log is in the outcome record."""
    by_kernel: dict[str, list[CompileFailure]] = {}
    for f in outcome.failures:
        by_kernel.setdefault(f.kernel, []).append(f)
    for kernel, failed in by_kernel.items():
        where = sorted({f.arch for f in failed}, key=lambda a: parse_arch(a)[1:])
        first = failed[0]
        excerpt = indent(log_excerpt(first.log, lines=3))
        log(
            f"warning: {kernel}: {len(failed)} variant binar{'y' if len(failed) == 1 else 'ies'} failed to compile "
            f"(on {', '.join(where)}) and {'is' if len(failed) == 1 else 'are'} not in the wheel; the first, "
            f"{first.variant} on {first.arch}:\n{excerpt}"
        )


def _log_untuned(outcome: Outcome, lock_name: str, log: Log) -> None:
    """One warning per kernel and reason, with a count and a few of the entries (the outcome
    record lists them all)."""
    for (kernel, status, reason), eids in outcome.untuned().items():
        n, config = len(eids), "the default config" if status == EntryStatus.DEFAULT else "a fallback config"
        log(f"warning: {kernel}: {n} untuned entr{'y uses' if n == 1 else 'ies use'} {config} ({reason}): {examples(eids)}")
    log(f"hint: tune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit {lock_name}; strict = true makes untuned entries an error")


def _log_provenance(choices: Sequence[tuple[Point, Choice]], lock_name: str, log: Log) -> None:
    """One warning when tuned entries' provenance held what the wheel does not copy
    (planner.shipped_provenance): unknown fields, values that are not short strings."""
    dropped = [(p.eid, list(c.left_out)) for p, c in choices if c.left_out]
    if dropped:
        (eid, first), n = dropped[0], len(dropped)
        log(
            f"warning: {n} tuned entr{'y' if n == 1 else 'ies'} of {lock_name} carr{'ies' if n == 1 else 'y'} provenance that the "
            f"wheel leaves out (e.g. {eid}: {examples(first)}); it copies only {', '.join(PROVENANCE_FIELDS)}, each a string of "
            f"at most {PROVENANCE_MAX_CHARS} characters"
        )


def build_payload(
    project: ProjectSpec,
    *,
    cache: CompileCache | None,
    log: Log = print,
    gpus: Sequence[Gpu] = (),
    workers: int | None = None,
    plan: Plan | None = None,
) -> BuildResult:
    """Compile what ships and choose it for every point; raise BuildError when a kernel cannot
    build. `plan`: the one the tuner just used (its lock holds the fresh winners), else one
    made here for this machine's target archs. The log ends with a short summary; the whole
    outcome is in `BuildResult.outcome`, which the wheel records."""
    plan = plan or make_plan(project, resolve_archs(project, gpus), log=log)
    archs, compiler = plan.archs, plan.compiler
    n_configs = sum(len(inst.variants) for inst in plan.instances)
    log(
        f"hatch-autotune: {len(project.kernels)} kernel(s) with {n_configs} config(s) in all, arch(s) {', '.join(archs)} "
        f"(NVRTC {compiler}, build {compile_mod.nvrtc_build(project.min_cuda)}; binaries for CUDA {project.min_cuda} drivers and newer)"
    )
    shipping = compile_shipped(plan, cache, log=log, workers=workers)

    kernels: dict[str, KernelBuild] = {}
    untuned: list[tuple[Point, str]] = []  # why each has no valid tuning
    shipped_choices: list[tuple[Point, Choice]] = []
    for n, inst in enumerate(plan.instances):
        spec = inst.spec
        kb = kernels.setdefault(spec.name, KernelBuild(spec=spec, variants={}, binaries={}, choices={}))
        kb.variants[inst.types_key] = inst.variants
        for arch in archs:
            for i, r in sorted(shipping.binaries[(n, arch)].items()):
                kb.binaries[(inst.variants[i].source_hash, arch)] = r
            for p, choice in shipping.choices[(n, arch)].items():
                kb.choices[(inst.types_key, arch, p.key)] = choice
                kb.lock_ids[(inst.types_key, arch, p.key)] = (p.eid, p.checksum)
                shipped_choices.append((p, choice))
                if not choice.tuned:
                    untuned.append((p, choice.reason))
    if untuned and project.strict:
        listing = "\n  ".join(f"{p.eid} ({reason})" for p, reason in untuned)
        raise BuildError(
            f"hatch-autotune: strict = true and {len(untuned)} entr(y/ies) have no valid tuning in "
            f"{project.lock_file.name}:\n  {listing}\nTune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit the lock file."
        )

    # PTX of the chosen variants of the arch that PTX is made from.
    ptx = plan.ptx
    ptx_jobs = []
    for kb in kernels.values():
        for (tkey, arch, _), choice in kb.choices.items():
            for index in _shipped_indices(choice) if arch in ptx else ():
                v = kb.variants[tkey][index]
                ptx_jobs.append((kb, v, v.compile_job(ptx[arch], kb.spec.entry, kb.spec.nvrtc_options)))
    ptx_what = f"PTX of the {', '.join(ptx)} choices, for newer GPUs"
    ptx_results = _compile_step([j for _, _, j in ptx_jobs], cache, ptx_what, log, workers) if ptx_jobs else []
    for (kb, v, job), r in zip(ptx_jobs, ptx_results):
        if not r.ok:
            raise BuildError(f"hatch-autotune: PTX for {v.label} ({job.arch}) failed:\n{log_excerpt(r.log)}")
        kb.binaries[(v.source_hash, job.arch)] = r

    # What the wheel holds: each chosen variant's binary per arch (configs sharing a source share
    # it) and its PTX, and those of the defaults beside winners, for a run-time pin.
    shipped = {
        (kb.spec.name, kb.variants[tkey][index].source_hash, bin_arch)
        for kb in kernels.values()
        for (tkey, arch, _), c in kb.choices.items()
        for index in _shipped_indices(c)
        for bin_arch in [arch] + ([ptx[arch]] if arch in ptx else [])
    }
    outcome = record_outcome(plan, shipping, len(shipped))
    _log_failures(outcome, log)
    _log_provenance(shipped_choices, project.lock_file.name, log)
    versions = Counter(tuned_with(c.provenance) for kb in kernels.values() for c in kb.choices.values() if c.tuned)
    if versions:  # which NVRTC measured the winners in use, next to the one compiling them (above)
        n_tuned = sum(versions.values())
        named = ", ".join(v if len(versions) == 1 else f"{v} ({k})" for v, k in versions.most_common())
        log(
            f"hatch-autotune: {n_tuned} entr{'y uses' if n_tuned == 1 else 'ies use'} tuned winners from {project.lock_file.name}, tuned with NVRTC {named}"
        )
    mixed = plan.policy.warning(versions)
    if mixed:
        log(f"warning: {mixed}")
    if untuned:
        _log_untuned(outcome, project.lock_file.name, log)
    for problem in cache.warnings() if cache is not None else []:  # a store not written, a shared tier switched off
        log(f"warning: {problem}")

    counts = compile_mod.count([*shipping.results, *ptx_results])
    log(f"hatch-autotune: in all, {counts_text(counts)}; {len(shipped)} shipped in the wheel")
    log(f"hatch-autotune: {outcome.summary()}")
    return BuildResult(archs=archs, ptx=ptx, compiler=compiler, kernels=list(kernels.values()), counts=counts, outcome=outcome)
