"""The configuration schema: the hook's pyproject.toml table -> typed, validated specs.

Every problem in the table is collected and reported at once, each with its full TOML key path
and what was expected (the experience of hatch-fancy-pypi-readme). One small set of generic
validators does the checking, rather than a hand-written property per key.
"""

from __future__ import annotations

import itertools
import keyword
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from . import expr as expr_mod
from .expr import Expr
from ..runtime import DTYPE_SIZES, INT_RANGES, MAPPINGS, MAX_SIZE, MIN_SM, ExpressionError, instance_env, parse_arch, short_repr, value_text
from .space import ConstraintError, bucket_points, corner_points, count_points, enumerate_configs

# dtype name -> C type used in templates. float16 maps to `at_half`, a two-byte struct defined
# in templates/_dtypes.cuh (NVRTC ships no cuda_fp16.h).
_CTYPES = {
    "float16": "at_half",
    "float32": "float",
    "float64": "double",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
}
# dtype name -> (C type, size in bytes); the sizes are the runtime's, which the wheel uses too.
DTYPES: dict[str, tuple[str, int]] = {name: (ctype, DTYPE_SIZES[name]) for name, ctype in _CTYPES.items()}
INTENTS = ("in", "out", "inout")
MODES = ("auto", "offline", "tune", "retune")
# hatchling's own keys in every build-hook table.
HATCHLING_HOOK_KEYS = frozenset(
    {"dependencies", "require-runtime-dependencies", "require-runtime-features", "enable-by-default"}
)
BUILTIN_PREFIX = "builtin:"
DEFAULT_LOCK_FILE = "autotune.lock.json"
DEFAULT_TABLE_PATH = "tool.hatch.build.targets.wheel.hooks.autotune"
# Bounds that keep the config check (and what follows it) finite; see the README's table.
DEFAULT_MAX_CONFIGS = 100_000  # axis combinations before constraints, per kernel (`max-configs`)
MAX_BUCKET_POINTS = 10_000  # points of a kernel's key grid (tuning runs at every one)
MAX_INSTANCES = 1_000  # combinations of a kernel's type parameters and constants
GEOMETRY_CHECKS = 200_000  # (config, point) pairs whose launch geometry is checked in full
_WHEEL_TAG = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+")  # python-abi-platform

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # always fullmatch: `$` would accept a trailing newline
_BAD = object()  # a validator's "already reported" result


class ConfigError(ValueError):
    """All problems found in the table; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"hatch-autotune: {len(self.errors)} error(s) in the configuration:\n{lines}")


# --------------------------------------------------------------------------------------------
# Specs.


@dataclass(frozen=True)
class ArgSpec:
    """A kernel argument: an array (shape over key dims, intent) or a scalar."""

    name: str
    dtype: str  # a dtype name, or the name of one of the kernel's type parameters
    shape: tuple[Expr, ...] | None = None  # None for scalars
    intent: str | None = None  # arrays only
    value: Expr | None = None  # scalars computed from key dims (the caller does not pass them)
    align: int | None = None  # arrays: required byte alignment of the pointer (vector loads)

    @property
    def is_array(self) -> bool:
        return self.shape is not None


@dataclass(frozen=True)
class KeyDim:
    """A named integer that drives selection, read at run time from an argument."""

    name: str
    source: str  # argument name
    axis: int | None  # axis of the source array; None when the source is a scalar
    buckets: tuple[int, ...]
    mapping: str


SEARCH_STRATEGIES = ("exhaustive", "random", "local", "tpe", "auto")  # tuning/search.py implements each


@dataclass(frozen=True)
class SearchSpec:
    """How much of a space to measure, and in what order (tuning/search.py): every config, or
    what a strategy picks within a budget of configs (a count, or "N%" of the space) and/or
    seconds. The previous winner and the neighbouring buckets' winners go first (warm start)."""

    strategy: str = "exhaustive"
    budget: int | str | None = None  # configs: a count, or "N%" of the instance's space
    seed: int = 0
    seconds: float | None = None  # compile and measuring time per bucket
    warm_start: bool = True

    def configs_budget(self, space_size: int) -> int | None:
        """The budget in configs for a space of this size (at least 1); None: no count limit."""
        if isinstance(self.budget, str):
            return max(1, math.ceil(float(self.budget[:-1]) / 100 * space_size))
        return self.budget

    def checksum_fields(self) -> list[Any]:
        """What enters a lock entry's checksum: the three fields the first format had, then only
        the settings that differ from their defaults, so that old entries stay valid."""
        first = ("strategy", "budget", "seed")
        extra = ([f.name, getattr(self, f.name)] for f in fields(self) if f.name not in first and getattr(self, f.name) != f.default)
        return [self.strategy, self.budget, self.seed, *extra]


@dataclass(frozen=True)
class KernelSpec:
    name: str
    template: Path
    template_ref: str
    entry: str
    doc: str
    args: tuple[ArgSpec, ...]
    key: tuple[KeyDim, ...]
    types: Mapping[str, tuple[str, ...]]
    space: Mapping[str, tuple[Any, ...]]
    constraints: tuple[Expr, ...]
    default: Mapping[str, Any]
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared: Expr
    nvrtc_options: tuple[str, ...]
    reference: str | None = None  # "module:function" computing expected outputs with NumPy
    inputs: str | None = None  # "module:function" generating a bucket's inputs
    tolerance: tuple[float, float] | None = None  # (rtol, atol); None: by dtype
    search: SearchSpec = SearchSpec()
    max_configs: int = DEFAULT_MAX_CONFIGS  # a larger space is refused before it is enumerated
    # Caller-chosen constants: name -> the values a caller may pass (integers or booleans). Each
    # value is a specialisation like a type parameter's dtype: rendered, compiled, tuned and
    # selected exactly, never tuned over.
    constants: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    root: Path | None = None  # the project folder: `#include "..."` may reach headers inside it

    def type_instances(self) -> list[dict[str, Any]]:
        """Every assignment of the type parameters (dtype names) and the constants (their
        values), in declaration order: the instances that are rendered, tuned and selected."""
        out: list[dict[str, Any]] = [{}]
        for name, values in [*self.types.items(), *self.constants.items()]:
            out = [{**o, name: v} for o in out for v in values]
        return out

    def type_env(self, types: Mapping[str, Any]) -> dict[str, Any]:
        """Names that expressions may use for an instance: `<T>_size` in bytes and each
        constant's value (the runtime's own rule, so the build and the wheel agree)."""
        return instance_env(types)

    def configs(self, types: Mapping[str, str]) -> list[dict[str, Any]]:
        """The search space of one type instance, in canonical order."""
        return enumerate_configs(self.space, self.constraints, self.type_env(types))


@dataclass(frozen=True)
class TuningSpec:
    """Measurement settings (see tuning/bench.py for what each bounds)."""

    budget_ms: float = 100.0  # GPU time spent timing one variant, at most
    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 100
    timeout_s: float = 30.0  # a variant taking longer than this is killed and marked failed
    eliminate: float = 0.25  # stop timing a variant whose fastest sample is this much slower than the leader
    flush_l2: bool = True
    prune_spills: bool = False


@dataclass(frozen=True)
class ProjectSpec:
    root: Path
    module: str
    archs: tuple[str, ...] | None  # None: the build machine's GPU
    lock_file: Path
    strict: bool
    ptx: bool
    mode: str
    wheel_tag: str | None
    kernels: Mapping[str, KernelSpec]
    tuning: TuningSpec = TuningSpec()
    exact_nvrtc: bool = False  # lock entries tuned with another NVRTC major.minor are stale
    default_may_fail: bool = False  # a default config that does not compile: the first that does, not an error


# --------------------------------------------------------------------------------------------
# Generic validators: each takes (value, path, errors) and returns the parsed value or _BAD.

Validator = Callable[[Any, str, list], Any]


def _type_name(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a float"}.get(
        type(value), type(value).__name__
    )


def _fail(errors: list, path: str, expected: str, value: Any) -> Any:
    errors.append(f"{path}: expected {expected}, got {_type_name(value)} {short_repr(value)}")
    return _BAD


def v_str(value: Any, path: str, errors: list) -> Any:
    return value if isinstance(value, str) and value else _fail(errors, path, "a non-empty string", value)


def v_bool(value: Any, path: str, errors: list) -> Any:
    return value if isinstance(value, bool) else _fail(errors, path, "a boolean (true or false)", value)


def v_ident(value: Any, path: str, errors: list) -> Any:
    if isinstance(value, str) and _IDENT.fullmatch(value) and not keyword.iskeyword(value):
        return value
    return _fail(errors, path, "an identifier (letters, digits, _; not starting with a digit)", value)


def v_int(minimum: int | None = None, maximum: int | None = None) -> Validator:
    def check(value: Any, path: str, errors: list) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            return _fail(errors, path, "an integer", value)
        if minimum is not None and value < minimum:
            return _fail(errors, path, f"an integer >= {minimum}", value)
        if maximum is not None and value > maximum:
            return _fail(errors, path, f"an integer <= {maximum}", value)
        return value

    return check


def v_choice(choices: tuple[str, ...]) -> Validator:
    def check(value: Any, path: str, errors: list) -> Any:
        if value in choices:
            return value
        return _fail(errors, path, "one of " + ", ".join(repr(c) for c in choices), value)

    return check


def v_list(item: Validator, nonempty: bool = True, what: str = "") -> Validator:
    def check(value: Any, path: str, errors: list) -> Any:
        if not isinstance(value, list):
            return _fail(errors, path, f"an array{what}", value)
        if nonempty and not value:
            return _fail(errors, path, f"a non-empty array{what}", value)
        items = [item(v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
        return _BAD if any(i is _BAD for i in items) else tuple(items)

    return check


def v_expr(allowed: set[str] | None = None, where: str = "") -> Validator:
    def check(value: Any, path: str, errors: list) -> Any:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return _fail(errors, path, "an expression string or an integer", value)
        try:
            e = expr_mod.parse(value)
        except expr_mod.ExprSyntaxError as exc:
            errors.append(f"{path}: {exc}")
            return _BAD
        unknown = sorted(e.names - allowed) if allowed is not None else []
        if unknown:
            errors.append(
                f"{path}: unknown name(s) {', '.join(unknown)} in {value!r}; "
                f"{where or 'allowed names'}: {', '.join(sorted(allowed)) or 'none'}"
            )
            return _BAD
        return e

    return check


def v_number(minimum: float = 0.0) -> Validator:
    def check(value: Any, path: str, errors: list) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            return _fail(errors, path, f"a number >= {minimum}", value)
        return float(value)

    return check


def v_entry_point(value: Any, path: str, errors: list) -> Any:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        return value
    return _fail(errors, path, "'module:function' (e.g. 'mypkg.reference:saxpy')", value)


def v_wheel_tag(value: Any, path: str, errors: list) -> Any:
    if isinstance(value, str) and _WHEEL_TAG.fullmatch(value):
        return value
    return _fail(errors, path, "a wheel tag 'python-abi-platform' of letters, digits, '_' and '.' (e.g. 'py3-none-manylinux_2_28_x86_64')", value)


def v_arch(value: Any, path: str, errors: list) -> Any:
    try:
        kind, major, minor, _ = parse_arch(value) if isinstance(value, str) else ("", 0, 0, "")
    except ValueError:
        kind = ""
    if kind != "sm":
        return _fail(errors, path, "a CUDA arch such as 'sm_80', 'sm_90' or 'sm_90a'", value)
    if major * 10 + minor < MIN_SM:
        return _fail(errors, path, f"an arch NVRTC 13 can target (sm_{MIN_SM} or newer)", value)
    return value


def v_constant(value: Any, path: str, errors: list) -> Any:
    lo, hi = INT_RANGES["int64"]
    if isinstance(value, bool) or (isinstance(value, int) and lo <= value <= hi):
        return value
    return _fail(errors, path, f"an integer from {lo} to {hi}, or a boolean", value)


def v_space_value(value: Any, path: str, errors: list) -> Any:
    if isinstance(value, (bool, int, str)):
        return value
    return _fail(errors, path, "an integer, boolean or string", value)


class _Table:
    """A TOML table under validation: typed getters that record errors, then unknown keys."""

    def __init__(self, value: Any, path: str, errors: list):
        self.path, self.errors = path, errors
        self.ok = isinstance(value, dict)
        self.data: dict[str, Any] = value if self.ok else {}
        if not self.ok:
            _fail(errors, path, "a table", value)
        self.seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if _IDENT.fullmatch(key.replace("-", "_")) else f'{self.path}."{key}"'

    def get(self, key: str, validator: Validator, default: Any = _BAD, required: bool = False) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if required and self.ok:
                self.errors.append(f"{self.sub(key)}: required key is missing")
            return default
        return validator(self.data[key], self.sub(key), self.errors)

    def table(self, key: str, required: bool = False) -> "_Table | None":
        self.seen.add(key)
        if key not in self.data:
            if required and self.ok:
                self.errors.append(f"{self.sub(key)}: required table is missing")
            return None
        return _Table(self.data[key], self.sub(key), self.errors)

    def finish(self, ignored: frozenset[str] = frozenset()) -> None:
        for key in self.data:
            if key not in self.seen and key not in ignored:
                known = ", ".join(sorted(self.seen)) or "none"
                self.errors.append(f"{self.sub(key)}: unknown key (known keys here: {known})")


# --------------------------------------------------------------------------------------------
# Parsing.


def builtin_templates_dir() -> Path:
    """templates/ as shipped in the wheel (hatch_autotune/templates) or in a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "templates", package.parent / "templates"):
        if candidate.is_dir():
            return candidate
    return package / "templates"


def parse_project(table: Any, root: Path, path: str = DEFAULT_TABLE_PATH, env: Mapping[str, str] | None = None) -> ProjectSpec:
    """Validate the whole hook table; raise ConfigError listing every problem."""
    env = env or {}
    errors: list[str] = []
    t = _Table(table, path, errors)
    module = t.get("module", _module_path, required=True)
    archs = t.get("archs", v_list(v_arch), default=None)
    lock = t.get("lock-file", v_str, default=DEFAULT_LOCK_FILE)
    strict = t.get("strict", v_bool, default=False)
    ptx = t.get("ptx", v_bool, default=True)
    mode = t.get("mode", v_choice(MODES), default="auto")
    wheel_tag = t.get("wheel-tag", v_wheel_tag, default=None)
    lock_outside = t.get("lock-file-outside-project", v_bool, default=False)
    exact_nvrtc = t.get("exact-nvrtc", v_bool, default=False)
    default_may_fail = t.get("default-may-fail", v_bool, default=False)
    tuning_t = t.table("tuning")
    tuning = _parse_tuning(tuning_t) if tuning_t is not None else TuningSpec()
    kernels_t = t.table("kernels", required=True)
    t.finish(HATCHLING_HOOK_KEYS)

    if env.get("HATCH_AUTOTUNE_MODE"):
        mode = v_choice(MODES)(env["HATCH_AUTOTUNE_MODE"], "environment variable HATCH_AUTOTUNE_MODE", errors)
    if env.get("HATCH_AUTOTUNE_ARCHS"):
        archs = v_list(v_arch)(
            [a.strip() for a in env["HATCH_AUTOTUNE_ARCHS"].split(",") if a.strip()],
            "environment variable HATCH_AUTOTUNE_ARCHS",
            errors,
        )
    lock_path = _lock_path(lock, root, lock_outside, f"{path}.lock-file", errors) if lock is not _BAD and lock_outside is not _BAD else _BAD
    if archs not in (None, _BAD) and len(set(archs)) != len(archs):
        errors.append(f"{path}.archs: expected distinct archs, got {list(archs)!r}")

    kernels: dict[str, KernelSpec] = {}
    if kernels_t is not None and kernels_t.ok:
        if not kernels_t.data:
            errors.append(f"{kernels_t.path}: expected at least one kernel table")
        for name in kernels_t.data:
            kernels_t.seen.add(name)
            if v_ident(name, kernels_t.sub(name), errors) is _BAD:
                continue
            if name.startswith("_") or name == "provenance":
                errors.append(f"{kernels_t.sub(name)}: a kernel may not be named 'provenance' or start with '_' (the generated module uses those names)")
                continue
            spec = _parse_kernel(name, _Table(kernels_t.data[name], kernels_t.sub(name), errors), root)
            if spec is not None:
                kernels[name] = spec
    if errors:
        raise ConfigError(errors)
    return ProjectSpec(
        root=root,
        module=module,
        archs=tuple(archs) if archs else None,
        lock_file=lock_path,
        strict=strict,
        ptx=ptx,
        mode=mode,
        wheel_tag=wheel_tag,
        kernels=kernels,
        tuning=tuning,
        exact_nvrtc=exact_nvrtc,
        default_may_fail=default_may_fail,
    )


def _lock_path(lock: str, root: Path, outside_allowed: bool, path: str, errors: list) -> Any:
    """The lock file's path: inside the project (a tune replaces the file, so a mistyped
    `/etc/...` or `../..` must not point it elsewhere) unless `lock-file-outside-project`."""
    candidate = (root / lock).resolve()
    if not outside_allowed and not candidate.is_relative_to(root.resolve()):
        errors.append(
            f"{path}: {lock!r} is outside the project ({candidate}); tuning replaces this file, so it must be "
            "inside the project, unless `lock-file-outside-project = true` says otherwise"
        )
        return _BAD
    if candidate.is_dir():
        errors.append(f"{path}: {lock!r} is a directory; expected the lock file's path (e.g. 'autotune.lock.json')")
        return _BAD
    return root / lock


def _parse_tuning(t: _Table) -> TuningSpec:
    d = TuningSpec()
    spec = TuningSpec(
        budget_ms=t.get("budget-ms", v_number(0.001), default=d.budget_ms),
        warmup=t.get("warmup", v_int(0), default=d.warmup),
        min_reps=t.get("min-reps", v_int(1), default=d.min_reps),
        max_reps=t.get("max-reps", v_int(1), default=d.max_reps),
        timeout_s=t.get("timeout-s", v_number(0.1), default=d.timeout_s),
        eliminate=t.get("eliminate", v_number(0.0), default=d.eliminate),
        flush_l2=t.get("flush-l2", v_bool, default=d.flush_l2),
        prune_spills=t.get("prune-spills", v_bool, default=d.prune_spills),
    )
    t.finish()
    if all(v is not _BAD for v in (spec.min_reps, spec.max_reps)) and spec.min_reps > spec.max_reps:
        t.errors.append(f"{t.sub('min-reps')}: expected at most max-reps ({spec.max_reps}), got {spec.min_reps}")
    return spec


_PERCENT = re.compile(r"(\d+(\.\d+)?)%")


def v_search_budget(value: Any, path: str, errors: list) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    m = _PERCENT.fullmatch(value) if isinstance(value, str) else None
    if m and 0 < float(m.group(1)) <= 100:
        return value
    return _fail(errors, path, "a number of configs (an integer >= 1) or a share of the space as a string from '0.1%' to '100%'", value)


def _parse_search(t: _Table) -> SearchSpec:
    budget = t.get("budget", v_search_budget, default=None)
    seconds = t.get("seconds", v_number(0.001), default=None)
    limited = budget is not None or seconds is not None
    strategy = t.get("strategy", v_choice(SEARCH_STRATEGIES), default="auto" if limited else "exhaustive")
    seed = t.get("seed", v_int(0), default=0)
    warm_start = t.get("warm-start", v_bool, default=True)
    t.finish()
    if strategy not in ("exhaustive", _BAD) and not limited and t.ok:
        t.errors.append(f"{t.sub('budget')}: strategy {strategy!r} needs a budget (configs, e.g. 200 or '5%') or `seconds`; without one it would measure every config")
    return SearchSpec(strategy=strategy, budget=budget, seed=seed, seconds=seconds, warm_start=warm_start)


def _module_path(value: Any, path: str, errors: list) -> Any:
    parts = value.split(".") if isinstance(value, str) else []
    if len(parts) >= 2 and all(_IDENT.fullmatch(p) and not keyword.iskeyword(p) for p in parts):
        return value
    return _fail(errors, path, "a dotted module path inside your package, e.g. 'mypkg.kernels'", value)


def _parse_kernel(name: str, t: _Table, root: Path) -> KernelSpec | None:
    if not t.ok:  # not a table: reported when the _Table was made
        return None
    errors = t.errors
    n_errors = len(errors)
    template_ref = t.get("template", v_str, required=True)
    template = _resolve_template(template_ref, t.sub("template"), root, errors) if template_ref is not _BAD else _BAD
    entry = t.get("entry", v_ident, default=name)
    doc = t.get("doc", v_str, default="")
    nvrtc_options = t.get("nvrtc-options", v_list(v_str, nonempty=False), default=())
    max_configs = t.get("max-configs", v_int(1), default=DEFAULT_MAX_CONFIGS)
    reference = t.get("reference", v_entry_point, default=None)
    inputs = t.get("inputs", v_entry_point, default=None)
    tolerance = None
    tol_t = t.table("tolerance")
    if tol_t is not None:
        rtol = tol_t.get("rtol", v_number(0.0), required=True)
        atol = tol_t.get("atol", v_number(0.0), required=True)
        tol_t.finish()
        tolerance = (rtol, atol)
    search_t = t.table("search")
    search = _parse_search(search_t) if search_t is not None else SearchSpec()

    types = _value_lists(t, "types", "type parameter", v_choice(tuple(DTYPES)), "dtypes")
    type_size_names = {f"{tp}_size" for tp in types}
    constants = _value_lists(t, "constants", "constant", v_constant, "values", what=" of integers or booleans")
    constant_names = set(constants)

    # Search space: axis -> non-empty list of values.
    space: dict[str, tuple[Any, ...]] = {}
    space_t = t.table("space", required=True)
    if space_t is not None and space_t.ok:
        if not space_t.data:
            errors.append(f"{space_t.path}: expected at least one axis, got an empty table")
        for axis in space_t.data:
            space_t.seen.add(axis)
            p = space_t.sub(axis)
            if v_ident(axis, p, errors) is _BAD:
                continue
            values = v_list(v_space_value, what=" of values")(space_t.data[axis], p, errors)
            if values is not _BAD:
                if len(set(values)) != len(values):
                    errors.append(f"{p}: expected distinct values, got {list(values)!r}")
                space[axis] = values

    # Arguments.
    args: list[ArgSpec] = []
    raw_args = t.get("args", lambda v, p, e: v if isinstance(v, list) and v else _fail(e, p, "a non-empty array of tables", v), required=True)
    # key dims are the table keys of `key`; read them first so shapes can be checked against them
    key_t = t.table("key", required=True)
    key_names = [k for k in key_t.data] if key_t is not None and key_t.ok else []
    if raw_args is not _BAD:
        for i, raw in enumerate(raw_args):
            arg = _parse_arg(_Table(raw, f"{t.sub('args')}[{i}]", errors), set(key_names), constant_names, types)
            if arg is not None:
                args.append(arg)
        seen_names: set[str] = set()
        for i, a in enumerate(args):
            if a.name in seen_names:
                errors.append(f"{t.sub('args')}[{i}].name: duplicate argument name {a.name!r}")
            seen_names.add(a.name)
    by_name = {a.name: a for a in args}

    # Key dims.
    key: list[KeyDim] = []
    if key_t is not None and key_t.ok:
        if not key_t.data:
            errors.append(f"{key_t.path}: expected at least one key dim, got an empty table")
        for dim in key_names:
            key_t.seen.add(dim)
            kd = _parse_key_dim(dim, _Table(key_t.data[dim], key_t.sub(dim), errors), by_name, raw_args is not _BAD)
            if kd is not None:
                key.append(kd)

    config_names = set(space)
    key_set = set(key_names)
    constraints = t.get(
        "constraints",
        v_list(v_expr(config_names | type_size_names | constant_names, "constraints may use the space axes, <T>_size and constants"), nonempty=False),
        default=(),
    )
    geometry_names = config_names | key_set | type_size_names | constant_names
    where = "launch geometry may use key dims, space axes, <T>_size and constants"
    grid = t.get("grid", v_list(v_expr(geometry_names, where)), required=True)
    block = t.get("block", v_list(v_expr(geometry_names, where)), required=True)
    shared = t.get("shared", v_expr(geometry_names, where), default=expr_mod.parse(0))
    for geo, p in ((grid, "grid"), (block, "block")):
        if geo is not _BAD and len(geo) > 3:
            errors.append(f"{t.sub(p)}: expected 1 to 3 expressions (x, y, z), got {len(geo)}")

    default: dict[str, Any] = {}
    default_t = t.table("default", required=True)
    if default_t is not None and default_t.ok:
        for axis in default_t.data:
            default_t.seen.add(axis)
            value = v_space_value(default_t.data[axis], default_t.sub(axis), errors)
            if value is _BAD:
                continue
            if axis not in space:
                errors.append(f"{default_t.sub(axis)}: {axis!r} is not an axis of the space (axes: {', '.join(space) or 'none'})")
            elif not any(type(v) is type(value) and v == value for v in space[axis]):  # True is not 1
                errors.append(f"{default_t.sub(axis)}: default {value!r} is not in the space {list(space[axis])!r}")
            else:
                default[axis] = value
        missing = [a for a in space if a not in default_t.data]
        if missing:
            errors.append(f"{default_t.path}: expected a value for every axis; missing {', '.join(missing)}")
        default_t.finish()
    t.finish()

    if len(errors) > n_errors:
        return None
    spec = KernelSpec(
        name=name,
        template=template,
        template_ref=template_ref,
        entry=entry,
        doc=doc,
        args=tuple(args),
        key=tuple(key),
        types=types,
        space=space,
        constraints=tuple(constraints),
        default=default,
        grid=tuple(grid),
        block=tuple(block),
        shared=shared,
        nvrtc_options=tuple(nvrtc_options),
        reference=reference,
        inputs=inputs,
        tolerance=tolerance,
        search=search,
        max_configs=max_configs,
        constants=constants,
        root=root,
    )
    clash = _name_clashes(spec)
    if clash:
        errors.append(f"{t.path}: {clash}")
        return None
    bad_option = next((o for o in spec.nvrtc_options if o.startswith(("-I", "--include-path", "--pre-include", "-include"))), None)
    if bad_option:
        errors.append(
            f"{t.sub('nvrtc-options')}: {bad_option!r} is not supported: included files would not be part of the cache key "
            "or the lock checksum; `#include \"file\"` a header by its path relative to the template (or the including "
            "header) instead, or `{% include \"file\" %}` it through Jinja"
        )
        return None
    # Checks that need the whole kernel. Both spaces are counted before anything walks them.
    n_configs = count_points(spec.space.values())
    if n_configs > spec.max_configs:
        sizes = " x ".join(f"{len(v)} {a}" for a, v in spec.space.items())
        errors.append(
            f"{t.sub('space')}: {n_configs:,} configs ({sizes}) before constraints, more than `max-configs` "
            f"({spec.max_configs:,}) allows; each would be rendered and compiled, and checked here first. "
            "Shrink the axes, or raise `max-configs` for this kernel if you mean it"
        )
        return None
    n_points = count_points(k.buckets for k in spec.key)
    if n_points > MAX_BUCKET_POINTS:
        errors.append(f"{t.sub('key')}: the buckets make {n_points:,} tuning points; at most {MAX_BUCKET_POINTS:,} are allowed")
        return None
    n_instances = count_points([*spec.types.values(), *spec.constants.values()])
    if n_instances > MAX_INSTANCES:
        errors.append(
            f"{t.path}: the type parameters and constants make {n_instances:,} instances, each rendered, compiled and tuned "
            f"apart; at most {MAX_INSTANCES:,} are allowed"
        )
        return None
    size_error = _check_sizes(spec)
    if size_error:
        errors.append(f"{t.path}: {size_error}")
        return None
    instances = spec.type_instances()
    grouped: dict[tuple[str, str], list[str]] = {}  # (key path, problem) -> the instances it holds for
    for types_ in instances:
        label = ", ".join(f"{k}={value_text(v)}" for k, v in types_.items())
        try:
            configs = spec.configs(types_)
        except ConstraintError as exc:  # e.g. division by zero for some config, or a bound exceeded
            errors.append(
                f"{t.sub('constraints')}[{exc.index}]: {spec.constraints[exc.index].text!r} cannot be evaluated for "
                f"{exc.config}{f' (for {label})' if label else ''}: {exc.cause}"
            )
            return None
        if not configs:
            grouped.setdefault((t.sub("constraints"), "the constraints exclude every config of the space"), []).append(label)
        elif dict(spec.default) not in configs:
            broken = _violated(spec, types_)
            grouped.setdefault((t.sub("default"), f"the default {dict(spec.default)!r} violates {broken}"), []).append(label)
        geometry_error = _check_geometry(spec, types_, configs)
        if geometry_error:
            grouped.setdefault((t.path, geometry_error), []).append(label)
    for (where_, problem), labels in grouped.items():  # once per problem, naming the instances it holds for
        holds_for = "" if len(labels) == len(instances) else f" (for {'; '.join(labels)})"
        errors.append(f"{where_}: {problem}{holds_for}")
    return spec if len(errors) == n_errors else None


def _violated(spec: KernelSpec, types: Mapping[str, Any]) -> str:
    """Which constraints the default config breaks for an instance, each by index and text."""
    env = {**spec.default, **spec.type_env(types)}
    broken = []
    for i, c in enumerate(spec.constraints):
        try:
            holds = c(env)
        except ExpressionError:
            holds = False
        if not holds:
            broken.append(f"constraints[{i}] {c.text!r}")
    return " and ".join(broken) or "the constraints"


def _value_lists(t: _Table, key: str, kind: str, item: Validator, noun: str, what: str = "") -> dict[str, tuple[Any, ...]]:
    """A table of name -> non-empty array of distinct values of one kind: the type parameters
    (dtype names) and the constants (integers or booleans), each named by an identifier that
    is not a dtype's name."""
    errors, out = t.errors, {}
    table = t.table(key)
    if table is None or not table.ok:
        return out
    for name in table.data:
        table.seen.add(name)
        p = table.sub(name)
        if v_ident(name, p, errors) is _BAD:
            continue
        if name in DTYPES:
            errors.append(f"{p}: a {kind} may not be named like a dtype")
            continue
        values = v_list(item, what=what)(table.data[name], p, errors)
        if values is _BAD:
            continue
        if len({type(v) for v in values}) > 1:
            errors.append(f"{p}: expected values of one kind, all integers or all booleans, got {list(values)!r}")
        elif len(set(values)) != len(values):
            errors.append(f"{p}: expected distinct {noun}, got {list(values)!r}")
        else:
            out[name] = values
    return out


def _name_clashes(spec: KernelSpec) -> str | None:
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
    keywords = [("argument", [a.name for a in spec.args if a.value is None], call_words), ("constant", spec.constants, call_words + select_words)]
    keywords += [("key dim", [k.name for k in spec.key], select_words), ("type parameter", spec.types, select_words)]
    for kind, names, words in keywords:
        for name in names:
            if name in words:
                return f"{kind} {name!r} has the same name as {reserved[name]}; rename it"
    arguments = {a.name for a in spec.args}
    for name in spec.constants:
        if name in arguments:
            return f"constant {name!r} has the same name as argument {name}; rename one"
    for kind, names in (("constant", spec.constants), ("axis", spec.space), ("key dim", [k.name for k in spec.key])):
        for name in names:
            if name in owners:
                return f"{kind} {name!r} has the same name as {owners[name]}; rename one"
            owners[name] = f"{kind} {name}"
    return None


def _check_geometry(spec: KernelSpec, types: Mapping[str, str], configs: list[dict[str, Any]]) -> str | None:
    """grid/block/shared must give positive integers for every config at every bucket. Above
    GEOMETRY_CHECKS pairs, every config is checked at the grid's corners (each dim's smallest
    and largest bucket) and every point with the default config: bounded time, and what the
    geometry usually depends on monotonically is still covered."""
    points = bucket_points([k.buckets for k in spec.key])
    pairs: Any = ((p, c) for p in points for c in configs)
    if len(points) * len(configs) > GEOMETRY_CHECKS:
        corners = corner_points([k.buckets for k in spec.key])
        pairs = itertools.chain(((p, c) for p in corners for c in configs), ((p, dict(spec.default)) for p in points))
    type_env = spec.type_env(types)
    names = [k.name for k in spec.key]
    for point, config in pairs:
        key = dict(zip(names, point))
        env = {**key, **config, **type_env}
        for what, exprs, minimum in (("grid", spec.grid, 1), ("block", spec.block, 1), ("shared", (spec.shared,), 0)):
            for e in exprs:
                try:
                    value = e(env)
                except ExpressionError as exc:  # e.g. division by zero for some config, or a bound exceeded
                    return f"{what} expression {e.text!r} fails for {config} at {key}: {exc}"
                if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _GEOMETRY_MAX[what]:
                    return (
                        f"{what} expression {e.text!r} gives {short_repr(value)} for {config} at {key}; expected an integer "
                        f"from {minimum} to {_GEOMETRY_MAX[what]} (use // or cdiv for division)"
                    )
    return None


# What a launch can take at most, whatever the GPU: a grid dim up to 2**31 - 1 blocks, a block of at most
# 1024 threads, and no GPU has 4 GiB of shared memory per block.
_GEOMETRY_MAX = {"grid": 2**31 - 1, "block": 1024, "shared": 2**32 - 1}


def _check_sizes(spec: KernelSpec) -> str | None:
    """Every bucket point gives array shapes that are sizes and scalars that fit their declared
    type: a bucket of 2**62 feeding an int32 is an error here, not an overflow at call time."""
    by_name = {a.name: a for a in spec.args}
    for k in spec.key:
        arg = by_name[k.source]
        if not arg.is_array and arg.dtype in INT_RANGES:
            lo, hi = INT_RANGES[arg.dtype]
            if k.buckets[-1] > hi:
                return f"key dim {k.name!r} has bucket {k.buckets[-1]}, which does not fit in argument {arg.name!r} ({arg.dtype}, at most {hi})"
    names = [k.name for k in spec.key]
    constant_sets: list[dict[str, Any]] = [{}]
    for cname, values in spec.constants.items():
        constant_sets = [{**c, cname: v} for c in constant_sets for v in values]
    points = bucket_points([k.buckets for k in spec.key])  # at most MAX_BUCKET_POINTS
    if len(points) * len(constant_sets) > GEOMETRY_CHECKS:  # bounded, as in _check_geometry
        points = corner_points([k.buckets for k in spec.key])
    for point, consts in itertools.product(points, constant_sets):
        key = {**dict(zip(names, point)), **consts}
        for a in spec.args:
            for i, e in enumerate(a.shape or ()):
                what = f"shape[{i}] of argument {a.name!r}"
                problem = _evaluate_int(e, key, 0, MAX_SIZE)
                if problem:
                    return f"{what}: {e.text!r} {problem} at {key}"
            if a.value is not None and a.dtype in INT_RANGES:
                problem = _evaluate_int(a.value, key, *INT_RANGES[a.dtype])
                if problem:
                    return f"value of argument {a.name!r} ({a.dtype}): {a.value.text!r} {problem} at {key}"
    return None


def _evaluate_int(e: Expr, env: Mapping[str, Any], lo: int, hi: int) -> str | None:
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


def _parse_arg(t: _Table, key_names: set[str], constant_names: set[str], types: Mapping[str, tuple[str, ...]]) -> ArgSpec | None:
    if not t.ok:  # not a table: reported when the _Table was made
        return None
    errors = t.errors
    n = len(errors)
    names = key_names | constant_names
    name = t.get("name", v_ident, required=True)
    dtype = t.get("dtype", v_choice(tuple(DTYPES) + tuple(types)), required=True)
    shape = t.get("shape", v_list(v_expr(names, "shapes may use the key dims and constants"), nonempty=True), default=None)
    intent = t.get("intent", v_choice(INTENTS), default=None)
    value = t.get("value", v_expr(names, "a scalar's value may use the key dims and constants"), default=None)
    align = t.get("align", v_int(1), default=None)
    t.finish()
    if align not in (None, _BAD) and (align & (align - 1)):
        errors.append(f"{t.sub('align')}: expected a power of two (bytes), got {align}")
    if align not in (None, _BAD) and shape is None:
        errors.append(f"{t.sub('align')}: only arrays have an alignment")
    if shape is None:
        if intent is not None:
            errors.append(f"{t.sub('intent')}: only arrays (with a shape) have an intent")
    else:
        if intent is None and t.ok and "intent" not in t.data:
            errors.append(f"{t.sub('intent')}: required for arrays; expected one of 'in', 'out', 'inout'")
        if value is not None:
            errors.append(f"{t.sub('value')}: only scalars may be computed from the key")
    if len(errors) > n:
        return None
    return ArgSpec(name=name, dtype=dtype, shape=shape, intent=intent, value=value, align=align)


def _parse_key_dim(dim: str, t: _Table, args: Mapping[str, ArgSpec], args_ok: bool) -> KeyDim | None:
    if not t.ok:  # not a table: reported when the _Table was made
        return None
    errors = t.errors
    n = len(errors)
    if v_ident(dim, t.path, errors) is _BAD:
        return None
    source = t.get("from", v_ident, default=None)
    axis = t.get("axis", v_int(0), default=None)
    buckets = t.get("buckets", v_list(v_int(1, MAX_SIZE), what=" of positive integers"), required=True)
    mapping = t.get("mapping", v_choice(MAPPINGS), default="nearest")
    t.finish()
    if buckets not in (_BAD, None) and list(buckets) != sorted(set(buckets)):
        errors.append(f"{t.sub('buckets')}: expected strictly increasing integers, got {list(buckets)!r}")
    if not args_ok or len(errors) > n:
        return None
    if source is None:  # infer: the first array whose shape names this dim bare
        for a in args.values():
            if a.is_array and any(e.tree == ["n", dim] for e in a.shape):
                source = a.name
                break
        if source is None:
            errors.append(f"{t.path}: no array has {dim!r} as an axis of its shape; set `from` (an argument name)")
            return None
    arg = args.get(source)
    if arg is None:
        errors.append(f"{t.sub('from')}: {source!r} is not an argument of the kernel (arguments: {', '.join(args)})")
        return None
    if arg.is_array:
        if axis is None:
            axes = [i for i, e in enumerate(arg.shape) if e.tree == ["n", dim]]
            if not axes:
                errors.append(f"{t.sub('axis')}: {source!r} has no axis named {dim!r}; give `axis`")
                return None
            axis = axes[0]
        elif axis >= len(arg.shape):
            errors.append(f"{t.sub('axis')}: {source!r} has {len(arg.shape)} dims, got axis {axis}")
            return None
    else:
        if axis is not None:
            errors.append(f"{t.sub('axis')}: {source!r} is a scalar; `axis` applies to arrays only")
            return None
        if arg.value is not None:
            errors.append(f"{t.sub('from')}: {source!r} is computed from the key; it cannot also define it")
            return None
        if not arg.dtype.startswith(("int", "uint")):
            errors.append(f"{t.sub('from')}: scalar {source!r} is {arg.dtype}; a key dim needs an integer scalar")
            return None
    return KeyDim(name=dim, source=source, axis=axis, buckets=tuple(buckets), mapping=mapping)


def _resolve_template(ref: str, path: str, root: Path, errors: list) -> Any:
    if ref.startswith(BUILTIN_PREFIX):
        base = builtin_templates_dir()
        candidate = base / ref[len(BUILTIN_PREFIX):]
        if candidate.is_file():
            return candidate
        available = sorted(p.name for p in base.glob("*.j2")) if base.is_dir() else []
        errors.append(f"{path}: no built-in template {ref!r}; built-ins: {', '.join(available) or 'none'}")
        return _BAD
    candidate = (root / ref).resolve()
    if not candidate.is_file():
        errors.append(f"{path}: template file {ref!r} not found (looked for {candidate})")
        return _BAD
    return candidate
