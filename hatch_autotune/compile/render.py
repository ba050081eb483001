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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..declare.args import c_type
from ..declare.config import DTYPES, KernelSpec, builtin_templates_dir
from ..errors import BuildError
from ..files import read_regular
from ..runtime import types_key, value_text
from ..text import shown

if TYPE_CHECKING:
    from .header_set import ResolvedHeaderSet
    from .nvrtc import CompileJob


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
    source_hash: str  # of the source, its headers and its header sets: what the binary is compiled from
    headers: tuple[tuple[str, str], ...] = ()  # (name as #included, text) of each header it reaches
    header_sets: tuple[ResolvedHeaderSet, ...] = ()  # the sets its `#include <...>` may reach
    nvrtc: int = 13  # the major of the NVRTC that compiles it (KernelSpec.nvrtc)

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

    def compile_job(self, arch: str, entry: str, options: tuple[str, ...]) -> CompileJob:
        """The NVRTC job for this variant on `arch` (a `compute_` arch gives PTX)."""
        from .nvrtc import CompileJob

        return CompileJob(self.source, arch, entry, options, self.label, self.headers, self.header_sets, self.nvrtc)

    @property
    def label(self) -> str:
        parts = [f"{k}={value_text(v)}" for k, v in self.types + self.config]
        return f"{self.kernel}[{', '.join(parts)}]"

    def render_command(self, project: str = ".") -> str:
        """The `hatch-autotune render` command line that prints this variant's source with its
        line numbers (what NVRTC's `<entry>.cu(91)` refers to), run in the project folder."""
        import shlex

        words = ["hatch-autotune", "render", self.kernel] + ([project] if project != "." else [])
        for option, pairs in (("--types", self.types), ("--config", self.config)):
            if pairs:
                words += [option, ",".join(f"{k}={value_text(v)}" for k, v in pairs)]
        return shlex.join(words)


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
            ctx.update({name: c_type(value, spec.toolkit_headers), f"{name}_dtype": value, f"{name}_size": DTYPES[value][1]})
        else:  # a caller-chosen constant
            ctx[name] = value
    ctx.update(config)
    return ctx


_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)([^\n]*)", re.MULTILINE)
_INCLUDE_NAME = re.compile(r'[ \t]*"([^"\n]+)"')
_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)  # strings kept: `"//"` is no comment
_INTEGER = re.compile(r"([0-9]+)[uUlL]*")


def _strip_comments(code: str) -> str:
    """The code with its comments blanked (newlines kept, so line numbers still hold)."""
    return _COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else re.sub(r"[^\n]", " ", m.group(0)), code)


def _name_text(name: str) -> str:
    """An #include name for a message: as written in quotes, or Python's escaped and cut form
    when it holds a control character (a NUL, a line break) or is too long for one readable line."""
    text = shown(name, 200)
    return f'"{name}"' if text == name else text


def _path_text(path: Path) -> str:
    """A path for a message, which stays one line: escaped when it holds a control character."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


def _lookup_problem(exc: BaseException) -> str:
    """Why a header's name cannot be looked up on disk, from the exception the lookup raised."""
    if isinstance(exc, RuntimeError):  # Path.resolve() before Python 3.13
        return "its path is a loop of symbolic links"
    if isinstance(exc, ValueError):  # "embedded null byte", or a name the file system cannot encode
        return "a file name cannot hold a NUL character" if "null" in str(exc) else str(exc)
    text = str(getattr(exc, "strerror", None) or exc)  # "File name too long"
    return text[:1].lower() + text[1:]


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
            limit = MAX_HEADER_MIB << 20
            try:
                if path.stat().st_size > limit:
                    raise TemplateError(f"{where}: {_path_text(path)} is larger than {MAX_HEADER_MIB} MiB, the most a header may have")
                # Newlines as Path.read_text() gives them (the source hash of a header is unchanged).
                text = read_regular(path, limit).decode().replace("\r\n", "\n").replace("\r", "\n")
            except (OSError, UnicodeDecodeError) as exc:  # UnreadableFile too: it became a pipe, it grew
                raise TemplateError(f"{where}: cannot read {_path_text(path)}: {exc}") from None
            self.files[path] = text
        return text

    def _resolve(self, name: str, folder: Path, where: str) -> Path:
        tried = []
        for base in (folder, builtin_templates_dir()):
            try:
                candidate = (base / name).resolve()
                found = candidate.is_file()
            except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL, a name too long
                raise TemplateError(f"{where}: #include {_name_text(name)} cannot name a header: {_lookup_problem(exc)}") from None
            tried.append(_path_text(candidate))
            if found:
                if not any(candidate.is_relative_to(d) for d in self.allowed):
                    raise TemplateError(
                        f"{where}: #include {_name_text(name)} is {_path_text(candidate)}, outside the project ({self.allowed[0]}); headers "
                        "must be inside the project (they are part of the cache key and the lock checksum)"
                    )
                known = self.by_name.setdefault(name, candidate)
                if known != candidate:
                    raise TemplateError(
                        f"{where}: #include {_name_text(name)} means {_path_text(candidate)} here but {_path_text(known)} elsewhere; NVRTC finds headers by "
                        "the name as written, so give the two files different names or paths"
                    )
                return candidate
        raise TemplateError(f"{where}: #include {_name_text(name)} not found (looked for {' and '.join(tried)})")

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
                todo.append((self._header_includes[path], path.parent, _path_text(path)))
        return tuple(sorted(found.items()))


def _known_condition(text: str) -> bool | None:
    """What an `#if` (or `#elif`) condition is when it is a plain literal: a decimal number
    (`0`, `1`) or C++'s `false` / `true` (what `{{ flag }}` renders to), in parentheses or not;
    None when it takes a preprocessor to know (a macro, `defined(X)`, arithmetic)."""
    text = text.strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    if text in ("false", "true"):
        return text == "true"
    number = _INTEGER.fullmatch(text)
    return None if number is None else number.group(1).strip("0") != ""


def _includes(code: str) -> list[tuple[str, int]]:
    """(name, line) of each `#include "name"` directive of the code that NVRTC may read:
    comments left out, and the branches of an `#if` / `#elif` / `#else` group that a literal
    condition rules out (`#if 0 ... #else ... #endif`, nested groups inside them tracked).
    Every other branch counts, whatever its condition: only a literal is known without a
    preprocessor, and a header counted but never read is harmless, while one left out would
    be missing from NVRTC's headers, the cache key and the checksum."""
    stripped = _strip_comments(code)
    found: list[tuple[str, int]] = []
    groups: list[tuple[bool, bool]] = []  # per open #if: (the code around it is read, a branch is certainly taken)
    reading, line, pos = True, 1, 0
    for m in _DIRECTIVE.finditer(stripped):
        line += stripped.count("\n", pos, m.start())
        pos = m.start()
        word, rest = m.group(1), m.group(2)
        if word in ("if", "ifdef", "ifndef"):
            condition = _known_condition(rest) if word == "if" else None
            groups.append((reading, condition is True))
            reading = reading and condition is not False
        elif word in ("elif", "elifdef", "elifndef", "else") and groups:
            around, taken = groups[-1]
            condition = True if word == "else" else _known_condition(rest) if word == "elif" else None
            reading = around and not taken and condition is not False
            groups[-1] = (around, taken or condition is True)
        elif word == "endif" and groups:
            reading = groups.pop()[0]
        elif word == "include" and reading:
            name = _INCLUDE_NAME.match(rest)
            if name:
                found.append((name.group(1), line))
    return found


def source_hash(source: str, headers: tuple[tuple[str, str], ...], header_set_ids: tuple[str, ...] = ()) -> str:
    """What a binary is compiled from: the source, the headers it includes by name, and the
    identities of its header sets (a variant without headers hashes as its source alone, as
    before headers existed). The lock checksum hashes it, so a header set's change makes
    exactly the entries of the kernels that declare the set stale."""
    blob = source if not headers else source + "\0" + json.dumps(headers)
    if header_set_ids:
        blob += "\0header sets\0" + json.dumps(header_set_ids)
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


class _Renderer:
    """A kernel's template, loaded once, and the headers its variants reach: the one path from
    (type instance, config) to the source and headers NVRTC compiles, for the build
    (render_kernel) and for `hatch-autotune render` (render_config) alike."""

    def __init__(self, spec: KernelSpec):
        import jinja2

        self.spec = spec
        self.search = [spec.template.parent, builtin_templates_dir()]
        self.dirs = [str(d) + "/" for d in self.search]
        try:
            self.template = _environment(spec.template.parent).get_template(spec.template.name)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{_template_location(exc, self.dirs)}: {exc} (kernel {spec.name})") from None
        self.headers = _Headers(spec)
        from .headers import resolve_header_sets

        self.header_sets = resolve_header_sets(spec.header_sets, nvrtc=spec.nvrtc)

    def variant(self, types: Mapping[str, Any], config: Mapping[str, Any], index: int) -> Variant:
        import jinja2

        spec = self.spec
        cfg = ", ".join(f"{k}={value_text(v)}" for k, v in {**types, **config}.items())
        try:
            source = _render(self.template, render_context(spec, types, config))
        except _SourceTooLong:
            raise TemplateError(
                f"{spec.template}: rendering produced more than {MAX_SOURCE_MIB} MiB of source, the most a variant may have "
                f"(a loop that never ends?) (kernel {spec.name}, {cfg})"
            ) from None
        except Exception as exc:  # a Jinja error, or e.g. ZeroDivisionError in a template expression
            where = _template_location(exc, self.dirs)
            if isinstance(exc, jinja2.TemplateNotFound):
                what = _not_found(exc, self.search)
            elif isinstance(exc, (jinja2.TemplateError, _RangeBudgetExceeded)):
                what = str(exc)
            else:
                what = f"{type(exc).__name__}: {exc}"
            raise TemplateError(f"{where}: {what} (kernel {spec.name}, {cfg})") from None
        included = self.headers.of(source, f"kernel {spec.name}, {cfg}")
        digest = source_hash(source, included, tuple(h.identity for h in self.header_sets))
        # fields in Variant's order: kernel, types, config, index, source, source_hash, headers, header_sets, nvrtc
        return Variant(
            spec.name, tuple(types.items()), tuple(config.items()), index, source, digest, included, self.header_sets, spec.nvrtc
        )


def render_kernel(spec: KernelSpec) -> dict[str, list[Variant]]:
    """All variants of a kernel, per type instance (keyed by types_key), in canonical order."""
    renderer = _Renderer(spec)
    return {
        types_key(types): [renderer.variant(types, config, index) for index, config in enumerate(spec.configs(types))]
        for types in spec.type_instances()
    }


def render_config(spec: KernelSpec, types: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[Variant, dict[str, Path]]:
    """One variant, rendered as the build renders it (the same source, byte for byte), and the
    file each of its headers' names stands for; for `hatch-autotune render`. Its index is -1:
    the config is the caller's, checked against the space by the caller, not enumerated."""
    renderer = _Renderer(spec)
    variant = renderer.variant(types, config, -1)
    return variant, {name: renderer.headers.by_name[name] for name, _ in variant.headers}
