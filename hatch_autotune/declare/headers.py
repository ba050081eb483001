"""Header sets: the groups of include folders a kernel may `#include <...>` from, as declared.

`cuda` is built in: the toolkit's CUDA and CCCL headers (cuda_bf16.h, mma.h, cub/, cuda/std,
cooperative_groups.h ...), which the compile stage finds in NVRTC's own bundle or in the PyPI
header distributions (compile/headers.py). A project may declare more under `header-sets.<name>`,
each a list of folders inside pinned pip distributions (CUTLASS with the CCCL it was made for).
Only these folders may be searched: `-I` to an arbitrary folder stays refused, because what a
binary is compiled from must be known (the set's content enters the cache key and the checksum).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from .validate import BAD, IDENT, Table, fail, v_list, v_str

TOOLKIT = "cuda"  # the built-in set: the toolkit's CUDA + CCCL headers


@dataclass(frozen=True)
class HeaderFolder:
    """One include folder: `path` inside the installed distribution `distribution`, which must
    be at exactly `version` (a set is pinned: another version is other headers)."""

    distribution: str
    version: str
    path: str


@dataclass(frozen=True)
class HeaderSetSpec:
    """A declared header set: the built-in `cuda` (no folders: found by the compile stage) or a
    project's (its folders, searched in order)."""

    name: str
    folders: tuple[HeaderFolder, ...] = ()
    key_path: str = ""  # where it was declared, for messages

    @property
    def is_toolkit(self) -> bool:
        return self.name == TOOLKIT


TOOLKIT_SET = HeaderSetSpec(TOOLKIT, (), "the built-in header set `cuda`")


def v_relative_path(value: Any, path: str, errors: list[str]) -> Any:
    """A folder inside a distribution: relative, forward slashes, no '..'."""
    if isinstance(value, str) and value and "\\" not in value and "\0" not in value:
        parts = PurePosixPath(value).parts
        if not PurePosixPath(value).is_absolute() and ".." not in parts:
            return value
    return fail(
        errors, path, "a relative folder inside the distribution, with '/' and without '..' (e.g. 'cutlass_library/source/include')", value
    )


def v_distribution(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, str) and value and all(c.isalnum() or c in "-_." for c in value):
        return value
    return fail(errors, path, "a pip distribution name (e.g. 'nvidia-cutlass')", value)


def parse_header_sets(t: Table) -> dict[str, HeaderSetSpec]:
    """The `header-sets` table: name -> its folders. Every problem is added to t.errors."""
    sets: dict[str, HeaderSetSpec] = {}
    for name in t.data:
        t.seen.add(name)
        path = t.sub(name)
        if not isinstance(name, str) or not IDENT.fullmatch(name):
            fail(t.errors, path, "a header set named by an identifier", name)
            continue
        if name == TOOLKIT:
            t.errors.append(f"{path}: `cuda` is the built-in set of the toolkit's CUDA and CCCL headers; give your set another name")
            continue
        st = Table(t.data[name], path, t.errors)
        if not st.ok:
            continue
        raw = st.get("include", v_list(_v_any, nonempty=True), required=True)
        st.finish()
        if raw is BAD:
            continue
        folders = []
        for i, item in enumerate(raw):
            ft = Table(item, f"{st.sub('include')}[{i}]", t.errors)
            if not ft.ok:
                continue
            dist = ft.get("distribution", v_distribution, required=True)
            version = ft.get("version", v_str, required=True)
            folder = ft.get("path", v_relative_path, required=True)
            ft.finish()
            if BAD not in (dist, version, folder):
                folders.append(HeaderFolder(dist, version, folder))
        if len(folders) == len(raw):
            sets[name] = HeaderSetSpec(name, tuple(folders), path)
    return sets


def _v_any(value: Any, path: str, errors: list[str]) -> Any:
    return value


def v_header_names(known: set[str]) -> Any:
    """A validator for a `headers` list: distinct names of known sets (`cuda` or a declared one)."""

    def check(value: Any, path: str, errors: list[str]) -> Any:
        names = v_list(v_str, nonempty=False)(value, path, errors)
        if names is BAD:
            return BAD
        unknown = [n for n in names if n != TOOLKIT and n not in known]
        if unknown:
            declared = ", ".join(sorted(known)) or "none"
            errors.append(
                f"{path}: unknown header set {unknown[0]!r}; expected 'cuda' (the toolkit's CUDA and CCCL headers) or a set "
                f"declared under `header-sets` (declared: {declared})"
            )
            return BAD
        if len(set(names)) != len(names):
            errors.append(f"{path}: expected distinct header sets, got {list(names)!r}")
            return BAD
        return tuple(names)

    return check
