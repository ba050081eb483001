"""Checks that need a whole kernel, made once its table has parsed: names that would shadow one
another, bounds on what is enumerated (configs, bucket points, instances), and for every
instance the constraints, the default config, the argument sizes and the launch geometry at
every bucket. Each problem is one line naming its key. (The compile options the cache key
cannot see are refused as the table is read: kernel_table.v_nvrtc_options.)"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..runtime import INT_RANGES, MAX_SIZE, ExpressionError, short_repr, value_text
from ..runtime.selection import ARCH_NAMES
from . import space as space_mod
from .args import TOOLKIT_CTYPES, TOOLKIT_ONLY
from .expr import Expr
from .kernel import KernelSpec
from .space import MAX_VARIANTS, ConstraintError, SpaceTooLarge, bucket_points, corner_points, count_points, enumerate_configs, size_problem
from .validate import Table

# Bounds that keep the config check (and what follows it) finite; see the README's table.
MAX_BUCKET_POINTS = 10_000  # points of a kernel's key grid (tuning runs at every one)
MAX_INSTANCES = 1_000  # combinations of a kernel's type parameters and constants
GEOMETRY_CHECKS = 200_000  # (config, point) pairs whose launch geometry is checked in full
# What a launch can take at most, whatever the GPU: a grid's x up to 2**31 - 1 blocks (y and z: 65535),
# a block of at most 1024 threads, no GPU has 4 GiB of shared memory per block, and a cluster has at
# most 8 blocks (the portable cluster size).
MAX_CLUSTER_SIZE = 8
_GEOMETRY_MAX = {"grid": 2**31 - 1, "block": 1024, "shared": 2**32 - 1, "cluster": MAX_CLUSTER_SIZE}
_GRID_YZ_MAX = 65535  # a grid's y and z (its x: 2**31 - 1)


def check_kernel(spec: KernelSpec, t: Table) -> bool:
    """Whether the kernel passes every check; each problem found is added to t.errors. The
    checks of the declaration stop at the first problem; the per-instance ones report each
    problem once, naming the instances it holds for."""
    problem = _declaration_problem(spec, t)
    if problem:
        t.errors.append(problem)
        return False
    return _check_instances(spec, t)


def toolkit_dtype_use(spec: KernelSpec) -> str | None:
    """Why the kernel needs the toolkit's headers and does not declare them: a dtype whose C type
    only they define (bfloat16, FP8, complex) in an argument or a type parameter's values."""
    if spec.toolkit_headers:
        return None
    used = [(f"argument {a.name!r}", a.dtype) for a in spec.args] + [
        (f"type parameter {n!r}", d) for n, ds in spec.types.items() for d in ds
    ]
    for where, dtype in used:
        if dtype in TOOLKIT_ONLY:
            return (
                f"{where} is {dtype}, whose C type ({TOOLKIT_CTYPES[dtype]}) the toolkit's headers define: add "
                f'`headers = ["cuda"]` to the kernel (or the hook table) and #include the header that defines it in the template'
            )
    return None


def _declaration_problem(spec: KernelSpec, t: Table) -> str | None:
    """The first problem of the kernel as declared, before any instance is enumerated (both
    spaces are counted before anything walks them)."""
    clash = name_clashes(spec)
    if clash:
        return f"{t.path}: {clash}"
    needs_toolkit = toolkit_dtype_use(spec)
    if needs_toolkit:
        return f"{t.path}: {needs_toolkit}"
    too_big = size_problem(spec.space, {**spec.types, **spec.constants}, spec.max_configs)
    if too_big:
        return f"{t.sub('space')}: {too_big}"
    n_points = count_points(k.buckets for k in spec.key)
    if n_points > MAX_BUCKET_POINTS:
        return f"{t.sub('key')}: the buckets make {n_points:,} tuning points; at most {MAX_BUCKET_POINTS:,} are allowed"
    n_instances = count_points([*spec.types.values(), *spec.constants.values()])
    if n_instances > MAX_INSTANCES:
        return (
            f"{t.path}: the type parameters and constants make {n_instances:,} instances, each rendered, compiled and tuned "
            f"apart; at most {MAX_INSTANCES:,} are allowed"
        )
    size_error = check_sizes(spec)
    if size_error:
        return f"{t.path}: {size_error}"
    return None


def _check_instances(spec: KernelSpec, t: Table) -> bool:
    """Every instance's space: the constraints evaluate and leave a config, the default is one
    of them, and the launch geometry holds."""
    errors = t.errors
    instances = spec.type_instances()
    grouped: dict[tuple[str, str], list[str]] = {}  # (key path, problem) -> the instances it holds for
    kept = 0  # configs kept so far, over the instances: at most MAX_VARIANTS, whatever max-configs allows
    walked = count_points(spec.space.values()) * len(instances)
    started = time.monotonic()
    if walked > space_mod.MAX_WALKED:  # only with a raised max-configs: say why the build is quiet for a while
        _notice(f"checking kernel {spec.name!r}: {walked:,} configs over its {len(instances):,} instance(s), at a few µs each")
    for types_ in instances:
        label = ", ".join(f"{k}={value_text(v)}" for k, v in types_.items())
        try:
            configs = enumerate_configs(spec.space, spec.instance_constraints, spec.type_env(types_), limit=MAX_VARIANTS - kept)
        except SpaceTooLarge:
            errors.append(
                f"{t.sub('constraints')}: the constraints keep more than {MAX_VARIANTS:,} configs over the kernel's "
                f"{len(instances):,} instance(s), the most a kernel may have whatever `max-configs` allows: each is rendered "
                "in every build and compiled for every arch when tuned. Tighten the constraints or shrink the axes"
            )
            return False
        except ConstraintError as exc:  # e.g. division by zero for some config, or a bound exceeded
            errors.append(
                f"{t.sub('constraints')}[{spec.constraints.index(spec.instance_constraints[exc.index])}]: "
                f"{spec.instance_constraints[exc.index].text!r} cannot be evaluated for "
                f"{exc.config}{f' (for {label})' if label else ''}: {exc.cause}"
            )
            return False
        kept += len(configs)
        if not configs:
            grouped.setdefault((t.sub("constraints"), "the constraints exclude every config of the space"), []).append(label)
        elif dict(spec.default) not in configs:
            broken = violated(spec, types_)
            grouped.setdefault((t.sub("default"), f"the default {dict(spec.default)!r} violates {broken}"), []).append(label)
        geometry_error = check_geometry(spec, types_, configs)
        if geometry_error:
            grouped.setdefault((t.path, geometry_error), []).append(label)
    if walked > space_mod.MAX_WALKED:
        _notice(f"checked kernel {spec.name!r}: {kept:,} configs kept of {walked:,} in {time.monotonic() - started:.1f} s")
    for (where_, problem), labels in grouped.items():  # once per problem, naming the instances it holds for
        holds_for = "" if len(labels) == len(instances) else f" (for {'; '.join(labels)})"
        errors.append(f"{where_}: {problem}{holds_for}")
    return not grouped


def _notice(line: str) -> None:
    """A progress line of the config check, which has no log of its own: stderr, where the
    hook's and the command's own lines go."""
    print(f"hatch-autotune: {line}", file=sys.stderr, flush=True)


def violated(spec: KernelSpec, types: Mapping[str, Any]) -> str:
    """Which constraints the default config breaks for an instance, each by index and text."""
    env = {**spec.default, **spec.type_env(types)}
    broken = []
    for i, c in enumerate(spec.constraints):
        if spec.is_point_constraint(c):
            continue
        try:
            holds = c(env)
        except ExpressionError:
            holds = False
        if not holds:
            broken.append(f"constraints[{i}] {c.text!r}")
    return " and ".join(broken) or "the constraints"


def name_clashes(spec: KernelSpec) -> str | None:
    """Axes, type parameters (and their _size/_dtype), constants, key dims and `entry` share one
    namespace in templates and launch expressions; a clash would silently shadow one of them.
    Constants are also keywords of a call, next to its arguments."""
    owners: dict[str, str] = {"entry": "the template variable `entry`"}
    for tp in spec.types:
        for name in (tp, f"{tp}_size", f"{tp}_dtype"):
            owners.setdefault(name, f"type parameter {tp}")
    # A call takes the arguments, the constants and `stream=` by keyword; select() the key dims,
    # type parameters, constants and `arch=`; both are methods (`self`).
    reserved = {"self": "the kernel object's `self`", "stream": "the call's `stream=`", "arch": "select()'s `arch=`"}
    call_words = ("self", "stream")
    select_words = ("self", "arch")
    keywords: list[tuple[str, Any, tuple[str, ...]]] = [
        ("argument", [a.name for a in spec.args if not a.computed], call_words),
        ("constant", spec.constants, call_words + select_words),
    ]
    keywords += [("key dim", [k.name for k in spec.key], select_words), ("type parameter", spec.types, select_words)]
    for kind, names, words in keywords:
        for name in names:
            if name in words:
                return f"{kind} {name!r} has the same name as {reserved[name]}; rename it"
    arguments = {a.name for a in spec.args}
    for name in spec.constants:
        if name in arguments:
            return f"constant {name!r} has the same name as argument {name}; rename one"
    strides = [n for a in spec.args for n in a.stride_names()]
    named = (("constant", spec.constants), ("axis", spec.space), ("key dim", [k.name for k in spec.key]), ("free dim", spec.dims))
    for kind, names in (*named, ("stride", strides), ("the target's", ARCH_NAMES if spec.point_constraints else ())):
        for name in names:
            if name in owners:
                return f"{kind} {name!r} has the same name as {owners[name]}; rename one"
            owners[name] = f"{kind} {name}"
    return None


def check_geometry(spec: KernelSpec, types: Mapping[str, str], configs: list[dict[str, Any]]) -> str | None:
    """grid/block/shared (and cluster) must give positive integers within CUDA's limits for every
    config at every bucket where it may run: a point constraint that reads only key dims and
    fails there takes the pair out (one that reads `arch` is checked per arch by the planner).
    The grid's x goes up to 2**31 - 1, its y and z to 65535; a cluster has at most
    MAX_CLUSTER_SIZE blocks and divides the grid in each dim. Above GEOMETRY_CHECKS pairs, every
    config is checked at the grid's corners (each dim's smallest and largest bucket) and every
    point with the default config: bounded time, and what the geometry usually depends on
    monotonically is still covered."""
    points = bucket_points([k.buckets for k in spec.key])
    pairs: Any = ((p, c) for p in points for c in configs)
    if len(points) * len(configs) > GEOMETRY_CHECKS:
        corners = corner_points([k.buckets for k in spec.key])
        pairs = itertools.chain(((p, c) for p in corners for c in configs), ((p, dict(spec.default)) for p in points))
    type_env = spec.type_env(types)
    names = [k.name for k in spec.key]
    per_point = [(i, c) for i, c in spec.point_constraints if c.names.isdisjoint(ARCH_NAMES)]
    cluster = spec.cluster or ()
    for point, config in pairs:
        key = dict(zip(names, point))
        env = {**key, **spec.dims, **config, **type_env}
        for i, c in per_point:
            try:
                holds = c(env)
            except ExpressionError as exc:
                return f"constraints[{i}] {c.text!r} cannot be evaluated for {config} at {key}: {exc}"
            if not holds:
                break
        else:
            problem = _geometry_problem(spec, env, config, key, cluster)
            if problem:
                return problem
    return None


def _geometry_problem(
    spec: KernelSpec, env: Mapping[str, Any], config: Mapping[str, Any], key: Mapping[str, int], cluster: Any
) -> str | None:
    """What is wrong with one config's launch at one bucket, or None."""
    values: dict[str, list[int]] = {}
    for what, exprs, minimum in (("grid", spec.grid, 1), ("block", spec.block, 1), ("shared", (spec.shared,), 0), ("cluster", cluster, 1)):
        for d, e in enumerate(exprs):
            try:
                value = e(env)
            except ExpressionError as exc:  # e.g. division by zero for some config, or a bound exceeded
                return f"{what} expression {e.text!r} fails for {config} at {key}: {exc}"
            most = _GRID_YZ_MAX if what == "grid" and d > 0 else _GEOMETRY_MAX[what]
            if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= most:
                dim = f"[{d}] ({'xyz'[d]})" if what == "grid" and d > 0 else ""
                limit = f"; CUDA allows at most {most} blocks in a grid's y and z" if dim else ""
                return (
                    f"{what}{dim} expression {e.text!r} gives {short_repr(value)} for {config} at {key}; expected an integer "
                    f"from {minimum} to {most} (use // or cdiv for division){limit}"
                )
            values.setdefault(what, []).append(value)
    if cluster:
        dims = values["cluster"]
        if math.prod(dims) > MAX_CLUSTER_SIZE:
            return (
                f"cluster {[e.text for e in cluster]} gives {'x'.join(map(str, dims))} = {math.prod(dims)} blocks for {config} at "
                f"{key}; a cluster has at most {MAX_CLUSTER_SIZE} blocks (the portable size)"
            )
        grid = values["grid"] + [1] * (3 - len(values["grid"]))
        for d, size in enumerate(dims):
            if grid[d] % size:
                return (
                    f"grid {'xyz'[d]} ({grid[d]}) is not a multiple of cluster {'xyz'[d]} ({size}) for {config} at {key}; "
                    "the grid must be a whole number of clusters in each dim"
                )
    return None


def check_sizes(spec: KernelSpec) -> str | None:
    """Every bucket point gives array shapes that are sizes and scalars that fit their declared
    type: a bucket of 2**62 feeding an int32 is an error here, not an overflow at call time."""
    by_name = {a.name: a for a in spec.args}
    for k in spec.key:
        arg = by_name[k.source]
        if not arg.is_array and arg.dtype in INT_RANGES:
            _lo, hi = INT_RANGES[arg.dtype]
            if k.buckets[-1] > hi:
                return f"key dim {k.name!r} has bucket {k.buckets[-1]}, which does not fit in argument {arg.name!r} ({arg.dtype}, at most {hi})"
    names = [k.name for k in spec.key]
    constant_sets: list[dict[str, Any]] = [{}]
    for cname, values in spec.constants.items():
        constant_sets = [{**c, cname: v} for c in constant_sets for v in values]
    points = bucket_points([k.buckets for k in spec.key])  # at most MAX_BUCKET_POINTS
    if len(points) * len(constant_sets) > GEOMETRY_CHECKS:  # bounded, as in check_geometry
        points = corner_points([k.buckets for k in spec.key])
    strides = {n for a in spec.args for n in a.stride_names()}
    for point, consts in itertools.product(points, constant_sets):
        key = {**dict(zip(names, point)), **spec.dims, **consts}
        for a in spec.args:
            for i, e in enumerate(a.shape or ()):
                what = f"shape[{i}] of argument {a.name!r}"
                problem = evaluate_int(e, key, 0, MAX_SIZE)
                if problem:
                    return f"{what}: {e.text!r} {problem} at {key}"
            if a.value is not None and a.dtype in INT_RANGES and not a.value.names & strides:  # strides: known per call
                problem = evaluate_int(a.value, key, *INT_RANGES[a.dtype])
                if problem:
                    return f"value of argument {a.name!r} ({a.dtype}): {a.value.text!r} {problem} at {key}"
    return None


def evaluate_int(e: Expr, env: Mapping[str, Any], lo: int, hi: int) -> str | None:
    """What is wrong with an expression's value as an integer in [lo, hi], or None."""
    try:
        value = e(env)
    except ExpressionError as exc:  # e.g. division by zero at some bucket, or a bound exceeded
        return f"fails ({exc})"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"gives {short_repr(value)}, not an integer"
    if not lo <= value <= hi:
        return f"gives {value}, outside [{lo}, {hi}]"
    return None
