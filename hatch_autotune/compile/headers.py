"""Header sets, resolved: a declared set (declare/headers.py) -> the include options NVRTC gets
and the set's identity, the sha256 of every file in its folders.

The identity, not the folders' paths, is what enters the compile cache key and (through each
variant's source hash) the lock checksum: the same headers found elsewhere (another venv, another
NVRTC patch release whose bundle did not change) keep every cache entry and lock entry valid,
while a changed header invalidates exactly the kernels that declare its set. A content hash is
stricter than a version number (a patch release may change a header; a CCCL installed from
elsewhere may carry the same version string) and costs about 0.3 s for the toolkit's 2,377 files,
once per build.

The toolkit's set (`cuda`) comes from NVRTC itself where it carries its headers (13.3 and newer:
`nvrtcInstallBundledHeaders` extracts them once, into the compile cache's folder, keyed by the
NVRTC build), and from the PyPI header distributions otherwise (nvidia-cuda-runtime,
nvidia-cuda-cccl, nvidia-cuda-crt, found by cuda.pathfinder as CuPy and cuda.cccl find them).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from ..declare.headers import HeaderSetSpec
from ..errors import BuildError
from ..runtime import check_cuda
from .header_set import ResolvedHeaderSet
from .nvrtc import ensure_nvrtc, nvrtc_build

# Files of NVRTC's extracted bundle that are not headers: its install lock and a version marker
# that holds the extraction's timestamp.
_BUNDLE_BOOKKEEPING = frozenset({".nvrtc_install.lock", ".nvrtc_headers_version"})
MAX_HEADER_SET_FILES = 50_000  # a folder past this is not a header set (a site-packages root?)


def content_hash(folders: tuple[Path, ...], skip: frozenset[str] = frozenset()) -> str:
    """sha256 over each file's path (relative to its folder, with the folder's position) and
    bytes, in sorted order: the same headers anywhere give the same hash."""
    digest = hashlib.sha256()
    count = 0
    for position, folder in enumerate(folders):
        files = []
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in filenames:
                if name not in skip:
                    files.append(os.path.join(dirpath, name))
        count += len(files)
        if count > MAX_HEADER_SET_FILES:
            raise BuildError(f"hatch-autotune: {folder} holds more than {MAX_HEADER_SET_FILES} files; it is not an include folder")
        for path in sorted(files):
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            digest.update(f"{position}\0{rel}\0".encode())
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def bundle_available() -> bool:
    """Whether this NVRTC carries the toolkit's headers (13.3 and newer, through cuda-bindings
    that expose nvrtcInstallBundledHeaders)."""
    from cuda.bindings import nvrtc

    ensure_nvrtc()
    info = getattr(nvrtc, "nvrtcGetBundledHeadersInfo", None)
    if info is None:
        return False
    try:
        result, details, *_ = info()
    except Exception:  # an NVRTC older than the bindings: the symbol is missing from the library
        return False
    return bool(result == nvrtc.nvrtcResult.NVRTC_SUCCESS and details.available)


def bundle_folder(cache_root: Path) -> Path:
    """NVRTC's bundled headers extracted under the compile cache's folder, once per NVRTC build
    (NVRTC serialises concurrent extractions with its own file lock)."""
    from cuda.bindings import nvrtc

    folder = cache_root / "headers" / f"nvrtc-{nvrtc_build()}"
    if not (folder / ".nvrtc_headers_version").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        flags = (
            int(nvrtc.nvrtcInstallHeadersFlags.NVRTC_INSTALL_HEADERS_SKIP_IF_EXISTS) if hasattr(nvrtc, "nvrtcInstallHeadersFlags") else 0
        )
        check_cuda(nvrtc.nvrtcInstallBundledHeaders(str(folder).encode(), flags), "nvrtcInstallBundledHeaders")
    return folder


def _toolkit_from_bundle(cache_root: Path) -> ResolvedHeaderSet:
    from cuda.bindings import nvrtc

    folder = bundle_folder(cache_root)
    _, info, *_ = nvrtc.nvrtcGetBundledHeadersInfo()
    return ResolvedHeaderSet(
        name="cuda",
        identity=content_hash((folder,), _BUNDLE_BOOKKEEPING),
        label=f"CUDA {info.cudaVersionMajor}.{info.cudaVersionMinor} headers and CCCL, bundled with NVRTC {nvrtc_build()}",
        options=(f"--use-bundled-headers={folder}",),
        folders=(str(folder), str(folder / "cccl")),
    )


# cuda.pathfinder's names for the toolkit's header folders, in search order: the CUDA runtime's
# headers (cuda_bf16.h, mma.h, crt/), then CCCL (cub/, cuda/std, cuda/pipeline).
_PYPI_HEADER_LIBS = ("cudart", "cccl")


def _toolkit_from_pypi() -> ResolvedHeaderSet:
    from cuda.pathfinder import find_nvidia_header_directory

    folders = []
    for lib in _PYPI_HEADER_LIBS:
        found = find_nvidia_header_directory(lib)
        if found is None:
            raise BuildError(
                f"hatch-autotune: the header set `cuda` needs the toolkit's {lib} headers, and this NVRTC carries none "
                "(NVRTC 13.3 and newer do); install them with `pip install nvidia-cuda-runtime nvidia-cuda-cccl "
                "nvidia-cuda-crt` (the `-cu12` distributions for NVRTC 12), or upgrade cuda-toolkit[nvrtc]"
            )
        folders.append(Path(found))
    paths = tuple(dict.fromkeys(folders))
    return ResolvedHeaderSet(
        name="cuda",
        identity=content_hash(paths),
        label="CUDA headers and CCCL from " + ", ".join(str(p) for p in paths),
        options=tuple(f"-I{p}" for p in paths),
        folders=tuple(str(p) for p in paths),
    )


# The CUDA 12 toolkit's header folders, from the `-cu12` distributions (`hatch-autotune[cu12]`):
# NVRTC 12 carries no headers, and cuda.pathfinder could as well find CUDA 13's. The runtime's
# headers (cuda_bf16.h, mma.h), CCCL (cub/, cuda/std), and nvcc's crt/ that the runtime's include.
_CU12_HEADERS = (
    ("nvidia-cuda-runtime-cu12", "nvidia/cuda_runtime/include"),
    ("nvidia-cuda-cccl-cu12", "nvidia/cuda_cccl/include"),
    ("nvidia-cuda-nvcc-cu12", "nvidia/cuda_nvcc/include"),
)


def _toolkit_for_nvrtc12() -> ResolvedHeaderSet:
    from importlib.metadata import PackageNotFoundError, distribution

    folders, versions = [], []
    for name, rel in _CU12_HEADERS:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            dist = None
        path = Path(str(dist.locate_file(rel))) if dist is not None else None
        if dist is None or path is None or not path.is_dir():
            raise BuildError(
                f'hatch-autotune: the header set `cuda` with `min-cuda = "12"` needs the CUDA 12 headers of {name} '
                f"({'not installed' if dist is None else f'{dist.version} has no {rel}'}); install them with "
                "`pip install 'hatch-autotune[cu12]'` (add it to [build-system] requires)"
            )
        folders.append(path)
        versions.append(f"{name} {dist.version}")
    paths = tuple(folders)
    return ResolvedHeaderSet(
        name="cuda",
        identity=content_hash(paths),
        label="CUDA 12 headers and CCCL from " + ", ".join(versions),
        options=tuple(f"-I{p}" for p in paths),
        folders=tuple(str(p) for p in paths),
    )


def _declared(spec: HeaderSetSpec) -> ResolvedHeaderSet:
    from importlib.metadata import PackageNotFoundError, distribution

    folders = []
    for i, folder in enumerate(spec.folders):
        where = f"{spec.key_path}.include[{i}]"
        try:
            dist = distribution(folder.distribution)
        except PackageNotFoundError:
            raise BuildError(
                f"hatch-autotune: {where}: the distribution {folder.distribution!r} is not installed; add "
                f"'{folder.distribution}=={folder.version}' to [build-system] requires"
            ) from None
        if dist.version != folder.version:
            raise BuildError(
                f"hatch-autotune: {where}: {folder.distribution} {dist.version} is installed, the header set is pinned to "
                f"{folder.version}; pin '{folder.distribution}=={folder.version}' in [build-system] requires, or change the set's version"
            )
        path = Path(str(dist.locate_file(folder.path)))
        if not path.is_dir():
            raise BuildError(
                f"hatch-autotune: {where}: {folder.distribution} {dist.version} has no folder {folder.path!r} (looked at {path})"
            )
        folders.append(path)
    paths = tuple(folders)
    return ResolvedHeaderSet(
        name=spec.name,
        identity=content_hash(paths),
        label=", ".join(f"{f.distribution} {f.version} ({f.path})" for f in spec.folders),
        options=tuple(f"-I{p}" for p in paths),
        folders=tuple(str(p) for p in paths),
    )


@functools.cache
def resolve_header_set(spec: HeaderSetSpec, cache_root: Path, nvrtc: int = 13) -> ResolvedHeaderSet:
    """The set as this machine has it (once per process) for the NVRTC of major `nvrtc`: the
    toolkit's from NVRTC 13's bundle or PyPI (for NVRTC 12: the -cu12 distributions), a declared
    one from its pinned distributions. BuildError naming the set's key when a distribution is
    missing, at another version, or lacks the folder."""
    if spec.is_toolkit:
        if nvrtc == 12:
            return _toolkit_for_nvrtc12()
        return _toolkit_from_bundle(cache_root) if bundle_available() else _toolkit_from_pypi()
    return _declared(spec)


def resolve_header_sets(specs: tuple[HeaderSetSpec, ...], cache_root: Path | None = None, nvrtc: int = 13) -> tuple[ResolvedHeaderSet, ...]:
    """A kernel's sets, in its search order, for the NVRTC of major `nvrtc`; `cache_root`: where
    NVRTC's bundle is extracted (default: the compile cache's folder)."""
    if not specs:
        return ()
    if cache_root is None:
        from .tiers import default_cache_dir

        cache_root = default_cache_dir()
    return tuple(resolve_header_set(s, cache_root, nvrtc) for s in specs)
