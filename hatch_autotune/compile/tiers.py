"""The compile cache a build uses, as its settings (declare/settings.py) say: the disk store
(cache.py) in front of the shared Redis tier (remote_cache.py) when they name one."""

from __future__ import annotations

from pathlib import Path

from ..declare.settings import CacheSettings, read_cache_settings
from .cache import CompileCache
from .remote_cache import RemoteCache


def default_cache_dir(settings: CacheSettings | None = None) -> Path:
    """The settings' folder (default: this process's environment's), else the platform's user
    cache directory."""
    settings = read_cache_settings() if settings is None else settings
    if settings.dir is not None:
        return settings.dir
    import platformdirs

    return Path(platformdirs.user_cache_dir("hatch-autotune"))


def open_compile_cache(settings: CacheSettings | None = None) -> CompileCache:
    """The compile cache the settings (default: this process's environment's) describe: the
    store in default_cache_dir(), in front of the Redis that their URL names, if any.
    BuildError for a bad setting."""
    settings = read_cache_settings() if settings is None else settings
    return CompileCache(default_cache_dir(settings), remote=RemoteCache.from_settings(settings))
