"""A project read from its pyproject.toml outside a build (the command, the Ray actors): the
hook's table found where hatchling looks for it, then parsed as the build parses it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import CliError


def hook_table(pyproject: Path) -> tuple[Any, str]:
    """The hook's TOML table in pyproject.toml and its key path."""
    import tomllib

    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
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


def load_project(root: Path) -> Any:
    """The project's ProjectSpec; configuration errors become one line listing them all."""
    from ..declare.config import ConfigError, parse_project

    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise CliError(f"{root}: no pyproject.toml: not a project directory")
    table, path = hook_table(pyproject)
    try:
        return parse_project(table, root, path=path, env=os.environ)
    except ConfigError as exc:
        raise CliError(f"{pyproject}: {len(exc.errors)} configuration error(s): " + "; ".join(exc.errors)) from None
