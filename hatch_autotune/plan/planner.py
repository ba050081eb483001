"""The one planner: every variant rendered once, every lock entry it serves, and for each mode
what is compiled. The build, the tuner and `hatch-autotune show` all ask it, so they agree on
the target archs, the checksums, which lock entries are valid, and which variant ships.

What each mode compiles:
- tuning compiles the candidates of the entries it tunes (tuning/decide.py asks `to_tune`);
- a build compiles only what ships: per type instance and arch, the lock's valid winners and
  the default (`shipped`); only when one of those fails to compile does it compile the rest,
  to find the variant the build falls back to. The wheel's bytes are the same as if the whole
  space had been compiled.

Before anything is compiled, a tuning run is counted (`tuning_size`): the configs it would
measure, over every bucket, instance and arch, are bounded by MAX_TUNING_RUNS.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..compile.nvrtc import CompileJob
from ..compile.render import Variant, render_kernel
from ..declare.config import KernelSpec, Mode, ProjectSpec
from ..declare.space import bucket_points, count_points
from ..errors import BuildError
from ..lock import Bucket, EntryId, LockFile, NvrtcPolicy, entry_checksum
from ..runtime import parse_arch
from ..text import Log, indent, instance_text, log_excerpt
from .choice import LOCK_ONLY_PROVENANCE as LOCK_ONLY_PROVENANCE
from .choice import PROVENANCE_FIELDS as PROVENANCE_FIELDS
from .choice import PROVENANCE_MAX_CHARS as PROVENANCE_MAX_CHARS
from .choice import Choice as Choice
from .choice import shipped_provenance as shipped_provenance
from .choice import tuned_choice
from .devices import Gpu
from .exclusions import Exclusion, PointRules, no_candidate
from .hooks import check_hooks

# The most configs one tuning run may measure, over every bucket, type instance and arch (each
# at most `budget-ms` of GPU time, after its compile): more is days of GPU time, most likely a
# search without a budget over a big space.
MAX_TUNING_RUNS = 10_000_000
# A kernel with at least this many configs before constraints (over its instances) says that it
# is rendering, and how long it took: a few seconds or more.
RENDER_NOTICE_AT = 2_000


def target_archs(project: ProjectSpec, available: Iterable[str]) -> tuple[str, ...]:
    """The one rule for the target archs: those declared (the table's `archs`, or
    HATCH_AUTOTUNE_ARCHS), else every arch available (this machine's GPUs, a Ray cluster's),
    oldest first; empty when neither names one."""
    if project.archs:
        return project.archs
    return tuple(sorted(set(available), key=lambda a: parse_arch(a)[1:]))  # sm_89 < sm_90 < sm_100


def resolve_archs(project: ProjectSpec, gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """The target archs of a build here (target_archs); without any the build cannot know its targets."""
    archs = target_archs(project, (g.arch for g in gpus))
    if archs:
        return archs
    why = "mode 'offline' does not look for a GPU" if project.mode == Mode.OFFLINE else "no GPU found on this machine"
    raise BuildError(
        f'hatch-autotune: {why} and no `archs` declared; add e.g. archs = ["sm_80", "sm_90"] to the hook table or set HATCH_AUTOTUNE_ARCHS'
    )


def plain_arch(arch: str) -> str:
    """The plain target of an arch's compute capability: 'sm_90a' and 'sm_90' -> 'sm_90'."""
    kind, major, minor, _ = parse_arch(arch)
    return f"{kind}_{major}{minor}"


def ptx_archs(archs: tuple[str, ...]) -> dict[str, str]:
    """PTX for forward compatibility: compiled from the newest portable arch's winners. Not an
    'a' or 'f' arch's: such PTX runs only where its cubin already does (runs_on), so it would
    serve no other GPU."""
    portable = [a for a in archs if not parse_arch(a)[3]]
    if not portable:
        return {}
    newest = max(portable, key=lambda a: parse_arch(a)[1:3])
    return {newest: "compute_" + newest.split("_", 1)[1]}


@dataclass(frozen=True)
class Point:
    """One bucket of a type instance on an arch: what one lock entry records and one row of the
    selection table selects."""

    id: EntryId
    checksum: str

    @property
    def eid(self) -> str:
        return str(self.id)

    @property
    def bucket(self) -> Bucket:
        return self.id.bucket

    @property
    def key(self) -> tuple[int, ...]:
        """The bucket's values in the kernel's key order: its row of the selection table."""
        return self.id.bucket.values


@dataclass
class Instance:
    """One type instance of a kernel: its variants in canonical order, the default's index,
    and its points on each target arch."""

    spec: KernelSpec
    types_key: str
    variants: list[Variant]
    default_index: int
    points: dict[str, list[Point]] = field(default_factory=dict)  # arch -> points
    _rules: dict[str, PointRules] = field(default_factory=dict, repr=False)  # arch -> what excludes configs there

    @cached_property
    def configs(self) -> list[dict[str, Any]]:
        """The variants' configs, in canonical order: made once, however often asked."""
        return [v.config_dict for v in self.variants]

    @cached_property
    def _positions(self) -> dict[frozenset[tuple[str, Any]], int]:
        out: dict[frozenset[tuple[str, Any]], int] = {}
        for i, c in enumerate(self.configs):
            out.setdefault(frozenset(c.items()), i)
        return out

    def index_of(self, config: Mapping[str, Any]) -> int | None:
        """The position of `config` in the space (as list.index finds it, without a walk per
        call: a build asks once per bucket); None when it is not in it."""
        try:
            return self._positions.get(frozenset(config.items()))
        except TypeError:  # a value that cannot be hashed is no config of a space
            return None

    @property
    def types(self) -> dict[str, str]:
        return self.variants[0].types_dict if self.variants else {}

    def compile_job(self, index: int, arch: str) -> CompileJob:
        return self.variants[index].compile_job(arch, self.spec.entry, self.spec.nvrtc_options)

    def rules(self, arch: str) -> PointRules:
        """What excludes a config at a point on `arch` (plan/exclusions.py), made once per arch."""
        if arch not in self._rules:
            self._rules[arch] = PointRules(self.spec, self.types, self.configs, arch)
        return self._rules[arch]

    def exclusion(self, point: Point, index: int) -> Exclusion | None:
        """Why config `index` may not serve `point` (None: it may)."""
        return self.rules(point.id.arch).exclusion(index, point.bucket.as_dict())

    def excluded(self, point: Point) -> dict[int, Exclusion]:
        """Every config that may not serve `point`, by index."""
        return self.rules(point.id.arch).excluded(point.bucket.as_dict())

    def candidates(self, point: Point) -> list[int]:
        """The configs that may serve `point`, in canonical order: what its tuning measures."""
        return self.rules(point.id.arch).candidates(point.bucket.as_dict())

    def point_default(self, point: Point) -> int | None:
        """What an untuned `point` runs: the default config where it may serve the point, else
        the first config in canonical order that may; None when none may."""
        rules, bucket = self.rules(point.id.arch), point.bucket.as_dict()
        if rules.exclusion(self.default_index, bucket) is None:
            return self.default_index
        return next(rules.allowed(bucket), None)


@dataclass
class Plan:
    """What a project renders, serves and checks against its lock, for one set of target archs."""

    project: ProjectSpec
    archs: tuple[str, ...]
    ptx: dict[str, str]  # table arch -> the PTX arch compiled from its winners
    compiler: str  # NVRTC major.minor
    policy: NvrtcPolicy
    lock: LockFile
    instances: list[Instance]

    def winner_index(self, inst: Instance, point: Point) -> int | None:
        """The position of the lock's valid winner in the space; None when the entry cannot be
        used (see LockFile.problem) or its config is no longer in the space."""
        entry = self.lock.valid(point.eid, point.checksum, self.policy)
        if entry is None:
            return None
        return inst.index_of(entry.config)

    def shipped(self, inst: Instance, arch: str) -> set[int]:
        """The variants a build ships for one type instance on one arch if they compile: the
        lock's valid winners, the plain arch's winners an untuned arch-specific point inherits
        (`inherited_index`) and the defaults (`defaults`); a config that may serve no point of
        the arch is not among them, so it is never compiled."""
        wanted = self.defaults(inst, arch)
        for p in inst.points[arch]:
            index = self.winner_index(inst, p)
            if index is not None and inst.exclusion(p, index) is None:
                wanted.add(index)
            elif (inherited := self.inherited_index(inst, p)) is not None:
                wanted.add(inherited)
        return wanted

    def inherited_index(self, inst: Instance, point: Point) -> int | None:
        """What an untuned point of an arch-specific or family target (sm_90a, sm_100f) runs
        before its default: the lock's valid winner of the same bucket on the plain arch of the
        same compute capability (sm_90), where the project targets that too and the winner may
        serve the point. A GPU of 9.0 runs sm_90a's cubins first, so without it adding sm_90a to
        `archs` would trade sm_90's tuned winners for defaults until a GPU tunes sm_90a."""
        plain = plain_arch(point.id.arch)
        if plain == point.id.arch:
            return None
        for p in inst.points.get(plain, ()):
            if p.key == point.key:
                index = self.winner_index(inst, p)
                return index if index is not None and inst.exclusion(point, index) is None else None
        return None

    def defaults(self, inst: Instance, arch: str) -> set[int]:
        """The configs the untuned points of one type instance on one arch run
        (Instance.point_default): the default config, and where it may not serve a point the
        point's fallback. Each must compile, as the default must (default_failure)."""
        return {d for p in inst.points[arch] if (d := inst.point_default(p)) is not None}

    def compilable(self, inst: Instance, arch: str) -> set[int]:
        """The configs of one type instance that may serve some point on `arch`: the most a
        build compiles for it (a config excluded at every point is never compiled)."""
        out: set[int] = set()
        for p in inst.points[arch]:
            out.update(inst.candidates(p))
        return out

    def broken_defaults(self, usable: Mapping[tuple[int, str], Mapping[int, bool]], logs: Any) -> list[tuple[Instance, str, str, int]]:
        """The defaults (`defaults`) that did not compile, each (instance, arch, NVRTC log,
        config index), for default_failure; `usable` and `logs` are by (instance number, arch),
        then config index (`logs[k][i].log` the compile log)."""
        out = []
        for (n, arch), ok in usable.items():
            inst = self.instances[n]
            for i in sorted(self.defaults(inst, arch)):
                if i in ok and not ok[i]:
                    out.append((inst, arch, logs[(n, arch)][i].log, i))
        return out

    def choose(self, inst: Instance, point: Point, usable: Mapping[int, bool]) -> Choice | None:
        """The lock's winner when its entry is valid and its variant compiled; else the default;
        else (the default failed to compile: an error unless default-may-fail, see
        default_failure) the first variant that compiled. `usable` holds the variants compiled
        so far; None when the answer depends on one not compiled yet."""
        reason = self.lock.problem(point.eid, point.checksum, self.policy)
        if reason is None:
            index = self.winner_index(inst, point)
            excluded = inst.exclusion(point, index) if index is not None else None
            if index is None:
                reason = "the lock's winner is no longer in the space"
            elif excluded is not None:
                reason = f"the lock's winner {inst.variants[index].label} may not run here: it {excluded.reason}"
            elif index not in usable:
                return None
            elif usable[index]:
                d = inst.point_default(point)  # shipped too (`shipped`), for a run-time pin of the default
                return tuned_choice(index, self.lock.entries[point.eid], d if d is not None and usable.get(d) else None)
            else:
                reason = f"the lock's winner {inst.variants[index].label} failed to compile"
        inherited = self.inherited_index(inst, point)
        if inherited is not None:
            if inherited not in usable:
                return None
            if usable[inherited]:
                d = inst.point_default(point)  # shipped too, for a run-time pin of the default (runtime/pins.py)
                default = d if d is not None and d != inherited and usable.get(d) else None
                why = f"{reason}; {plain_arch(point.id.arch)}'s tuned winner of the bucket"
                return Choice(inherited, False, {}, why, fallback=True, default_index=default)
        d = inst.point_default(point)
        if d is None:  # make_plan refuses such a point; a plan made otherwise has nothing to ship here
            return None
        if d != inst.default_index:
            moved = inst.exclusion(point, inst.default_index)
            assert moved is not None
            reason = f"{reason}; the default config may not run here (it {moved.reason}), so the first config that may"
        if d not in usable:
            return None
        if usable[d]:
            return Choice(d, False, {}, reason, fallback=d != inst.default_index)
        for i in inst.rules(point.id.arch).allowed(point.bucket.as_dict()):
            if i not in usable:
                return None
            if usable[i]:
                what = "the default config" if d == inst.default_index else f"that config, {inst.variants[d].label},"
                why = f"{reason}; {what} does not compile, so the first config that does (default-may-fail = true)"
                return Choice(i, False, {}, why, fallback=True)
        return None  # nothing compiled: the caller reports every variant's failure

    def default_failure(self, failed: Sequence[tuple[Instance, str, str] | tuple[Instance, str, str, int]]) -> str:
        """The error for default configs that do not compile, each (instance, arch, NVRTC log)
        or (instance, arch, log, config index: a point's fallback where the default may not
        run, broken_defaults): every untuned entry runs its default, so a build stops unless
        the project opted into default-may-fail. The build and the tuner both raise it."""
        inst, arch, log = failed[0][:3]
        index = failed[0][3] if len(failed[0]) > 3 else inst.default_index
        others = [f"{f[0].spec.name} ({instance_text(f[0].types_key)}) on {f[1]}" for f in failed[1:]]
        also = f"\nThe default config does not compile either for: {', '.join(others)}." if others else ""
        what = "the default config" if index == inst.default_index else "the config that replaces the default where it may not run"
        return (
            f"hatch-autotune: {what} of kernel {inst.spec.name!r} ({instance_text(inst.types_key)}) does not compile "
            f"for {arch}: {inst.variants[index].label}; NVRTC said:\n{indent(log_excerpt(log))}{also}\n"
            f"`{inst.variants[index].render_command()}` prints its source with the line numbers NVRTC cites. "
            "Every untuned entry runs its kernel's default config, so it must compile: fix the template or the kernel's "
            "`default`, or set `default-may-fail = true` in the hook table to fall back to the first config that compiles "
            "(the wheel's outcome record, `hatch-autotune show WHEEL`, then names each such entry)."
        )

    def to_tune(self, archs: Sequence[str], mode: Mode) -> tuple[list[tuple[str, Instance, list[Point]]], int]:
        """Per arch and type instance, the points to tune: those a build could not use
        (missing, stale, or refused by exact-nvrtc), or all of them in `retune`; and how many
        were still valid."""
        todo, skipped = [], 0
        for arch in archs:
            for inst in self.instances:
                points = [p for p in inst.points[arch] if mode == Mode.RETUNE or self.lock.valid(p.eid, p.checksum, self.policy) is None]
                skipped += len(inst.points[arch]) - len(points)
                if points:
                    todo.append((arch, inst, points))
        problem = tuning_size(todo)
        if problem:
            raise BuildError(f"hatch-autotune: {problem}")
        return todo, skipped


def tuning_size(todo: Sequence[tuple[str, Instance, Sequence[Point]]]) -> str | None:
    """What is wrong with the size of a tuning run (the configs its searches measure, each
    bucket's at most `search.configs_tried`, over every bucket, instance and arch) when it is
    over MAX_TUNING_RUNS, the biggest kernel's factors named; None when it is within."""
    runs: dict[str, int] = {}
    factors: dict[str, tuple[int, int, set[str], set[str]]] = {}  # kernel -> configs, buckets, archs, instances
    for arch, inst, points in todo:
        name, tried = inst.spec.name, inst.spec.search.configs_tried(len(inst.variants))
        runs[name] = runs.get(name, 0) + tried * len(points)
        configs, buckets, archs, instances = factors.get(name, (0, 0, set(), set()))
        factors[name] = (max(configs, tried), max(buckets, len(points)), archs | {arch}, instances | {inst.types_key})
    total = sum(runs.values())
    if total <= MAX_TUNING_RUNS:
        return None
    name = max(runs, key=lambda k: runs[k])
    configs, buckets, archs, instances = factors[name]
    product = configs * buckets * len(archs) * len(instances)
    of = f"{configs:,} configs per bucket x {buckets:,} buckets x {len(archs)} arch(s) x {len(instances):,} instance(s)"
    alone = f"{runs[name]:,} ({of})" if product == runs[name] else f"{runs[name]:,} (up to {of})"
    return (
        f"this tuning run would measure {total:,} configs, more than the {MAX_TUNING_RUNS:,} one run may (each up to "
        f"`budget-ms` of GPU time); kernel {name!r} alone: {alone}. Measure fewer configs per bucket (a search budget, "
        f'e.g. search = {{ budget = "5%" }}), declare fewer buckets, or tune fewer archs or kernels at a time '
        "(`hatch-autotune tune --kernel NAME`)"
    )


def instance_points(spec: KernelSpec, types_key: str, variants: Sequence[Variant], arch: str) -> list[Point]:
    """Every bucket of a kernel's type instance on `arch`, with its lock id and checksum."""
    hashes = [v.source_hash for v in variants]
    names = [k.name for k in spec.key]
    out = []
    for key in bucket_points([k.buckets for k in spec.key]):
        bucket = Bucket.from_values(names, key)
        out.append(Point(EntryId(spec.name, types_key, arch, bucket), entry_checksum(spec, types_key, hashes, arch, bucket)))
    return out


def check_candidates(inst: Instance) -> None:
    """BuildError naming the first point of the instance that no config may serve (every one
    fails a point constraint there, or asks more than its arch allows)."""
    for arch, points in inst.points.items():
        for p in points:
            if inst.point_default(p) is None:
                raise BuildError(
                    no_candidate(inst.spec, "" if inst.types_key == "-" else inst.types_key, arch, p.bucket.as_dict(), inst.excluded(p))
                )


def _to_stderr(line: str) -> None:
    """The log of a caller that passes none (`show PROJECT`): off stdout, which holds its result."""
    print(line, file=sys.stderr)


def _rendered(spec: KernelSpec, log: Log) -> dict[str, list[Variant]]:
    """render_kernel, saying so when the kernel is big enough to take a while."""
    walked = count_points([*spec.space.values(), *spec.types.values(), *spec.constants.values()])
    if walked < RENDER_NOTICE_AT:
        return render_kernel(spec)
    log(f"hatch-autotune: rendering kernel {spec.name!r}: {walked:,} configs before constraints, over its type instances")
    started = time.monotonic()
    rendered = render_kernel(spec)
    n = sum(len(v) for v in rendered.values())
    log(f"hatch-autotune: rendered kernel {spec.name!r}: {n:,} variants in {time.monotonic() - started:.1f} s")
    return rendered


def make_plan(
    project: ProjectSpec,
    archs: Sequence[str],
    *,
    log: Log = _to_stderr,
    compiler: str | None = None,
    lock: LockFile | None = None,
    kernels: Sequence[str] | None = None,
) -> Plan:
    """Render every kernel (or only those named in `kernels`) once and find every point it
    serves on `archs`; read the lock file (its warnings are logged, as is the rendering of a big
    kernel; to stderr without a `log`; a newer schema is a LockFormatError). `compiler`: NVRTC's
    major.minor, asked of NVRTC when not given."""
    from ..compile import nvrtc as compile_mod

    archs = tuple(archs)
    if not compiler:  # the project's NVRTC: it must also know the archs, said before anything renders
        compiler = compile_mod.nvrtc_version(project.min_cuda)
        compile_mod.check_archs(archs, project.min_cuda)
    if lock is None:
        lock = LockFile.load(project.lock_file)
        for w in lock.warnings:
            log(f"warning: {w}")
    instances = []
    for spec in project.kernels.values():
        if kernels and spec.name not in kernels:
            continue
        check_hooks(spec)
        for tkey, variants in _rendered(spec, log).items():
            inst = Instance(spec, tkey, variants, [v.config_dict for v in variants].index(dict(spec.default)))
            inst.points = {arch: instance_points(spec, tkey, variants, arch) for arch in archs}
            check_candidates(inst)
            instances.append(inst)
    ptx = ptx_archs(archs) if project.ptx else {}
    return Plan(project, archs, ptx, compiler, NvrtcPolicy(compiler, project.exact_nvrtc), lock, instances)
