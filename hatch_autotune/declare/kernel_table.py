"""One `kernels.<name>` table -> a KernelSpec: each sub-table read by its own function, in the
order the problems are reported, then the whole kernel checked (checks.py)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..runtime import INT_RANGES, MAX_SIZE, short_repr
from ..runtime.selection import ARCH_NAMES
from . import expr as expr_mod
from .args import DTYPES, ArgSpec, parse_args
from .checks import check_kernel
from .headers import TOOLKIT_SET, HeaderSetSpec, v_header_names
from .kernel import DEFAULT_MAX_CONFIGS, KernelSpec
from .keys import KeyDim, parse_keys
from .layout import check_default_reads_no_conditional_map, check_layout
from .search import SearchSpec, TimingSpec, parse_search, parse_timing
from .validate import (
    BAD,
    Table,
    Validator,
    fail,
    problems_since,
    v_choice,
    v_entry_point,
    v_expr,
    v_ident,
    v_int,
    v_list,
    v_number,
    v_str,
)

BUILTIN_PREFIX = "builtin:"
_INCLUDE_OPTIONS = ("-I", "--include-path", "--pre-include", "-include")


def builtin_templates_dir() -> Path:
    """templates/ as shipped in the wheel (hatch_autotune/templates) or in a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "templates", package.parent / "templates"):
        if candidate.is_dir():
            return candidate
    return package / "templates"


def v_constant(value: Any, path: str, errors: list[str]) -> Any:
    lo, hi = INT_RANGES["int64"]
    if isinstance(value, bool) or (isinstance(value, int) and lo <= value <= hi):
        return value
    return fail(errors, path, f"an integer from {lo} to {hi}, or a boolean", value)


def v_nvrtc_options(value: Any, path: str, errors: list[str]) -> Any:
    """Extra NVRTC options, without the include options the cache key cannot see."""
    options = v_list(v_str, nonempty=False)(value, path, errors)
    bad_option = next((o for o in options if o.startswith(_INCLUDE_OPTIONS)), None) if options is not BAD else None
    if bad_option is None:
        return options
    errors.append(
        f"{path}: {bad_option!r} is not supported: included files would not be part of the cache key "
        'or the lock checksum; `#include "file"` a header by its path relative to the template (or the including '
        'header) instead, or `{% include "file" %}` it through Jinja'
    )
    return BAD


def v_space_value(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, (bool, int, str)):
        return value
    return fail(errors, path, "an integer, boolean or string", value)


def parse_kernel(
    name: str, t: Table, root: Path, header_sets: Mapping[str, HeaderSetSpec] | None = None, default_headers: tuple[str, ...] = ()
) -> KernelSpec | None:
    """The kernel, or None when its table has a problem (each one added to t.errors)."""
    if not t.ok:  # not a table: reported when the Table was made
        return None
    errors = t.errors
    n_errors = len(errors)
    template_ref = t.get("template", v_str, required=True)
    template = resolve_template(template_ref, t.sub("template"), root, errors) if template_ref is not BAD else BAD
    entry = t.get("entry", v_ident, default=name)
    doc = t.get("doc", v_str, default="")
    nvrtc_options = t.get("nvrtc-options", v_nvrtc_options, default=())
    declared_sets = dict(header_sets or {})
    header_names = t.get("headers", v_header_names(set(declared_sets)), default=default_headers)
    max_configs = t.get("max-configs", v_int(1), default=DEFAULT_MAX_CONFIGS)
    reference = t.get("reference", v_entry_point, default=None)
    inputs = t.get("inputs", v_entry_point, default=None)
    tolerance = _tolerance(t)
    search_t = t.table("search")
    search = parse_search(search_t) if search_t is not None else SearchSpec()
    timing_t = t.table("timing")
    timing = parse_timing(timing_t) if timing_t is not None else TimingSpec()
    types = value_lists(t, "types", "type parameter", v_choice(tuple(DTYPES)), "dtypes")
    constants = value_lists(t, "constants", "constant", v_constant, "values", what=" of integers or booleans")
    space = _space(t)
    dims = _free_dims(t)
    args, key, key_names = _args_and_key(t, set(constants), types, set(dims))
    for a in args:  # a layout constant: rendered, tuned and selected as a constant, set by the call from the layout
        if a.unit_stride_constant is not None:
            if a.unit_stride_constant in constants:
                t.errors.append(f"{t.sub('constants')}.{a.unit_stride_constant}: the name of {a.name!r}'s unit-stride variants; rename it")
            constants[a.unit_stride_constant] = (True, False)
    grid, block, shared, cluster, constraints = _launch(t, set(space), key_names, {f"{tp}_size" for tp in types}, set(constants), set(dims))
    geometry_names = set(space) | key_names | {f"{tp}_size" for tp in types} | set(constants) | set(dims)
    check_layout(t, args, key, dims, geometry_names, _declared_names(t))
    default = _default(t, space)
    if default and not problems_since(errors, n_errors):
        check_default_reads_no_conditional_map(t, args, default, types, constants)
    t.finish()
    if problems_since(errors, n_errors):
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
        header_sets=tuple(TOOLKIT_SET if n == TOOLKIT_SET.name else declared_sets[n] for n in header_names),
        reference=reference,
        inputs=inputs,
        tolerance=tolerance,
        search=search,
        timing=timing,
        max_configs=max_configs,
        constants=constants,
        root=root,
        dims=dims,
        cluster=cluster,
    )
    # An unknown key (reported above) leaves the kernel readable: it is still checked whole, so
    # that every problem shows at once, but it is not used.
    checked = check_kernel(spec, t)
    return spec if checked and len(errors) == n_errors else None


def _tolerance(t: Table) -> tuple[Any, Any] | None:
    """`tolerance`: (rtol, atol), both required; None: by dtype."""
    tol_t = t.table("tolerance")
    if tol_t is None:
        return None
    rtol = tol_t.get("rtol", v_number(0.0), required=True)  # finite: a NaN would pass every output
    atol = tol_t.get("atol", v_number(0.0, sys.float_info.max), required=True)  # in the outputs' own units: any finite one
    tol_t.finish()
    return (rtol, atol)


def _space(t: Table) -> dict[str, tuple[Any, ...]]:
    """`space`: axis -> non-empty array of distinct values."""
    space: dict[str, tuple[Any, ...]] = {}
    space_t = t.table("space", required=True)
    if space_t is None or not space_t.ok:
        return space
    errors = t.errors
    if not space_t.data:
        errors.append(f"{space_t.path}: expected at least one axis, got an empty table")
    for axis in space_t.data:
        space_t.seen.add(axis)
        p = space_t.sub(axis)
        if v_ident(axis, p, errors) is BAD:
            continue
        values = v_list(v_space_value, what=" of values")(space_t.data[axis], p, errors)
        if values is not BAD:
            if len(set(values)) != len(values):
                errors.append(f"{p}: expected distinct values, got {list(values)!r}")
            space[axis] = values
    return space


def _declared_names(t: Table) -> set[str]:
    """The name of every argument table that gives one, whether or not the rest of it is valid."""
    raw = t.data.get("args")
    return {a["name"] for a in raw if isinstance(a, dict) and isinstance(a.get("name"), str)} if isinstance(raw, list) else set()


def _free_dims(t: Table) -> dict[str, int]:
    """`dims`: free dim -> the size that tuning inputs and the project's checks use."""
    dims: dict[str, int] = {}
    dims_t = t.table("dims")
    if dims_t is None or not dims_t.ok:
        return dims
    for name in dims_t.data:
        dims_t.seen.add(name)
        p = dims_t.sub(name)
        if v_ident(name, p, t.errors) is BAD:
            continue
        size = v_int(1, MAX_SIZE)(dims_t.data[name], p, t.errors)
        dims[name] = 1 if size is BAD else size  # declared even when its size is wrong: no "unknown name" errors follow
    return dims


def _args_and_key(
    t: Table, constant_names: set[str], types: Mapping[str, tuple[str, ...]], dim_names: set[str]
) -> tuple[list[ArgSpec], list[KeyDim], set[str]]:
    """`args` and `key`, and the key dims' names: those are read first so that shapes can be
    checked against them, and each key dim then against the arguments."""
    raw_args = t.get(
        "args", lambda v, p, e: v if isinstance(v, list) and v else fail(e, p, "a non-empty array of tables", v), required=True
    )
    key_t = t.table("key", required=True)
    key_names = [k for k in key_t.data] if key_t is not None and key_t.ok else []
    args = parse_args(t, raw_args, set(key_names), constant_names, types, dim_names) if raw_args is not BAD else []
    key = (
        parse_keys(key_t, key_names, {a.name: a for a in args}, raw_args is not BAD, _declared_names(t))
        if key_t is not None and key_t.ok
        else []
    )
    return args, key, set(key_names)


def _launch(
    t: Table, config_names: set[str], key_names: set[str], type_size_names: set[str], constant_names: set[str], dim_names: set[str]
) -> tuple[Any, Any, Any, Any, Any]:
    """`constraints` (over the space, and per bucket and arch over the key dims and `arch`),
    then the launch geometry `grid`, `block`, `shared` and `cluster` (over the key, the free
    dims, the space, <T>_size and the constants)."""
    constraint_names = config_names | type_size_names | constant_names | key_names | set(ARCH_NAMES)
    constraints = t.get(
        "constraints",
        v_list(
            v_expr(
                constraint_names,
                "constraints may use the space axes, <T>_size, constants, key dims, `arch`, `arch_specific` and `arch_family`",
            ),
            nonempty=False,
        ),
        default=(),
    )
    geometry_names = config_names | key_names | type_size_names | constant_names | dim_names
    where = "launch geometry may use key dims, free dims, space axes, <T>_size and constants"
    grid = t.get("grid", v_list(v_expr(geometry_names, where)), required=True)
    block = t.get("block", v_list(v_expr(geometry_names, where)), required=True)
    shared = t.get("shared", v_expr(geometry_names, where), default=expr_mod.parse(0))
    cluster = t.get("cluster", v_list(v_expr(geometry_names, where)), default=None)
    for geo, p in ((grid, "grid"), (block, "block"), (cluster, "cluster")):
        if geo not in (BAD, None) and len(geo) > 3:
            t.errors.append(f"{t.sub(p)}: expected 1 to 3 expressions (x, y, z), got {len(geo)}")
    return grid, block, shared, cluster, constraints


def _default(t: Table, space: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """`default`: a value of the space for every axis."""
    default: dict[str, Any] = {}
    default_t = t.table("default", required=True)
    if default_t is None or not default_t.ok:
        return default
    errors = t.errors
    for axis in default_t.data:
        default_t.seen.add(axis)
        value = v_space_value(default_t.data[axis], default_t.sub(axis), errors)
        if value is BAD:
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
    return default


def value_lists(t: Table, key: str, kind: str, item: Validator, noun: str, what: str = "") -> dict[str, tuple[Any, ...]]:
    """A table of name -> non-empty array of distinct values of one kind: the type parameters
    (dtype names) and the constants (integers or booleans), each named by an identifier that
    is not a dtype's name."""
    errors: list[str] = t.errors
    out: dict[str, tuple[Any, ...]] = {}
    table = t.table(key)
    if table is None or not table.ok:
        return out
    for name in table.data:
        table.seen.add(name)
        p = table.sub(name)
        if v_ident(name, p, errors) is BAD:
            continue
        values = v_list(item, what=what)(table.data[name], p, errors)
        if name in DTYPES:
            errors.append(f"{p}: a {kind} may not be named like a dtype")
            values = ()
        elif values is BAD:
            values = ()
        elif len({type(v) for v in values}) > 1:
            errors.append(f"{p}: expected values of one kind, all integers or all booleans, got {list(values)!r}")
        elif len(set(values)) != len(values):
            errors.append(f"{p}: expected distinct {noun}, got {list(values)!r}")
        # Declared even when its values are wrong (that is reported, and the kernel is not
        # used): the expressions that name it must not add "unknown name" errors.
        out[name] = values
    return out


def resolve_template(ref: str, path: str, root: Path, errors: list[str]) -> Any:
    """The template's file: a built-in one inside hatch-autotune's templates folder, or a file
    inside the project (where the headers it includes must be too: compile/render.py)."""
    builtin = ref.startswith(BUILTIN_PREFIX)
    folder = builtin_templates_dir() if builtin else root
    candidate = folder / ref[len(BUILTIN_PREFIX) :] if builtin else root / ref
    try:
        resolved = candidate.resolve()
        inside = resolved.is_relative_to(folder.resolve())
        found = inside and resolved.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # a NUL, a symlink loop, a name too long
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        errors.append(f"{path}: {short_repr(ref)} cannot be a template's path ({reason[:200]})")
        return BAD
    if not inside:
        where = "hatch-autotune's built-in templates folder" if builtin else f"the project ({root})"
        errors.append(f"{path}: {short_repr(ref)} is outside {where}; expected a file inside it")
        return BAD
    if not found:
        if builtin:
            available = sorted(p.name for p in folder.glob("*.j2")) if folder.is_dir() else []
            errors.append(f"{path}: no built-in template {short_repr(ref)}; built-ins: {', '.join(available) or 'none'}")
        else:
            errors.append(f"{path}: template file {short_repr(ref)} not found (looked for {resolved})")
        return BAD
    return candidate if builtin else resolved
