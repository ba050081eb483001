"""Rendering: one CUDA source per (type instance, config) from a kernel's Jinja2 template.

StrictUndefined turns a misspelt parameter into an error instead of an empty string, and every
template error is reported as `file:line: message` so the author can go straight to it.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..spec.config import DTYPES, KernelSpec, builtin_templates_dir
from ..errors import BuildError
from ..runtime import types_key


class TemplateError(BuildError):
    """A template failed to render; the message starts with file:line."""


@dataclass(frozen=True)
class Variant:
    """One rendered config of one type instance of a kernel."""

    kernel: str
    types: tuple[tuple[str, str], ...]
    config: tuple[tuple[str, Any], ...]
    index: int  # position in the type instance's canonical config list
    source: str
    source_hash: str

    @property
    def types_dict(self) -> dict[str, str]:
        return dict(self.types)

    @property
    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    @property
    def id(self) -> str:
        """Names a (source, config) pair. Two configs can share a source (an axis used only in
        the launch geometry) and still launch differently, so the source hash alone is not enough."""
        blob = self.source_hash + json.dumps(self.config_dict, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.types + self.config]
        return f"{self.kernel}[{', '.join(parts)}]"


_ENVS: dict[Path, Any] = {}


def _environment(template_dir: Path) -> Any:
    import jinja2  # heavy import, build side only

    env = _ENVS.get(template_dir)
    if env is None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(template_dir), str(builtin_templates_dir())]),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,
        )
        _ENVS[template_dir] = env
    return env


def render_context(spec: KernelSpec, types: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """What a template sees: axes, each type parameter as its C type, <T>_dtype, <T>_size, entry."""
    ctx: dict[str, Any] = {"entry": spec.entry}
    for tp, dtype in types.items():
        ctype, size = DTYPES[dtype]
        ctx.update({tp: ctype, f"{tp}_dtype": dtype, f"{tp}_size": size})
    ctx.update(config)
    return ctx


def _template_location(exc: BaseException, search_dirs: list[str]) -> str:
    """file:line of the innermost template frame (an included file's own line) in a traceback."""
    import jinja2

    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"{exc.filename or exc.name}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if any(f.filename.startswith(d) for d in search_dirs)]
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    return "<template>"


def render_kernel(spec: KernelSpec) -> dict[str, list[Variant]]:
    """All variants of a kernel, per type instance (keyed by types_key), in canonical order."""
    import jinja2

    env = _environment(spec.template.parent)
    dirs = [str(spec.template.parent) + "/", str(builtin_templates_dir()) + "/"]
    try:
        template = env.get_template(spec.template.name)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{_template_location(exc, dirs)}: {exc} (kernel {spec.name})") from None
    out: dict[str, list[Variant]] = {}
    for types in spec.type_instances():
        variants = []
        for index, config in enumerate(spec.configs(types)):
            try:
                source = template.render(render_context(spec, types, config))
            except Exception as exc:  # a Jinja error, or e.g. ZeroDivisionError in a template expression
                where = _template_location(exc, dirs)
                cfg = ", ".join(f"{k}={v}" for k, v in {**types, **config}.items())
                what = str(exc) if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: {exc}"
                raise TemplateError(f"{where}: {what} (kernel {spec.name}, {cfg})") from None
            variants.append(
                Variant(
                    kernel=spec.name,
                    types=tuple(types.items()),
                    config=tuple(config.items()),
                    index=index,
                    source=source,
                    source_hash=hashlib.sha256(source.encode()).hexdigest(),
                )
            )
        out[types_key(types)] = variants
    return out
