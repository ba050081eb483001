"""The project: the hook's pyproject.toml table -> a ProjectSpec with its kernels and the
environment's settings, validated with every problem reported at once. Read the same way in a
build (the hook hands over its table) and outside one (the command, the Ray actors: the table
found in pyproject.toml where hatchling looks for it)."""

from __future__ import annotations

import dataclasses
import keyword
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CliError
from ..files import read_regular
from ..runtime.torch_ops import OUT_SUFFIX
from .headers import HeaderSetSpec, parse_header_sets, v_header_names
from .kernel import KernelSpec
from .kernel_table import parse_kernel
from .search import TuningSpec, parse_tuning
from .settings import MODES, Mode, Settings, SettingsError, read_settings
from .validate import BAD, IDENT, ConfigError, Table, fail, v_arch, v_bool, v_choice, v_ident, v_list, v_str

# hatchling's own keys in every build-hook table.
HATCHLING_HOOK_KEYS = frozenset({"dependencies", "require-runtime-dependencies", "require-runtime-features", "enable-by-default"})
DEFAULT_LOCK_FILE = "autotune.lock.json"
MIN_CUDA_CHOICES = ("12", "13")  # `min-cuda`: the CUDA driver majors a wheel can be built for
DEFAULT_TABLE_PATH = "tool.hatch.build.targets.wheel.hooks.autotune"
_WHEEL_TAG = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+")  # python-abi-platform


@dataclass(frozen=True)
class ProjectSpec:
    root: Path
    module: str
    archs: tuple[str, ...] | None  # the table's, or HATCH_AUTOTUNE_ARCHS; None: the build machine's GPU
    lock_file: Path
    strict: bool
    ptx: bool
    mode: Mode  # the table's, or HATCH_AUTOTUNE_MODE
    wheel_tag: str | None
    kernels: Mapping[str, KernelSpec]
    tuning: TuningSpec = TuningSpec()
    exact_nvrtc: bool = False  # lock entries tuned with another NVRTC major.minor are stale
    # The oldest CUDA driver major the wheel's binaries load on: the major of the NVRTC that
    # compiles them (12: NVRTC 12, cubins for R525+; 13: NVRTC 13, R580+)
    min_cuda: int = 13
    default_may_fail: bool = False  # a default config that does not compile: the first that does, not an error
    settings: Settings = field(default_factory=Settings)  # the environment's, as the project was read
    torch_namespace: str = ""  # the PyTorch operators' torch.ops.<namespace>: `torch-namespace`, else the module's top-level package


def parse_project(
    table: Any,
    root: Path,
    path: str = DEFAULT_TABLE_PATH,
    env: Mapping[str, str] | None = None,
    settings: Settings | None = None,
) -> ProjectSpec:
    """Validate the whole hook table; raise ConfigError listing every problem. `settings`: the
    environment's, read already; else read from `env` (default: none set), whose problems are
    listed with the table's."""
    errors: list[str] = []
    t = Table(table, path, errors)
    module = t.get("module", _module_path, required=True)
    archs = t.get("archs", v_list(v_arch), default=None)
    lock = t.get("lock-file", v_str, default=DEFAULT_LOCK_FILE)
    strict = t.get("strict", v_bool, default=False)
    ptx = t.get("ptx", v_bool, default=True)
    mode = t.get("mode", v_choice(MODES), default=Mode.AUTO)
    wheel_tag = t.get("wheel-tag", v_wheel_tag, default=None)
    lock_outside = t.get("lock-file-outside-project", v_bool, default=False)
    exact_nvrtc = t.get("exact-nvrtc", v_bool, default=False)
    min_cuda = t.get("min-cuda", v_choice(MIN_CUDA_CHOICES), default="13")
    default_may_fail = t.get("default-may-fail", v_bool, default=False)
    torch_namespace = t.get("torch-namespace", v_torch_namespace, default="")
    tuning_t = t.table("tuning")
    tuning = parse_tuning(tuning_t) if tuning_t is not None else TuningSpec()
    sets_t = t.table("header-sets")
    header_sets = parse_header_sets(sets_t) if sets_t is not None and sets_t.ok else {}
    if sets_t is not None:
        sets_t.finish()
    headers = t.get("headers", v_header_names(set(header_sets)), default=())
    kernels_t = t.table("kernels", required=True)
    t.finish(HATCHLING_HOOK_KEYS)

    if settings is None:
        settings = read_settings(env or {}, errors)
    mode = settings.mode or mode
    archs = settings.archs or archs
    lock_path = _lock_path(lock, root, lock_outside, f"{path}.lock-file", errors) if lock is not BAD and lock_outside is not BAD else BAD
    if archs not in (None, BAD) and len(set(archs)) != len(archs):
        errors.append(f"{path}.archs: expected distinct archs, got {list(archs)!r}")
    header_defaults = HeaderDefaults(header_sets, headers if headers is not BAD else ())
    kernels = _parse_kernels(kernels_t, root, header_defaults) if kernels_t is not None and kernels_t.ok else {}
    if errors:
        raise ConfigError(errors)
    if min_cuda != "13":  # each kernel's variants compile with, and find headers for, that NVRTC
        kernels = {name: dataclasses.replace(k, nvrtc=int(min_cuda)) for name, k in kernels.items()}
    # each kernel's timing in full: its own `timing`, else the project's `tuning`
    kernels = {name: dataclasses.replace(k, timing=k.timing.resolved(tuning)) for name, k in kernels.items()}
    return ProjectSpec(
        root=root,
        module=module,
        archs=tuple(archs) if archs else None,
        lock_file=lock_path,
        strict=strict,
        ptx=ptx,
        mode=Mode(mode),
        wheel_tag=wheel_tag,
        kernels=kernels,
        tuning=tuning,
        exact_nvrtc=exact_nvrtc,
        min_cuda=int(min_cuda),
        default_may_fail=default_may_fail,
        settings=settings,
        torch_namespace=torch_namespace or module.split(".")[0],
    )


@dataclass(frozen=True)
class HeaderDefaults:
    """What a kernel table's `headers` may name (the declared `header-sets`) and what a kernel
    without its own `headers` uses (the hook table's)."""

    sets: Mapping[str, HeaderSetSpec]
    default: tuple[str, ...] = ()


def _parse_kernels(kernels_t: Table, root: Path, headers: HeaderDefaults) -> dict[str, KernelSpec]:
    """The `kernels` table: one KernelSpec per valid kernel table, each named by an identifier."""
    errors = kernels_t.errors
    kernels: dict[str, KernelSpec] = {}
    if not kernels_t.data:
        errors.append(f"{kernels_t.path}: expected at least one kernel table")
    for name in kernels_t.data:
        kernels_t.seen.add(name)
        if v_ident(name, kernels_t.sub(name), errors) is BAD:
            continue
        if name.startswith("_") or name == "provenance":
            errors.append(
                f"{kernels_t.sub(name)}: a kernel may not be named 'provenance' or start with '_' (the generated module uses those names)"
            )
            continue
        spec = parse_kernel(name, Table(kernels_t.data[name], kernels_t.sub(name), errors), root, headers.sets, headers.default)
        if spec is not None:
            kernels[name] = spec
    for name, spec in kernels.items():  # the PyTorch operators' names (runtime/torch_ops.py) stay distinct
        if any(a.intent == "out" for a in spec.args) and name + OUT_SUFFIX in kernels:
            errors.append(
                f"{kernels_t.sub(name + OUT_SUFFIX)}: the name of kernel {name!r}'s PyTorch operator that writes into the "
                f"caller's outputs ({name}{OUT_SUFFIX}); rename one of the two kernels"
            )
    return kernels


def _lock_path(lock: str, root: Path, outside_allowed: bool, path: str, errors: list[str]) -> Any:
    """The lock file's path: inside the project (a tune replaces the file, so a mistyped
    `/etc/...` or `../..` must not point it elsewhere) unless `lock-file-outside-project`."""
    candidate = (root / lock).resolve()
    if not outside_allowed and not candidate.is_relative_to(root.resolve()):
        errors.append(
            f"{path}: {lock!r} is outside the project ({candidate}); tuning replaces this file, so it must be "
            "inside the project, unless `lock-file-outside-project = true` says otherwise"
        )
        return BAD
    if candidate.is_dir():
        errors.append(f"{path}: {lock!r} is a directory; expected the lock file's path (e.g. 'autotune.lock.json')")
        return BAD
    return root / lock


def _module_path(value: Any, path: str, errors: list[str]) -> Any:
    parts = value.split(".") if isinstance(value, str) else []
    if len(parts) >= 2 and all(IDENT.fullmatch(p) and not keyword.iskeyword(p) for p in parts):
        return value
    return fail(errors, path, "a dotted module path inside your package, e.g. 'mypkg.kernels'", value)


# Namespaces of PyTorch's own operators: a fragment there would mix the kernels into them.
PYTORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "torch", "higher_order", "inductor", "quantized", "_c10d_functional", "c10d"})


def v_torch_namespace(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, str) and IDENT.fullmatch(value) and not keyword.iskeyword(value) and value not in PYTORCH_NAMESPACES:
        return value
    return fail(errors, path, "an identifier that names your operators' namespace (torch.ops.<name>), not one of PyTorch's own", value)


def v_wheel_tag(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, str) and _WHEEL_TAG.fullmatch(value):
        return value
    return fail(
        errors, path, "a wheel tag 'python-abi-platform' of letters, digits, '_' and '.' (e.g. 'py3-none-manylinux_2_28_x86_64')", value
    )


# ---- outside a build ---------------------------------------------------------------------------


PYPROJECT_LIMIT = 16 << 20  # bytes of pyproject.toml read: a pipe or a device in its place is refused at once


def hook_table(pyproject: Path) -> tuple[Any, str]:
    """The hook's TOML table in pyproject.toml and its key path."""
    import tomllib

    try:
        data = tomllib.loads(read_regular(pyproject, PYPROJECT_LIMIT).decode("utf-8"))
    except OSError as exc:
        raise CliError(f"{pyproject}: cannot read it ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"{pyproject}: not valid TOML ({exc})") from None
    hatch = data.get("tool", {}).get("hatch", {}) if isinstance(data.get("tool"), dict) else {}
    build = hatch.get("build", {}) if isinstance(hatch, dict) else {}
    target = build.get("targets", {}).get("wheel", {}).get("hooks", {}) if isinstance(build, dict) else {}
    if isinstance(target, dict) and "autotune" in target:
        return target["autotune"], "tool.hatch.build.targets.wheel.hooks.autotune"
    hooks = build.get("hooks", {}) if isinstance(build, dict) else {}
    if isinstance(hooks, dict) and "autotune" in hooks:
        return hooks["autotune"], "tool.hatch.build.hooks.autotune"
    raise CliError(f"{pyproject}: no [tool.hatch.build.targets.wheel.hooks.autotune] table: not a hatch-autotune project")


def load_project(root: Path, settings: Settings | None = None, env: Mapping[str, str] | None = None) -> ProjectSpec:
    """The project's ProjectSpec, with `settings` (default: those `env` holds, by default this
    process's environment); bad settings, then configuration errors, become one line listing
    them all."""
    pyproject = root / "pyproject.toml"
    if not os.path.lexists(pyproject):  # a pipe or a device in its place is said to be one (hook_table)
        raise CliError(f"{root}: no pyproject.toml: not a project directory")
    table, path = hook_table(pyproject)
    try:
        settings = read_settings(env) if settings is None else settings
    except SettingsError as exc:
        raise CliError(str(exc).removeprefix("hatch-autotune: ")) from None
    try:
        return parse_project(table, root, path=path, settings=settings)
    except ConfigError as exc:
        raise CliError(f"{pyproject}: {len(exc.errors)} configuration error(s): " + "; ".join(exc.errors)) from None
