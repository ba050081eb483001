"""The environment's settings: every HATCH_AUTOTUNE_* variable is read here, and only here, into
frozen dataclasses that the build hook, the command and the Ray actors pass down.

As scikit-build-core reads its settings, one converter reads every field: each field names its
variable and the parser of its text; unset or empty is the field's default, and a bad value is
one problem naming the variable and what it takes. The problems are collected, into the
configuration's errors (parse_project, which takes HATCH_AUTOTUNE_MODE and HATCH_AUTOTUNE_ARCHS
over the table's `mode` and `archs`) or into one SettingsError.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

from ..errors import BuildError
from .validate import v_arch, v_choice, v_list

MODES = ("auto", "offline", "tune", "retune")
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_BYTES = 64 << 20  # a cubin is kilobytes to a few megabytes
DEFAULT_TTL_S = 30 * 24 * 3600
CACHE_SCHEMES = ("redis", "rediss", "unix")

# A field's parser: (text, variable, problems) -> the value, or _UNSET after adding a problem.
Parser = Callable[[str, str, list], Any]
_UNSET = object()


class SettingsError(BuildError):
    """Variables with bad values; ``problems`` holds one line per variable."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("hatch-autotune: " + "; ".join(self.problems))


def _setting(var: str, parse: Parser, default: Any = None, *, strip: bool = True, factory: Callable[[], Any] | None = None) -> Any:
    """A field read from the variable `var`: its text (stripped, with `strip`) parsed; unset or
    empty, the default."""
    metadata = {"var": var, "parse": parse, "strip": strip}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _checked(expected: str, convert: Callable[[str], Any], ok: Callable[[Any], bool]) -> Parser:
    """A number `convert` reads and `ok` accepts."""

    def parse(text: str, var: str, problems: list) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            problems.append(f"{var}={text!r}: expected {expected}")
            return _UNSET
        return value

    return parse


def _mode(text: str, var: str, problems: list) -> Any:
    value = v_choice(MODES)(text, f"environment variable {var}", problems)
    return value if value in MODES else _UNSET


def _archs(text: str, var: str, problems: list) -> Any:
    archs = v_list(v_arch)([a.strip() for a in text.split(",") if a.strip()], f"environment variable {var}", problems)
    return archs if isinstance(archs, tuple) else _UNSET


def _text(text: str, var: str, problems: list) -> Any:
    return text


def _flag(text: str, var: str, problems: list) -> Any:
    return True  # set to anything


def _path(text: str, var: str, problems: list) -> Any:
    return Path(text)


def _cache_url(url: str, var: str, problems: list) -> Any:
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in CACHE_SCHEMES:
        problems.append(
            f"{var}={redact(url)}: expected a URL of scheme {', '.join(s + '://' for s in CACHE_SCHEMES)} "
            "(for example redis://cache.internal:6379/0)"
        )
        return _UNSET
    try:
        urlsplit(url).port
    except ValueError as exc:
        problems.append(f"{var}={redact(url)}: {exc}")
        return _UNSET
    return url


def _cores() -> int:
    return os.cpu_count() or 1


def redact(url: str) -> str:
    """`url` with its password (in the user part or a `password=` query option) shown as ***;
    a user part without a colon may be a password alone, so it is hidden whole."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a URL that cannot be parsed>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"***@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@dataclass(frozen=True)
class CacheSettings:
    """The compile cache (compile/tiers.py): the disk store's folder, and the shared Redis tier."""

    dir: Path | None = _setting("HATCH_AUTOTUNE_CACHE_DIR", _path, strip=False)  # None: the platform's user cache folder
    url: str | None = _setting("HATCH_AUTOTUNE_CACHE_URL", _cache_url)  # redis://, rediss://, unix://; None: no shared tier
    timeout_s: float = _setting(
        "HATCH_AUTOTUNE_CACHE_TIMEOUT",
        _checked("a number of seconds > 0 (default 2)", float, lambda v: math.isfinite(v) and v > 0),
        DEFAULT_TIMEOUT_S,
    )
    max_bytes: int = _setting(
        "HATCH_AUTOTUNE_CACHE_MAX_BYTES",
        _checked(f"a whole number of bytes > 0 (default {DEFAULT_MAX_BYTES})", int, lambda v: v > 0),
        DEFAULT_MAX_BYTES,
    )
    ttl_s: int = _setting(
        "HATCH_AUTOTUNE_CACHE_TTL",
        _checked(f"a whole number of seconds, 0 for no expiry (default {DEFAULT_TTL_S}, 30 days)", int, lambda v: v >= 0),
        DEFAULT_TTL_S,
    )


@dataclass(frozen=True)
class Settings:
    """What the environment sets for a build, a `tune` or a Ray actor."""

    mode: str | None = _setting("HATCH_AUTOTUNE_MODE", _mode, strip=False)  # over the table's `mode`
    archs: tuple[str, ...] | None = _setting("HATCH_AUTOTUNE_ARCHS", _archs, strip=False)  # comma-separated; over the table's `archs`
    jobs: int = _setting(
        "HATCH_AUTOTUNE_JOBS",
        _checked("a whole number of compiles at once >= 1 (default: one per core)", int, lambda v: v >= 1),
        factory=_cores,
    )
    cache: CacheSettings = field(default_factory=CacheSettings, metadata={"section": CacheSettings})
    ray_address: str | None = _setting("HATCH_AUTOTUNE_RAY", _text, strip=False)  # tune on this Ray cluster (`tune --ray` overrides)
    debug: bool = _setting("HATCH_AUTOTUNE_DEBUG", _flag, False, strip=False)  # the command shows an internal error's traceback


def read_settings(env: Mapping[str, str] | None = None, problems: list[str] | None = None) -> Settings:
    """The settings `env` (default: os.environ) holds. Each bad variable is a line added to
    `problems` (its field keeps its default), or without that list a SettingsError naming them."""
    return _collect(lambda found: _convert(Settings, os.environ if env is None else env, found), problems)


def read_cache_settings(env: Mapping[str, str] | None = None) -> CacheSettings:
    """The compile cache's settings alone (a command that needs no project); SettingsError for bad ones."""
    return _collect(lambda found: _convert(CacheSettings, os.environ if env is None else env, found), None)


def read_jobs(env: Mapping[str, str] | None = None) -> int:
    """HATCH_AUTOTUNE_JOBS alone: how many compiles run at once where no Settings were passed down."""
    (jobs,) = [f for f in fields(Settings) if f.name == "jobs"]
    value = _collect(lambda found: _value(jobs, os.environ if env is None else env, found), None)
    return _cores() if value is _UNSET else value


def _collect(read: Callable[[list[str]], Any], problems: list[str] | None) -> Any:
    found: list[str] = []
    value = read(found)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise SettingsError(found)
    return value


def _convert(cls: Any, env: Mapping[str, str], problems: list[str]) -> Any:
    """An instance of the settings class `cls`, each field from its variable in `env`."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        section = f.metadata.get("section")
        value = _convert(section, env, problems) if section is not None else _value(f, env, problems)
        if value is not _UNSET:
            values[f.name] = value
    return cls(**values)


def _value(f: Field, env: Mapping[str, str], problems: list[str]) -> Any:
    """The field's parsed variable, or _UNSET when it is unset, empty or bad."""
    var = f.metadata["var"]
    text = env.get(var) or ""
    if f.metadata["strip"]:
        text = text.strip()
    return f.metadata["parse"](text, var, problems) if text else _UNSET
