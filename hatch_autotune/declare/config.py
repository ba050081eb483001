"""The configuration schema, as the other stages import it: the hook's table -> typed, validated
specs. Each concern has its module in declare/: validate.py (the generic validators and how
problems are collected), args.py (arguments and dtypes), keys.py (key dims and buckets),
search.py (search and measurement settings, the budget), kernel.py and kernel_table.py (a
kernel and its table), checks.py (checks of a whole kernel), settings.py (the HATCH_AUTOTUNE_*
variables), project.py (the project table and pyproject.toml)."""

from __future__ import annotations

from .args import DTYPES, INTENTS, ArgSpec
from .checks import GEOMETRY_CHECKS, MAX_BUCKET_POINTS, MAX_INSTANCES
from .kernel import DEFAULT_MAX_CONFIGS, KernelSpec
from .kernel_table import BUILTIN_PREFIX, builtin_templates_dir
from .keys import KeyDim
from .project import DEFAULT_LOCK_FILE, DEFAULT_TABLE_PATH, HATCHLING_HOOK_KEYS, ProjectSpec, parse_project
from .search import SEARCH_STRATEGIES, Budget, SearchSpec, Share, TuningSpec
from .settings import MODES, CacheSettings, Mode, Settings, SettingsError, read_settings
from .validate import ConfigError

__all__ = [
    "BUILTIN_PREFIX",
    "DEFAULT_LOCK_FILE",
    "DEFAULT_MAX_CONFIGS",
    "DEFAULT_TABLE_PATH",
    "DTYPES",
    "GEOMETRY_CHECKS",
    "HATCHLING_HOOK_KEYS",
    "INTENTS",
    "MAX_BUCKET_POINTS",
    "MAX_INSTANCES",
    "MODES",
    "SEARCH_STRATEGIES",
    "ArgSpec",
    "Budget",
    "CacheSettings",
    "ConfigError",
    "KernelSpec",
    "KeyDim",
    "Mode",
    "ProjectSpec",
    "SearchSpec",
    "Settings",
    "SettingsError",
    "Share",
    "TuningSpec",
    "builtin_templates_dir",
    "parse_project",
    "read_settings",
]
