"""The `hatch` entry point. Imports nothing heavy: if this module failed to import, hatchling
would silently skip the hook."""

from hatchling.plugin import hookimpl

from .plugin import AutotuneBuildHook


@hookimpl
def hatch_register_build_hook() -> type[AutotuneBuildHook]:
    return AutotuneBuildHook
