"""The environment's settings: every HATCH_AUTOTUNE_* variable is read here, and only here, into
frozen dataclasses that the build hook, the command and the Ray actors pass down.

As scikit-build-core reads its settings, one converter reads every field: each field names its
variable and the parser of its text; unset or empty is the field's default, and a bad value is
one problem naming the variable and what it takes. The problems are collected, into the
configuration's errors (parse_project, which takes HATCH_AUTOTUNE_MODE and HATCH_AUTOTUNE_ARCHS
over the table's `mode` and `archs`) or into one SettingsError.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import BuildError
from ..runtime import short_repr
from .validate import in_range, number_text, v_arch, v_choice, v_list

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Mode(StrEnum):
    """The build mode (docs/building.md#modes), from HATCH_AUTOTUNE_MODE or the table's `mode`.
    A StrEnum: it prints, and is written, as its value (`offline`), and equals that string."""

    AUTO = "auto"  # tune where a GPU of a target arch is found, else build from the lock
    OFFLINE = "offline"  # never touch a GPU; build from the lock
    TUNE = "tune"  # like auto, but a missing GPU is an error
    RETUNE = "retune"  # tune every entry again, ignoring the lock


# The modes' values, in the order the messages and `--mode` list them: strings, so that a
# message quoting them (repr) reads 'offline', never <Mode.OFFLINE: 'offline'>.
MODES: tuple[str, ...] = tuple(m.value for m in Mode)
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_BYTES = 64 << 20  # a cubin is kilobytes to a few megabytes
DEFAULT_TTL_S = 30 * 24 * 3600
CACHE_SCHEMES = ("redis", "rediss", "unix")
# The ranges of the numeric variables (docs/configuration.md): each a value the code below them
# can take (a socket timeout overflows past ~9e9 s; Redis stores at most 512 MiB per value).
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 3600.0
MAX_MAX_BYTES = 512 << 20
MAX_TTL_S = 10 * 365 * 24 * 3600  # ten years
MAX_JOBS = 1024
_WHOLE = re.compile(r"\+?[0-9]+")  # [0-9], not \d: str patterns' \d matches every script's digits
_DECIMAL = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_RAY_ADDRESS = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]+)")

# A field's parser: (text, variable, problems) -> the value, or _UNSET after adding a problem.
Parser = Callable[[str, str, list[str]], Any]
_UNSET = object()
_T = TypeVar("_T")
_D = TypeVar("_D", bound="DataclassInstance")


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


def _number(expected: str, minimum: float, maximum: float, default: str, *, whole: bool = False) -> Parser:
    """A number written in ASCII digits (a whole one with `whole`), from `minimum` to `maximum`:
    validate.in_range, the rule the table's numbers follow too. Python's int() and float() also
    read '١٢', '1_000', 'nan' and 'inf'; none of those is a setting's value."""
    pattern = _WHOLE if whole else _DECIMAL
    bounds = f", from {number_text(minimum)} to {number_text(maximum)}"

    def parse(text: str, var: str, problems: list[str]) -> Any:
        value: Any = None
        if pattern.fullmatch(text):
            try:
                value = int(text) if whole else float(text)
            except ValueError:  # more digits than int() converts: out of range
                value = maximum + 1
        if not in_range(value, minimum, maximum):
            problems.append(f"{var}={short_repr(text)}: expected {expected}{bounds if value is not None else ''} (default {default})")
            return _UNSET
        return value

    return parse


def _mode(text: str, var: str, problems: list[str]) -> Any:
    value = v_choice(MODES)(text, f"environment variable {var}", problems)
    return Mode(value) if value in MODES else _UNSET


def _archs(text: str, var: str, problems: list[str]) -> Any:
    archs = v_list(v_arch)([a.strip() for a in text.split(",") if a.strip()], f"environment variable {var}", problems)
    return archs if isinstance(archs, tuple) else _UNSET


def _flag(text: str, var: str, problems: list[str]) -> Any:
    return True  # set to anything


def _on_off(text: str, var: str, problems: list[str]) -> Any:
    if text in ("0", "1"):
        return text == "1"
    problems.append(f"environment variable {var}: expected 1 (on) or 0 (off), got {text!r}")
    return _UNSET


def _path(text: str, var: str, problems: list[str]) -> Any:
    return Path(text)


def _cache_url(url: str, var: str, problems: list[str]) -> Any:
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in CACHE_SCHEMES:
        problems.append(
            f"{var}={redact(url)}: expected a URL of scheme {', '.join(s + '://' for s in CACHE_SCHEMES)} "
            "(for example redis://cache.internal:6379/0)"
        )
        return _UNSET
    try:
        port = urlsplit(url).port  # ASCII digits only, at most 65535
    except ValueError as exc:
        problems.append(f"{var}={redact(url)}: {str(exc)[:200]}")
        return _UNSET
    if port == 0:
        problems.append(f"{var}={redact(url)}: port 0 cannot be connected to; expected a port from 1 to 65535")
        return _UNSET
    return url


RAY_VAR = "HATCH_AUTOTUNE_RAY"  # the Ray cluster to tune on; `tune --ray` overrides it


def ray_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a Ray head's address: `HOST:PORT`, an IPv6 host in brackets
    (`[::1]:6379`, as ray.init takes it), the port from 1 to 65535 in ASCII digits. ValueError
    saying what is expected otherwise. The one reader of such an address: HATCH_AUTOTUNE_RAY
    here, `tune --ray` and the reachability probe (tuning/ray_engine.py)."""
    m = _RAY_ADDRESS.fullmatch(address)
    host = (m.group("v6") or m.group("host")) if m else None
    if m and m.group("v6"):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            host = None
    if not m or host is None or len(host) > 253:
        raise ValueError(
            "expected the Ray head node's HOST:PORT (the address `ray start --head` prints, e.g. 10.0.0.5:6379; "
            "an IPv6 host in brackets, e.g. [::1]:6379)"
        )
    digits = m.group("port")
    port = int(digits) if len(digits) <= 5 else 0
    if not 1 <= port <= 65535:
        raise ValueError(f"port {short_repr(digits)} is not a TCP port; expected a port from 1 to 65535")
    return host, port


def _ray_address(text: str, var: str, problems: list[str]) -> Any:
    try:
        ray_host_port(text)
    except ValueError as exc:
        problems.append(f"{var}={short_repr(text)}: {exc}")
        return _UNSET
    return text


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
        _number("a number of seconds > 0", MIN_TIMEOUT_S, MAX_TIMEOUT_S, number_text(DEFAULT_TIMEOUT_S)),
        DEFAULT_TIMEOUT_S,
    )
    max_bytes: int = _setting(
        "HATCH_AUTOTUNE_CACHE_MAX_BYTES",
        _number("a whole number of bytes > 0", 1, MAX_MAX_BYTES, f"{DEFAULT_MAX_BYTES}, 64 MiB", whole=True),
        DEFAULT_MAX_BYTES,
    )
    ttl_s: int = _setting(
        "HATCH_AUTOTUNE_CACHE_TTL",
        _number("a whole number of seconds, 0 for no expiry", 0, MAX_TTL_S, f"{DEFAULT_TTL_S}, 30 days", whole=True),
        DEFAULT_TTL_S,
    )


@dataclass(frozen=True)
class Settings:
    """What the environment sets for a build, a `tune` or a Ray actor."""

    mode: Mode | None = _setting("HATCH_AUTOTUNE_MODE", _mode, strip=False)  # over the table's `mode`
    archs: tuple[str, ...] | None = _setting("HATCH_AUTOTUNE_ARCHS", _archs, strip=False)  # comma-separated; over the table's `archs`
    jobs: int = _setting(
        "HATCH_AUTOTUNE_JOBS",
        _number("a whole number of compiles at once >= 1", 1, MAX_JOBS, "one per core", whole=True),
        factory=_cores,
    )
    # NVRTC's automatic precompiled headers for kernels with header sets (compile/nvrtc.py)
    pch: bool = _setting("HATCH_AUTOTUNE_PCH", _on_off, True)
    cache: CacheSettings = field(default_factory=CacheSettings, metadata={"section": CacheSettings})
    ray_address: str | None = _setting(RAY_VAR, _ray_address)  # tune on this Ray cluster (`tune --ray` overrides)
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


def read_pch(env: Mapping[str, str] | None = None) -> bool:
    """HATCH_AUTOTUNE_PCH alone: whether a compiling process (a pool's worker, which is handed
    no Settings) uses NVRTC's precompiled headers."""
    (pch,) = [f for f in fields(Settings) if f.name == "pch"]
    value = _collect(lambda found: _value(pch, os.environ if env is None else env, found), None)
    return True if value is _UNSET else bool(value)


def _collect(read: Callable[[list[str]], _T], problems: list[str] | None) -> _T:
    found: list[str] = []
    value = read(found)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise SettingsError(found)
    return value


def _convert(cls: type[_D], env: Mapping[str, str], problems: list[str]) -> _D:
    """An instance of the settings class `cls`, each field from its variable in `env`."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        section = f.metadata.get("section")
        value = _convert(section, env, problems) if section is not None else _value(f, env, problems)
        if value is not _UNSET:
            values[f.name] = value
    return cls(**values)


def _value(f: Field[Any], env: Mapping[str, str], problems: list[str]) -> Any:
    """The field's parsed variable, or _UNSET when it is unset, empty or bad."""
    var = f.metadata["var"]
    text = env.get(var) or ""
    if f.metadata["strip"]:
        text = text.strip()
    return f.metadata["parse"](text, var, problems) if text else _UNSET
