"""The compile cache a build uses, as the environment sets it: the disk store (cache.py) in
front of the shared Redis tier (remote_cache.py) when HATCH_AUTOTUNE_CACHE_URL names one. The
one place that reads the cache's settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .cache import CompileCache
from .remote_cache import RemoteCache


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """HATCH_AUTOTUNE_CACHE_DIR (of `env`, default os.environ), else the platform's user cache
    directory."""
    value = (os.environ if env is None else env).get("HATCH_AUTOTUNE_CACHE_DIR")
    if value:
        return Path(value)
    import platformdirs

    return Path(platformdirs.user_cache_dir("hatch-autotune"))


def open_compile_cache(env: Mapping[str, str] | None = None) -> CompileCache:
    """The compile cache a build uses, as the environment (`env`, default os.environ) sets it:
    the store in default_cache_dir(), in front of the Redis that HATCH_AUTOTUNE_CACHE_URL names,
    if any. BuildError for a bad setting (remote_cache.RemoteCache.from_env)."""
    env = os.environ if env is None else env
    return CompileCache(default_cache_dir(env), remote=RemoteCache.from_env(env))
