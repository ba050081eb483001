"""Rendering: one CUDA source per (type instance, config) from a kernel's Jinja2 template.

StrictUndefined turns a misspelt parameter into an error instead of an empty string, and every
template error is reported as `file:line: message` so the author can go straight to it.

Templates are the package author's trusted code (no sandbox), but a loop that never ends must
not hang the build: each variant's rendering is bounded in the range() items it may ask for
(all its range() calls together, so nested loops that print nothing end too) and in the source
it may produce, each a TemplateError naming the template, the kernel and the bound.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..spec.config import DTYPES, KernelSpec, builtin_templates_dir
from ..errors import BuildError
from ..runtime import types_key


class TemplateError(BuildError):
    """A template failed to render; the message starts with file:line."""


MAX_RANGE_ITEMS = 100_000  # range() items one variant's rendering may ask for, all calls together
MAX_SOURCE_MIB = 16  # source one variant may render to, in MiB of characters


class _RangeBudgetExceeded(Exception):
    """Raised inside a template by range(); render_kernel turns it into a TemplateError."""


class _SourceTooLong(Exception):
    """Raised by _render past MAX_SOURCE_MIB; render_kernel names the variant."""


_range_left: contextvars.ContextVar[list[int]] = contextvars.ContextVar("range_left")


def _bounded_range(*args: int) -> range:
    """The templates' range(): Python's, charged to the rendering variant's budget of
    MAX_RANGE_ITEMS (outside render_kernel, each call on its own)."""
    items = range(*args)
    step = items.step
    n = max(0, (items.stop - items.start + step - 1) // step if step > 0 else (items.start - items.stop - step - 1) // -step)  # len() overflows past 2**63
    left = _range_left.get([MAX_RANGE_ITEMS])
    if n > left[0]:
        call = "range(" + ", ".join(str(a) for a in args) + ")"
        taken = f", and {MAX_RANGE_ITEMS - left[0]} are taken" if left[0] < MAX_RANGE_ITEMS else ""
        raise _RangeBudgetExceeded(
            f"{call} asks for {n} items; a variant may use at most {MAX_RANGE_ITEMS} range() items in all{taken} "
            "(a loop that never ends?)"
        )
    left[0] -= n
    return items


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
        env.globals["range"] = _bounded_range
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


def _not_found(exc: Any, search: list[Path]) -> str:
    """What a TemplateNotFound means under the loader's rule: names are relative to the
    template's folder, then the built-in templates, and may not go up with '..'."""
    names = list(getattr(exc, "templates", None) or [exc.name])
    shown = " or ".join(repr(n) for n in names)
    if any(os.path.pardir in str(n).split("/") for n in names):
        return (
            f"include {shown} leaves the template's folder: includes are looked up in {search[0]} and below, "
            f"then in the built-in templates ({search[1]}), by a path without '..'"
        )
    return f"include {shown} not found in {search[0]} nor in the built-in templates ({search[1]})"


def _render(template: Any, context: dict[str, Any]) -> str:
    """One variant's source, within the bounds: MAX_RANGE_ITEMS, checked by range() itself, and
    MAX_SOURCE_MIB, counted as the template yields its output."""
    limit = MAX_SOURCE_MIB << 20
    parts, size = [], 0
    token = _range_left.set([MAX_RANGE_ITEMS])
    chunks = template.generate(context)
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise _SourceTooLong
            parts.append(chunk)
    finally:
        chunks.close()
        _range_left.reset(token)
    return "".join(parts)


def render_kernel(spec: KernelSpec) -> dict[str, list[Variant]]:
    """All variants of a kernel, per type instance (keyed by types_key), in canonical order."""
    import jinja2

    env = _environment(spec.template.parent)
    search = [spec.template.parent, builtin_templates_dir()]
    dirs = [str(d) + "/" for d in search]
    try:
        template = env.get_template(spec.template.name)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{_template_location(exc, dirs)}: {exc} (kernel {spec.name})") from None
    out: dict[str, list[Variant]] = {}
    for types in spec.type_instances():
        variants = []
        for index, config in enumerate(spec.configs(types)):
            cfg = ", ".join(f"{k}={v}" for k, v in {**types, **config}.items())
            try:
                source = _render(template, render_context(spec, types, config))
            except _SourceTooLong:
                raise TemplateError(
                    f"{spec.template}: rendering produced more than {MAX_SOURCE_MIB} MiB of source, the most a variant may have "
                    f"(a loop that never ends?) (kernel {spec.name}, {cfg})"
                ) from None
            except Exception as exc:  # a Jinja error, or e.g. ZeroDivisionError in a template expression
                where = _template_location(exc, dirs)
                if isinstance(exc, jinja2.TemplateNotFound):
                    what = _not_found(exc, search)
                elif isinstance(exc, (jinja2.TemplateError, _RangeBudgetExceeded)):
                    what = str(exc)
                else:
                    what = f"{type(exc).__name__}: {exc}"
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
