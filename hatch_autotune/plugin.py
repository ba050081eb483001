"""AutotuneBuildHook: wires the pipeline to hatchling and holds no logic of its own.

The generated package is written to a temporary directory and handed to hatchling through
`force_include` (cleaned up in `finalize`). Editable installs cannot import force-included files,
so there the package is written into the source tree instead, with a .gitignore of its own.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EDITABLE_MARKER = ".hatch-autotune-generated"


class AutotuneBuildHook(BuildHookInterface):
    PLUGIN_NAME = "autotune"

    def _table_path(self) -> str:
        target_hooks = self.build_config.target_config.get("hooks", {})
        if isinstance(target_hooks, dict) and self.PLUGIN_NAME in target_hooks:
            return f"tool.hatch.build.targets.{self.target_name}.hooks.{self.PLUGIN_NAME}"
        return f"tool.hatch.build.hooks.{self.PLUGIN_NAME}"

    def _say(self, message: str) -> None:
        if message.startswith("warning: "):
            self.app.display_warning(f"hatch-autotune {message}")
        else:
            self.app.display_info(message)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        import os

        from .cache import default_cache_dir, CompileCache
        from .config import ConfigError, parse_project
        from .package import module_relpath, write_package
        from .errors import BuildError
        from .pipeline import build_payload, detect_gpu_arch

        root = Path(self.root)
        try:
            project = parse_project(self.config, root, path=self._table_path(), env=os.environ)
        except ConfigError as exc:
            raise SystemExit(str(exc)) from None
        gpu_arch = None if project.mode == "offline" else detect_gpu_arch()
        cache = CompileCache(default_cache_dir())
        try:
            self._tune_if_asked(project, gpu_arch, cache)
            result = build_payload(project, cache=cache, log=self._say, gpu_arch=gpu_arch)
        except BuildError as exc:
            raise SystemExit(str(exc)) from None

        relpath = module_relpath(project.module)
        if version == "editable":
            target = self._editable_dir(root, relpath)
            self._write_in_tree(target, project, result)
            self._say(f"hatch-autotune: editable install: generated package written to {target}")
            return
        self._refuse_in_tree_copy(root, relpath)
        self._staging = Path(tempfile.mkdtemp(prefix="hatch-autotune-"))
        atexit.register(shutil.rmtree, self._staging, True)  # finalize() is skipped if hatchling fails later
        staged = self._staging / "pkg"
        try:
            write_package(staged, project, result)
        except BaseException:
            shutil.rmtree(self._staging, ignore_errors=True)
            raise
        build_data["force_include"][str(staged)] = relpath
        # Explicit, so a project without requires-python does not get py2.py3; never inferred
        # from the interpreter (that would tie a wheel of cubins to one CPython ABI).
        build_data["tag"] = project.wheel_tag or "py3-none-any"
        self._say(f"hatch-autotune: packed {project.module} ({len(result.kernels)} kernel(s), archs {', '.join(result.archs)})")

    def _tune_if_asked(self, project: Any, gpu_arch: str | None, cache: Any) -> None:
        """Modes: `tune`/`retune` must tune (a GPU is required); `auto` tunes stale entries when
        the build machine has a GPU of a target arch; `offline` never does."""
        from .errors import BuildError

        if project.mode == "offline":
            return
        if gpu_arch is None:
            if project.mode in ("tune", "retune"):
                raise BuildError(f"hatch-autotune: mode {project.mode!r} needs a CUDA GPU on the build machine and none was found")
            return
        if project.mode == "auto" and project.archs and gpu_arch not in project.archs:
            self._say(f"warning: the GPU here is {gpu_arch}, not one of the target archs {', '.join(project.archs)}; not tuning")
            return
        from .tuning import tune

        self._say(f"hatch-autotune: tuning on the build GPU ({gpu_arch}), mode {project.mode}")
        tune(project, mode="tune" if project.mode == "auto" else project.mode, log=self._say, gpu_arch=gpu_arch, cache=cache)

    @staticmethod
    def _write_in_tree(target: Path, project: Any, result: Any) -> None:
        """Write next to the old copy, then swap, so a failure never leaves a half-written,
        unmarked directory that the next `pip install -e` would refuse to replace."""
        from .package import write_package

        fresh = target.with_name(f".{target.name}.hatch-autotune-new")
        write_package(fresh, project, result)  # empties `fresh` first
        (fresh / ".gitignore").write_text("# generated by hatch-autotune for an editable install\n*\n")
        (fresh / EDITABLE_MARKER).write_text("")
        old = target.with_name(f".{target.name}.hatch-autotune-old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        fresh.rename(target)
        shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def _refuse_in_tree_copy(root: Path, relpath: str) -> None:
        """A package generated in-tree by an editable install would be packed a second time."""
        for base in (root / "src", root):
            target = base / relpath
            if (target / EDITABLE_MARKER).exists():
                raise SystemExit(
                    f"hatch-autotune: {target} holds the generated package of an editable install, and a wheel "
                    f"built now would contain it twice; remove it (rm -r {target}) and build again "
                    "(`pip install -e .` writes it anew)"
                )

    def _editable_dir(self, root: Path, relpath: str) -> Path:
        """Where the generated package goes in the source tree: next to its parent package."""
        parent, _, name = relpath.rpartition("/")
        for base in (root / "src", root):
            if (base / parent).is_dir():
                target = base / parent / name
                if target.exists() and not (target / EDITABLE_MARKER).exists():
                    raise SystemExit(
                        f"hatch-autotune: editable install would overwrite {target}, which hatch-autotune did "
                        "not generate; rename the module in `module` or move that directory"
                    )
                return target
        raise SystemExit(
            f"hatch-autotune: editable install: cannot find the source directory of package {parent!r} "
            f"under {root} or {root / 'src'}; use a regular install (pip install .)"
        )

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        staging = getattr(self, "_staging", None)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            self._staging = None
