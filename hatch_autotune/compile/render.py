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
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..declare.config import DTYPES, KernelSpec, builtin_templates_dir
from ..errors import BuildError
from ..runtime import types_key, value_text


class TemplateError(BuildError):
    """A template failed to render; the message starts with file:line."""


MAX_RANGE_ITEMS = 100_000  # range() items one variant's rendering may ask for, all calls together
MAX_SOURCE_MIB = 16  # source one variant may render to, in MiB of characters
MAX_HEADERS = 256  # distinct headers one variant's `#include "..."` directives may reach
MAX_HEADER_MIB = 16  # size of one header, in MiB


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
    n = max(
        0, (items.stop - items.start + step - 1) // step if step > 0 else (items.start - items.stop - step - 1) // -step
    )  # len() overflows past 2**63
    left = _range_left.get([MAX_RANGE_ITEMS])
    if n > left[0]:
        call = "range(" + ", ".join(str(a) for a in args) + ")"
        taken = f", and {MAX_RANGE_ITEMS - left[0]} are taken" if left[0] < MAX_RANGE_ITEMS else ""
        raise _RangeBudgetExceeded(
            f"{call} asks for {n} items; a variant may use at most {MAX_RANGE_ITEMS} range() items in all{taken} (a loop that never ends?)"
        )
    left[0] -= n
    return items


@dataclass(frozen=True)
class Variant:
    """One rendered config of one type instance of a kernel."""

    kernel: str
    types: tuple[tuple[str, Any], ...]  # type parameters (dtype names) and constants (values)
    config: tuple[tuple[str, Any], ...]
    index: int  # position in the type instance's canonical config list
    source: str
    source_hash: str  # of the source and its headers: what the binary is compiled from
    headers: tuple[tuple[str, str], ...] = ()  # (name as #included, text) of each header it reaches

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

    def compile_job(self, arch: str, entry: str, options: tuple[str, ...]) -> Any:
        """The NVRTC job for this variant on `arch` (a `compute_` arch gives PTX)."""
        from .nvrtc import CompileJob

        return CompileJob(self.source, arch, entry, options, self.label, self.headers)

    @property
    def label(self) -> str:
        parts = [f"{k}={value_text(v)}" for k, v in self.types + self.config]
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
            finalize=cpp_output,
        )
        env.globals["range"] = _bounded_range
        _ENVS[template_dir] = env
    return env


def cpp_output(value: Any) -> Any:
    """What `{{ ... }}` writes for a value: a boolean as C++'s `true`/`false` (Python's `True`
    is no C++ identifier); the value itself stays a boolean for `{% if %}` and `is true`."""
    return ("true" if value else "false") if isinstance(value, bool) else value


def render_context(spec: KernelSpec, types: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """What a template sees: axes and constants by name (booleans written as C++'s `true` and
    `false`, see cpp_output), each type parameter as its C type, <T>_dtype, <T>_size, entry."""
    ctx: dict[str, Any] = {"entry": spec.entry}
    for name, value in types.items():
        if name in spec.types:
            ctype, size = DTYPES[value]
            ctx.update({name: ctype, f"{name}_dtype": value, f"{name}_size": size})
        else:  # a caller-chosen constant
            ctx[name] = value
    ctx.update(config)
    return ctx


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)
_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)  # strings kept: `"//"` is no comment


def _strip_comments(code: str) -> str:
    """The code with its comments blanked (newlines kept, so line numbers still hold)."""
    return _COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else re.sub(r"[^\n]", " ", m.group(0)), code)


class _Headers:
    """The headers a kernel's variants `#include "..."`: each name resolved against the
    including file's folder (then the built-in templates), read once, and kept to the project
    (or the built-ins). NVRTC matches an include by the name as written, so one name must mean
    one file across the kernel."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.allowed = [d.resolve() for d in ([spec.root] if spec.root else []) + [builtin_templates_dir()]]
        self.files: dict[Path, str] = {}
        self.by_name: dict[str, Path] = {}
        self._resolved: dict[tuple[str, Path], Path] = {}  # (name, including folder) -> file
        self._header_includes: dict[Path, list[tuple[str, int]]] = {}  # a header's own directives, scanned once

    def _read(self, path: Path, where: str) -> str:
        text = self.files.get(path)
        if text is None:
            if path.stat().st_size > MAX_HEADER_MIB << 20:
                raise TemplateError(f"{where}: {path} is larger than {MAX_HEADER_MIB} MiB, the most a header may have")
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise TemplateError(f"{where}: cannot read {path}: {exc}") from None
            self.files[path] = text
        return text

    def _resolve(self, name: str, folder: Path, where: str) -> Path:
        tried = []
        for base in (folder, builtin_templates_dir()):
            candidate = (base / name).resolve()
            tried.append(str(candidate))
            if candidate.is_file():
                if not any(candidate.is_relative_to(d) for d in self.allowed):
                    raise TemplateError(
                        f'{where}: #include "{name}" is {candidate}, outside the project ({self.allowed[0]}); headers '
                        "must be inside the project (they are part of the cache key and the lock checksum)"
                    )
                known = self.by_name.setdefault(name, candidate)
                if known != candidate:
                    raise TemplateError(
                        f'{where}: #include "{name}" means {candidate} here but {known} elsewhere; NVRTC finds headers by '
                        "the name as written, so give the two files different names or paths"
                    )
                return candidate
        raise TemplateError(f'{where}: #include "{name}" not found (looked for {" and ".join(tried)})')

    def of(self, source: str, label: str) -> tuple[tuple[str, str], ...]:
        """(name, text) of every header the variant's source reaches, in name order."""
        try:
            return self._reached(source)
        except TemplateError as exc:
            raise TemplateError(f"{exc} ({label})") from None

    def _reached(self, source: str) -> tuple[tuple[str, str], ...]:
        found: dict[str, str] = {}
        todo = [(_includes(source), self.spec.template.parent, f"{self.spec.template} (as rendered)")]
        while todo:
            includes, folder, what = todo.pop()
            for name, line in includes:
                path = self._resolved.get((name, folder))
                if path is None:
                    path = self._resolved[(name, folder)] = self._resolve(name, folder, f"{what}:{line}")
                if name in found:
                    continue
                if len(found) >= MAX_HEADERS:
                    raise TemplateError(f"{what}:{line}: more than {MAX_HEADERS} headers reached by #include")
                found[name] = self._read(path, f"{what}:{line}")
                if path not in self._header_includes:
                    self._header_includes[path] = _includes(found[name])
                todo.append((self._header_includes[path], path.parent, str(path)))
        return tuple(sorted(found.items()))


def _includes(code: str) -> list[tuple[str, int]]:
    """(name, line) of each `#include "name"` directive of the code, comments left out."""
    stripped = _strip_comments(code)
    return [(m.group(1), stripped.count("\n", 0, m.start()) + 1) for m in _INCLUDE.finditer(stripped)]


def source_hash(source: str, headers: tuple[tuple[str, str], ...]) -> str:
    """What a binary is compiled from: the source, and the headers it includes by name (a
    variant without headers hashes as its source alone, as before headers existed)."""
    blob = source if not headers else source + "\0" + json.dumps(headers)
    return hashlib.sha256(blob.encode()).hexdigest()


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
    headers = _Headers(spec)
    for types in spec.type_instances():
        variants = []
        for index, config in enumerate(spec.configs(types)):
            cfg = ", ".join(f"{k}={value_text(v)}" for k, v in {**types, **config}.items())
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
            included = headers.of(source, f"kernel {spec.name}, {cfg}")
            variants.append(
                Variant(
                    kernel=spec.name,
                    types=tuple(types.items()),
                    config=tuple(config.items()),
                    index=index,
                    source=source,
                    source_hash=source_hash(source, included),
                    headers=included,
                )
            )
        out[types_key(types)] = variants
    return out
