"""The build without hatchling: plan -> compile what ships -> choose -> (payload writes it).

hatch/plugin.py only adapts this to hatchling, so tests drive the whole build through
`build_payload`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import BuildError
from ..spec.config import ProjectSpec
from . import compile as compile_mod
from .cache import CompileCache
from .devices import Gpu
from .lock import tuned_with
from .plan import Choice, Plan, Point, make_plan, resolve_archs
from .render import Variant

Log = Callable[[str], None]


@dataclass
class KernelBuild:
    """Everything the packager needs about one kernel."""

    spec: Any  # KernelSpec
    variants: dict[str, list[Variant]]  # types_key -> variants in canonical order
    binaries: dict[tuple[str, str], compile_mod.CompileResult]  # (source_hash, arch) -> result
    choices: dict[tuple[str, str, tuple[int, ...]], Choice]  # (types_key, arch, bucket) -> choice
    failed: dict[str, list[str]] = field(default_factory=dict)  # variant label -> arch: log
    lock_ids: dict[tuple[str, str, tuple[int, ...]], tuple[str, str]] = field(default_factory=dict)  # -> (lock entry id, checksum)


@dataclass
class BuildResult:
    archs: tuple[str, ...]
    ptx: dict[str, str]  # table arch -> PTX arch
    compiler: str
    kernels: list[KernelBuild]
    counts: dict[str, int]


def _progress(total: int, what: str, log: Log, every: float = 0.1, at_least: int = 20) -> Callable[[Any], None]:
    """A callback that logs `k/total <what>` about every 10% of the way (long compiles show
    life); silent for fewer than `at_least` steps, which take a second or two."""
    state = {"done": 0, "next": max(1, int(total * every)) if total >= at_least else total}

    def tick(_: Any) -> None:
        state["done"] += 1
        if state["done"] >= state["next"] and state["done"] < total:
            log(f"hatch-autotune: {state['done']}/{total} {what}")
            state["next"] += max(1, int(total * every))

    return tick


@dataclass
class Shipping:
    """What a plan ships: per (instance number, arch), each point's choice and the binaries
    compiled to make it."""

    choices: dict[tuple[int, str], dict[Point, Choice]]
    binaries: dict[tuple[int, str], dict[int, compile_mod.CompileResult]]
    results: list[compile_mod.CompileResult]  # every compile, for the counts


def compile_shipped(plan: Plan, cache: CompileCache | None, *, log: Log = print, workers: int | None = None) -> Shipping:
    """Compile what ships (the lock's valid winners and the defaults) and choose each point's
    variant; only where one of those fails to compile, the rest of that type instance, to find
    what the build falls back to. BuildError when every variant of one fails."""
    usable: dict[tuple[int, str], dict[int, bool]] = {}  # variant index -> compiled
    shipping = Shipping({}, {}, [])

    def compile_wanted(wanted: dict[tuple[int, str], set[int]], what: str) -> None:
        keys = [(k, i) for k, indices in wanted.items() for i in sorted(indices)]
        jobs = [plan.instances[k[0]].compile_job(i, k[1]) for k, i in keys]
        n_unique = len({(j.source, j.arch, j.options) for j in jobs})
        log(f"hatch-autotune: compiling {n_unique} variant binaries ({what})")
        results = compile_mod.compile_all(jobs, cache, workers=workers, on_result=_progress(n_unique, "compiled", log))
        for (k, i), r in zip(keys, results):
            usable.setdefault(k, {})[i] = r.ok
            shipping.binaries.setdefault(k, {})[i] = r
        shipping.results.extend(results)

    def choose(k: tuple[int, str]) -> dict[Point, Choice | None]:
        inst = plan.instances[k[0]]
        return {p: plan.choose(inst, p, usable[k]) for p in inst.points[k[1]]}

    compile_wanted(
        {(n, arch): plan.shipped(inst, arch) for n, inst in enumerate(plan.instances) for arch in plan.archs},
        "the lock's winners and the defaults",
    )
    chosen = {k: choose(k) for k in usable}
    rest = {k: set(range(len(plan.instances[k[0]].variants))) - set(usable[k]) for k, c in chosen.items() if None in c.values()}
    if rest:
        compile_wanted(rest, "the rest of the type instances whose shipped variants failed to compile")
        for k in rest:
            if not any(usable[k].values()):
                inst, first = plan.instances[k[0]], min(usable[k])
                raise BuildError(
                    f"hatch-autotune: every variant of kernel {inst.spec.name!r} ({inst.types_key}) failed to compile for {k[1]}; "
                    f"the first, {inst.variants[first].label}, failed with:\n{shipping.binaries[k][first].log}"
                )
            chosen[k] = choose(k)
    for k, c in chosen.items():  # every variant of an instance with an open choice is compiled by now
        shipping.choices[k] = {p: choice for p, choice in c.items() if choice is not None}
    return shipping


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
    made here for this machine's target archs."""
    plan = plan or make_plan(project, resolve_archs(project, gpus), log=log)
    archs, compiler = plan.archs, plan.compiler
    total = sum(len(inst.variants) for inst in plan.instances) * len(archs)
    log(
        f"hatch-autotune: {len(project.kernels)} kernel(s), {len(archs)} arch(s) ({', '.join(archs)}), "
        f"{total} variant binaries in the space (NVRTC {compiler}, build {compile_mod.nvrtc_build()})"
    )
    shipping = compile_shipped(plan, cache, log=log, workers=workers)

    kernels: dict[str, KernelBuild] = {}
    untuned: list[tuple[Point, str]] = []  # why each has no valid tuning
    for n, inst in enumerate(plan.instances):
        spec = inst.spec
        kb = kernels.setdefault(spec.name, KernelBuild(spec=spec, variants={}, binaries={}, choices={}))
        kb.variants[inst.types_key] = inst.variants
        for arch in archs:
            for i, r in sorted(shipping.binaries[(n, arch)].items()):
                kb.binaries[(inst.variants[i].source_hash, arch)] = r
                if not r.ok:
                    kb.failed.setdefault(inst.variants[i].label, []).append(f"{arch}: {r.log}")
            for p, choice in shipping.choices[(n, arch)].items():
                kb.choices[(inst.types_key, arch, p.key)] = choice
                kb.lock_ids[(inst.types_key, arch, p.key)] = (p.eid, p.checksum)
                if not choice.tuned:
                    untuned.append((p, choice.reason))
    for kb in kernels.values():
        if kb.failed:
            first_label, first_logs = next(iter(kb.failed.items()))
            log(
                f"warning: {kb.spec.name}: {len(kb.failed)} variant(s) failed to compile and were skipped; "
                f"the first, {first_label}, failed with:\n{first_logs[0]}"
            )

    versions = Counter(tuned_with(c.provenance) for kb in kernels.values() for c in kb.choices.values() if c.tuned)
    if versions:  # which NVRTC measured the winners in use, next to the one compiling them (above)
        n_tuned = sum(versions.values())
        named = ", ".join(v if len(versions) == 1 else f"{v} ({k})" for v, k in versions.most_common())
        log(f"hatch-autotune: {n_tuned} entr{'y uses' if n_tuned == 1 else 'ies use'} tuned winners from {project.lock_file.name}, tuned with NVRTC {named}")
    mixed = plan.policy.warning(versions)
    if mixed:
        log(f"warning: {mixed}")
    if untuned:
        if project.strict:
            listing = "\n  ".join(f"{p.eid} ({reason})" for p, reason in untuned)
            raise BuildError(
                f"hatch-autotune: strict = true and {len(untuned)} entr(y/ies) have no valid tuning in "
                f"{project.lock_file.name}:\n  {listing}\nTune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit the lock file."
            )
        groups: dict[tuple[str, str], list[str]] = {}
        for p, reason in untuned:  # one line per kernel and reason, naming every entry
            groups.setdefault((p.id.kernel, reason), []).append(p.eid)
        for (kernel, reason), eids in groups.items():
            log(f"warning: {kernel}: {len(eids)} untuned entr{'y uses' if len(eids) == 1 else 'ies use'} the default config ({reason}): {', '.join(eids)}")
        log("hint: tune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit the lock file; strict = true makes this an error")

    # PTX of the chosen variants of the arch that PTX is made from.
    ptx = plan.ptx
    ptx_jobs = []
    for kb in kernels.values():
        for (tkey, arch, _), choice in kb.choices.items():
            if arch in ptx:
                v = kb.variants[tkey][choice.variant_index]
                ptx_jobs.append((kb, v, compile_mod.CompileJob(v.source, ptx[arch], kb.spec.entry, kb.spec.nvrtc_options, v.label)))
    ptx_results = compile_mod.compile_all([j for _, _, j in ptx_jobs], cache, workers=workers)
    for (kb, v, job), r in zip(ptx_jobs, ptx_results):
        if not r.ok:
            raise BuildError(f"hatch-autotune: PTX for {v.label} ({job.arch}) failed:\n{r.log}")
        kb.binaries[(v.source_hash, job.arch)] = r

    if cache is not None and cache.write_error:
        log(f"warning: {cache.write_error}")
    counts = compile_mod.count([*shipping.results, *ptx_results])
    log(
        f"hatch-autotune: {counts['compiled']} variant binaries compiled, {counts['cached']} from the cache, "
        f"{counts['failed']} failed"
    )
    return BuildResult(archs=archs, ptx=ptx, compiler=compiler, kernels=list(kernels.values()), counts=counts)
