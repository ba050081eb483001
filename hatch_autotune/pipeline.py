"""The build pipeline without hatchling: config -> render -> compile -> choose -> package.

plugin.py only adapts this to hatchling, so tests drive the whole build through `build_payload`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from . import compile as compile_mod
from .cache import CompileCache
from .config import ProjectSpec
from .errors import BuildError
from .lock import Choice, LockFile, NvrtcPolicy, choose, entries_for, tuned_with
from .render import Variant, render_kernel
from .runtime import parse_arch

Log = Callable[[str], None]


@dataclass
class KernelBuild:
    """Everything the packager needs about one kernel."""

    spec: Any  # KernelSpec
    variants: dict[str, list[Variant]]  # types_key -> variants in canonical order
    binaries: dict[tuple[str, str], compile_mod.CompileResult]  # (source_hash, arch) -> result
    choices: dict[tuple[str, str, tuple[int, ...]], Choice]  # (types_key, arch, bucket) -> choice
    failed: dict[str, list[str]] = field(default_factory=dict)  # variant label -> arch: log
    entries: dict[tuple[str, str, tuple[int, ...]], tuple[str, str]] = field(default_factory=dict)  # -> (lock id, checksum)


@dataclass
class BuildResult:
    archs: tuple[str, ...]
    ptx: dict[str, str]  # table arch -> PTX arch
    compiler: str
    kernels: list[KernelBuild]
    counts: dict[str, int]


class Gpu(NamedTuple):
    """One device of the build machine."""

    ordinal: int
    arch: str  # 'sm_90'
    name: str | None  # 'NVIDIA H100 80GB HBM3'; None where the driver would not say


def detect_gpus() -> list[Gpu]:
    """Every device of the build machine, by ordinal; [] when there is no usable GPU.

    Straight from the driver (cuInit, then attributes by ordinal: no context is created), so a
    builder with several kinds of GPU shows each, and any failure (no driver, no device, no
    cuda-python, an error code) means "no GPU here" rather than a failed build."""
    try:
        from cuda.bindings import driver

        ok = driver.CUresult.CUDA_SUCCESS
        (err,) = driver.cuInit(0)
        if err != ok:
            return []
        err, count = driver.cuDeviceGetCount()
        if err != ok:
            return []
        attr = driver.CUdevice_attribute
        gpus = []
        for ordinal in range(int(count)):
            err, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal)
            err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal)
            if err != ok or err2 != ok:
                return []
            gpus.append(Gpu(ordinal, f"sm_{int(major)}{int(minor)}", _device_name(driver, ordinal)))
    except Exception:  # no driver (cuda.pathfinder's DynamicLibNotFoundError), no cuda-python, ...
        return []
    return gpus


def _device_name(driver: Any, ordinal: int) -> str | None:
    """For messages only: a device whose name cannot be read is still a device."""
    try:
        err, raw = driver.cuDeviceGetName(256, ordinal)
    except Exception:
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip() or None


def detect_gpu_arch() -> str | None:
    """The arch of the build machine's first GPU, or None (for callers that use one device)."""
    gpus = detect_gpus()
    return gpus[0].arch if gpus else None


def resolve_archs(project: ProjectSpec, gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """Declared archs, else those of every GPU here; without either the build cannot know its targets."""
    if project.archs:
        return project.archs
    if gpus:
        return tuple(sorted({g.arch for g in gpus}, key=lambda a: parse_arch(a)[1:]))  # sm_89 < sm_90 < sm_100
    why = "mode 'offline' does not look for a GPU" if project.mode == "offline" else "no GPU found on this machine"
    raise BuildError(
        f"hatch-autotune: {why} and no `archs` declared; add e.g. "
        "archs = [\"sm_80\", \"sm_90\"] to the hook table or set HATCH_AUTOTUNE_ARCHS"
    )


def ptx_archs(archs: tuple[str, ...]) -> dict[str, str]:
    """PTX for forward compatibility: compiled from the newest portable (non-'a') arch's winners."""
    portable = [a for a in archs if not parse_arch(a)[3]]
    if not portable:
        return {}
    newest = max(portable, key=lambda a: parse_arch(a)[1:3])
    return {newest: "compute_" + newest.split("_", 1)[1]}


def _progress(total: int, what: str, log: Log, every: float = 0.1) -> Callable[[Any], None]:
    """A callback that logs `k/total <what>` about every 10% of the way (long compiles show life)."""
    state = {"done": 0, "next": max(1, int(total * every))}

    def tick(_: Any) -> None:
        state["done"] += 1
        if state["done"] >= state["next"] and state["done"] < total:
            log(f"hatch-autotune: {state['done']}/{total} {what}")
            state["next"] += max(1, int(total * every))

    return tick


def build_payload(
    project: ProjectSpec,
    *,
    cache: CompileCache | None,
    log: Log = print,
    gpus: Sequence[Gpu] = (),
    workers: int | None = None,
) -> BuildResult:
    """Render, compile and choose for every kernel; raise BuildError when a kernel cannot build."""
    archs = resolve_archs(project, gpus)
    ptx = ptx_archs(archs) if project.ptx else {}
    compiler = compile_mod.nvrtc_version()
    policy = NvrtcPolicy(compiler, project.exact_nvrtc)
    lock = LockFile.load(project.lock_file)
    for w in lock.warnings:
        log(f"warning: {w}")

    rendered = {name: render_kernel(spec) for name, spec in project.kernels.items()}
    jobs: list[compile_mod.CompileJob] = []
    for name, spec in project.kernels.items():
        for variants in rendered[name].values():
            for v in variants:
                for arch in archs:
                    jobs.append(compile_mod.CompileJob(v.source, arch, spec.entry, spec.nvrtc_options, v.label))
    n_unique = len({(j.source, j.arch, j.options) for j in jobs})
    log(f"hatch-autotune: {len(project.kernels)} kernel(s), {n_unique} compile(s) for {', '.join(archs)} (NVRTC {compiler}, build {compile_mod.nvrtc_build()})")
    results = compile_mod.compile_all(jobs, cache, workers=workers, on_result=_progress(n_unique, "compiled", log))
    by_job = {(r.job.source, r.job.arch, r.job.options): r for r in results}

    kernels: list[KernelBuild] = []
    untuned: list[tuple[str, str]] = []  # (entry id, why it has no valid tuning)
    for name, spec in project.kernels.items():
        kb = KernelBuild(spec=spec, variants=rendered[name], binaries={}, choices={})
        for tkey, variants in rendered[name].items():
            usable_per_arch = {}
            for arch in archs:
                usable = []
                for v in variants:
                    r = by_job[(v.source, arch, spec.nvrtc_options)]
                    kb.binaries[(v.source_hash, arch)] = r
                    usable.append(r.ok)
                    if not r.ok:
                        kb.failed.setdefault(v.label, []).append(f"{arch}: {r.log}")
                if not any(usable):
                    first = next(v for v in variants if not kb.binaries[(v.source_hash, arch)].ok)
                    raise BuildError(
                        f"hatch-autotune: every variant of kernel {name!r} ({tkey}) failed to compile for {arch}; "
                        f"the first, {first.label}, failed with:\n{kb.binaries[(first.source_hash, arch)].log}"
                    )
                usable_per_arch[arch] = usable
            configs = [v.config_dict for v in variants]
            default_index = configs.index(dict(spec.default))
            hashes = [v.source_hash for v in variants]
            for arch in archs:
                for e in entries_for(spec, tkey, hashes, arch):
                    choice = choose(lock, e.eid, e.checksum, configs, usable_per_arch[arch], default_index, policy)
                    kb.choices[(tkey, arch, e.point)] = choice
                    kb.entries[(tkey, arch, e.point)] = (e.eid, e.checksum)
                    if not choice.tuned:
                        untuned.append((e.eid, choice.reason))
        n_failed = len(kb.failed)
        if n_failed:
            first_label, first_logs = next(iter(kb.failed.items()))
            msg = f"{name}: {n_failed} variant(s) failed to compile and were skipped; the first, {first_label}, failed with:\n{first_logs[0]}"
            log(f"warning: {msg}")
        kernels.append(kb)

    versions = Counter(tuned_with(c.provenance) for kb in kernels for c in kb.choices.values() if c.tuned)
    if versions:  # which NVRTC measured the winners in use, next to the one compiling them (above)
        n = sum(versions.values())
        named = ", ".join(v if len(versions) == 1 else f"{v} ({k})" for v, k in versions.most_common())
        log(f"hatch-autotune: {n} entr{'y uses' if n == 1 else 'ies use'} tuned winners from {project.lock_file.name}, tuned with NVRTC {named}")
    mixed = policy.warning(versions)
    if mixed:
        log(f"warning: {mixed}")
    if untuned:
        if project.strict:
            listing = "\n  ".join(f"{eid} ({reason})" for eid, reason in untuned)
            raise BuildError(
                f"hatch-autotune: strict = true and {len(untuned)} entr(y/ies) have no valid tuning in "
                f"{project.lock_file.name}:\n  {listing}\nTune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit the lock file."
            )
        groups: dict[tuple[str, str], list[str]] = {}
        for eid, reason in untuned:  # one line per kernel and reason, naming every entry
            groups.setdefault((eid.split("|", 1)[0], reason), []).append(eid)
        for (kernel, reason), eids in groups.items():
            log(f"warning: {kernel}: {len(eids)} untuned entr{'y' if len(eids) == 1 else 'ies'} use the default config ({reason}): {', '.join(eids)}")
        log("hint: tune on a GPU builder (HATCH_AUTOTUNE_MODE=tune) and commit the lock file; strict = true makes this an error")

    # PTX of the chosen variants of the arch that PTX is made from.
    ptx_jobs = []
    for kb in kernels:
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
    counts = compile_mod.count([*results, *ptx_results])
    log(
        f"hatch-autotune: {counts['compiled']} variant binaries compiled, {counts['cached']} from the cache, "
        f"{counts['failed']} failed"
    )
    return BuildResult(archs=archs, ptx=ptx, compiler=compiler, kernels=kernels, counts=counts)

