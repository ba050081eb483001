"""How the command and the report write values: configs, buckets, times, speedups, sizes.
One place, so that a config reads the same in `show`, `diff`, the report and the notes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..lock import Bucket
from ..runtime import value_text


def fmt_config(config: Mapping[str, Any] | None) -> str:
    if config is None:
        return "-"
    return " ".join(f"{k}={value_text(config[k])}" for k in sorted(config)) or "-"  # sorted, as in lock and table files; true as in TOML


def fmt_bucket(bucket: Bucket) -> str:
    return " ".join(f"{k}={v}" for k, v in bucket.dims)


def fmt_ms(ms: float | None) -> str:
    """Four significant digits: small kernels run in microseconds, big ones in milliseconds."""
    return "-" if ms is None else f"{ms:#.4g}"


def fmt_speedup(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def fmt_delta(delta: float | None) -> str:
    """A relative change (0.2 is 20% more) as a signed percentage."""
    return "-" if delta is None else f"{delta * 100:+.1f}%"


def fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError
