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
from typing import TYPE_CHECKING, Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

if TYPE_CHECKING:
    from ..declare.project import ProjectSpec
    from ..wheel.assemble import BuildResult

EDITABLE_MARKER = ".hatch-autotune-generated"


class AutotuneBuildHook(BuildHookInterface[BuilderConfig]):
    PLUGIN_NAME = "autotune"
    _staging: Path | None = None  # the generated package's folder until finalize()

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
        from ..compile.tiers import open_compile_cache
        from ..declare.config import ConfigError, parse_project
        from ..declare.settings import Mode, SettingsError, read_settings
        from ..errors import BuildError
        from ..plan.devices import detect_gpus
        from ..wheel.assemble import build_payload
        from ..wheel.payload import module_relpath, runtime_requirements, write_package

        root = Path(self.root)
        try:
            settings = read_settings()  # every HATCH_AUTOTUNE_* variable, once
            project = parse_project(self.config, root, path=self._table_path(), settings=settings)
        except (SettingsError, ConfigError) as exc:
            raise SystemExit(str(exc)) from None
        gpus = [] if project.mode == Mode.OFFLINE else detect_gpus()
        try:
            cache = open_compile_cache(settings.cache)
            plan = None
            if project.mode != Mode.OFFLINE:  # the Ray cluster HATCH_AUTOTUNE_RAY names, else this machine's GPUs (run_engine)
                from ..tuning.engine import run_engine

                plan = run_engine(project, mode=project.mode, log=self._say, cache=cache, gpus=gpus).plan
            result = build_payload(
                project, cache=cache, log=self._say, gpus=gpus, workers=settings.jobs, plan=plan
            )  # one pass: the tuner's plan
        except BuildError as exc:  # the tuner's errors come without the prefix the build's have
            raise SystemExit(f"hatch-autotune: {str(exc).removeprefix('hatch-autotune: ')}") from None

        build_data["dependencies"].extend(self._runtime_dependencies(runtime_requirements()))
        relpath = module_relpath(project.module)
        if version == "editable":
            target = self._editable_dir(root, relpath)
            self._write_in_tree(target, project, result)
            self._say(
                f"hatch-autotune: editable install: generated package written to {target}; `hatch-autotune show {target}` lists what it runs, and why"
            )
            return
        self._refuse_in_tree_copy(root, relpath)
        staging = self._staging = Path(tempfile.mkdtemp(prefix="hatch-autotune-"))
        atexit.register(shutil.rmtree, staging, True)  # finalize() is skipped if hatchling fails later
        staged = staging / "pkg"
        try:
            write_package(staged, project, result)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        build_data["force_include"][str(staged)] = relpath
        # Explicit, so a project without requires-python does not get py2.py3; never inferred
        # from the interpreter (that would tie a wheel of cubins to one CPython ABI).
        build_data["tag"] = project.wheel_tag or "py3-none-any"
        self._say(f"hatch-autotune: packed {project.module} ({len(result.kernels)} kernel(s), archs {', '.join(result.archs)})")

    def _runtime_dependencies(self, needed: list[str]) -> list[str]:
        """What the wheel's Requires-Dist gains: each of `needed` (numpy) that [project].dependencies
        does not name itself (the author's own range then rules), with a warning where cuda-core or
        cuda-bindings is declared, which the generated module never imports."""
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        declared: dict[str, Requirement] = {canonicalize_name(r.name): r for r in map(Requirement, self.metadata.core.dependencies)}
        for name in ("cuda-bindings", "cuda-core"):
            if name in declared:
                self._say(
                    f"warning: [project].dependencies lists {str(declared[name])!r}: the generated module never imports {name} "
                    "(it calls the CUDA driver, libcuda, through ctypes); drop it unless your code imports it"
                )
        return [text for text in needed if canonicalize_name(Requirement(text).name) not in declared]

    @staticmethod
    def _write_in_tree(target: Path, project: ProjectSpec, result: BuildResult) -> None:
        """Write next to the old copy, then swap, so a failure never leaves a half-written,
        unmarked directory that the next `pip install -e` would refuse to replace."""
        from ..wheel.payload import write_package

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
        staging = self._staging
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            self._staging = None
            # The last line of the build's output (pip shows it only with -v): the wheel's name,
            # not artifact_path, which is often a temporary directory the frontend moves it out of.
            self._say(
                f"hatch-autotune: the wheel records this build's outcome: `hatch-autotune show {Path(artifact_path).name}` "
                "(in the directory the wheel went to) lists every entry, why it is untuned, and what failed to compile"
            )
