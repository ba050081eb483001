"""Runs CUDA kernel source on the CPU through tests/host_cuda/emulator.h, for tests without a GPU.

Why: CI has no GPU, yet the templates' results must be checked against NumPy at odd sizes. Each
source is built with g++ and AddressSanitizer + UBSan into a standalone program (cached by a
content hash) that reads the arguments from a file, launches the kernel with real threads per
block, and writes the arrays back. Arrays get exactly their size, so ASan reports any access
past them; a hang, an emulator check or a sanitizer report is an AssertionError naming the kernel.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hatch_autotune.declare.args import DTYPES
from hatch_autotune.runtime import DTYPE_SIZES

CXX = shutil.which("g++")
EMULATOR = Path(__file__).resolve().parent / "host_cuda" / "emulator.h"
FLAGS = (
    "-std=c++20",
    "-O1",
    "-g",
    "-pthread",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-Wno-unknown-pragmas",
)
MODES = ("deferred", "immediate")
_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:print_summary=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

# numpy dtype -> C type of a kernel parameter (a pointer to it for arrays): the declared dtypes'
# C types (hatch_autotune/declare/args.py), and bool for hand-written test kernels.
_CTYPES = {**{name: ctype for name, (ctype, _) in DTYPES.items()}, "bool": "bool"}


@dataclass(frozen=True)
class TensorMapParam:
    """A tensor-map parameter on the emulator: the driver-order arguments that the runtime gives
    cuTensorMapEncodeTiled (hatch_autotune.runtime.tensor_map.tensor_map_args: its rules checked
    first), packed into the emulator's own 128-byte encoding (AtEmuTensorMap in emulator.h);
    `source` is the parameter index of the array, whose pointer the harness binds. `args` None:
    the 128 zero bytes of a map the variant does not read (`when` false)."""

    source: int
    args: tuple[Any, ...] | None
    elem: int = 0  # bytes per element of the array's dtype

    def to_bytes(self) -> bytes:
        if self.args is None:
            return bytes(128)
        if self.elem <= 0:
            raise ValueError("an encoded map needs its element size (elem): the TMA's transaction bytes count it")
        _dtype, rank, dims, strides, box, swizzle, _l2, oob = self.args
        if rank != 2:
            raise ValueError(f"the emulator's TMA loads are 2D; this map has rank {rank}")
        swizzle_bytes = {"NONE": 0, "32B": 32, "64B": 64, "128B": 128}[swizzle]
        data = struct.pack(
            "<4IQ2QQ2III", 0x50414D54, rank, self.elem, swizzle_bytes, 0, *dims, *strides, *box, int(oob != "NONE"), self.source
        )
        return data + bytes(128 - len(data))


# `extern __shared__ T name[];` (dynamic shared memory): a reference to the emulator's buffer.
_DYNAMIC_SHARED = re.compile(r"\bextern\s+__shared__\s+([^;\[\]]*?)\s*\b(\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"\b(?:__align__|alignas)\s*\([^)]*\)")


# The two half conversions of templates/_dtypes.cuh, inline PTX that g++ cannot take: replaced
# by the emulator's, here rather than in the header, whose text is part of every saxpy
# variant's source and so of the lock checksums of the winners measured on a GPU.
_F16_ASM = (
    (re.compile(r'asm\("cvt\.f32\.f16 %0, %1;" : "=f"\((\w+)\) : "h"\(([\w.]+)\)\);'), r"\1 = at_emu_f16_to_f32(\2);"),
    (re.compile(r'asm\("cvt\.rn\.f16\.f32 %0, %1;" : "=h"\(([\w.]+)\) : "f"\((\w+)\)\);'), r"\1 = at_emu_f32_to_f16_rn(\2);"),
)


# The toolkit headers whose 16-bit types and conversions the emulator defines itself.
_TOOLKIT_16_BIT = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<cuda_(?:fp16|bf16)\.h>[ \t]*$", re.MULTILINE)


def emulation_source(code: str) -> str:
    """The code with each dynamic shared declaration bound to the emulator's per-launch buffer,
    _dtypes.cuh's half conversions done by the emulator, and `#include <cuda_fp16.h>` /
    `<cuda_bf16.h>` dropped (the emulator defines __half, __nv_bfloat16 and their conversions).
    Any other inline PTX fails to build."""
    code = _TOOLKIT_16_BIT.sub("// (the emulator's 16-bit types)", code)

    def bind(m: re.Match[str]) -> str:
        ctype = _ALIGN.sub("", m.group(1)).strip()
        # thread_local: the blocks of a cluster run together, each with its own buffer
        return f"static thread_local {ctype}* const& {m.group(2)} = reinterpret_cast<{ctype}* const&>(at_emu::dynamic_shared_ptr);"

    for pattern, replacement in _F16_ASM:
        code = pattern.sub(replacement, code)
    return _DYNAMIC_SHARED.sub(bind, code)


def _c_type(dtype: np.dtype, half: str) -> str:
    """The C type of a parameter of `dtype`; `half`: the source's float16 type (see run_kernel)."""
    name = dtype.name
    if name == "bfloat16":  # ml_dtypes' bfloat16: the toolkit's type, which the emulator defines
        return "__nv_bfloat16"
    if name not in _CTYPES:
        raise TypeError(f"no C type for dtype {name}")
    if name == "float16":
        return half
    ctype = _CTYPES[name]
    assert ctype is not None, f"no C type for dtype {name} without the toolkit's headers"
    return ctype


def _half_type(texts: Sequence[str]) -> str:
    """The source's float16 type: the toolkit's `__half` where it includes cuda_fp16.h or
    cuda_bf16.h (a kernel with the `cuda` header set), `at_half` of _dtypes.cuh, else raw bits."""
    if any(_TOOLKIT_16_BIT.search(text) for text in texts):
        return "__half"
    return "at_half" if any("at_half" in text for text in texts) else "unsigned short"


def _main(entry: str, params: Sequence[tuple[bool, str]], maps: Mapping[int, int] | None = None) -> str:
    """main(): read grid, block, shared bytes and the parameters from argv[1]/args.bin, launch,
    write every array to argv[1]/out.bin. argv[2]: copy mode, argv[3]: seconds a block may take."""
    lines = [
        "static FILE* at_in;",
        "static void at_read(void* p, size_t n) {",
        '    if (n && std::fread(p, 1, n, at_in) != n) { std::fprintf(stderr, "at_emu harness: short args file\\n"); std::_Exit(2); }',
        "}",
        "template <class T> static T* at_array(size_t& nbytes, unsigned char*& buffer) {",
        "    unsigned long long nb, off; at_read(&nb, 8); at_read(&off, 8); nbytes = nb;",
        "    buffer = static_cast<unsigned char*>(::operator new[](nb, std::align_val_t(256))); at_read(buffer, nb);",
        "    return reinterpret_cast<T*>(buffer + off);",
        "}",
        "int main(int argc, char** argv) {",
        "    if (argc != 4) return 2;",
        "    const std::string at_dir = argv[1];",
        '    at_emu::copy_mode = std::strcmp(argv[2], "immediate") == 0 ? at_emu::CopyMode::immediate : at_emu::CopyMode::deferred;',
        '    at_in = std::fopen((at_dir + "/args.bin").c_str(), "rb");',
        "    if (!at_in) return 2;",
        "    unsigned int at_g[9]; at_read(at_g, sizeof at_g);",
        "    unsigned long long at_shared; at_read(&at_shared, 8);",
    ]
    names = []
    for i, (is_array, ctype) in enumerate(params):
        if is_array:
            lines.append(f"    size_t at_n{i}; unsigned char* at_b{i}; {ctype}* at_p{i} = at_array<{ctype}>(at_n{i}, at_b{i});")
        else:
            lines.append(f"    {ctype} at_p{i}; at_read(&at_p{i}, sizeof at_p{i});")
        names.append(f"at_p{i}")
    lines += [f"    at_emu_bind_tensor_map(&at_p{i}, at_p{src});" for i, src in (maps or {}).items()]
    lines += [
        "    std::fclose(at_in);",
        f"    at_emu::launch([&] {{ {entry}({', '.join(names)}); }}, dim3(at_g[0], at_g[1], at_g[2]), dim3(at_g[3], at_g[4], at_g[5]), at_shared, std::atof(argv[3]), dim3(at_g[6], at_g[7], at_g[8]));",
        '    FILE* at_out = std::fopen((at_dir + "/out.bin").c_str(), "wb");',
        "    if (!at_out) return 2;",
    ]
    lines += [f"    if (at_n{i}) std::fwrite(at_b{i}, 1, at_n{i}, at_out);" for i, (is_array, _) in enumerate(params) if is_array]
    lines += ["    std::fclose(at_out);", "    return 0;", "}", ""]
    return "\n".join(lines)


def _trimmed(text: str, head: int = 5000, tail: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= head + tail else f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


def _runtime(flags: Sequence[str], workdir: Path) -> Path:
    """The emulator's runtime (launch, barriers, cp.async) as an object, compiled once per flags."""
    assert CXX is not None
    digest = hashlib.sha256("\0".join([*flags, EMULATOR.read_text()]).encode()).hexdigest()[:20]
    obj = workdir / f"emu-runtime-{digest}.o"
    if not obj.is_file():
        workdir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".runtime-", suffix=".o", dir=workdir)
        os.close(fd)
        cmd = [CXX, *flags, "-DAT_HOST_EMULATION=1", "-DAT_EMU_IMPLEMENTATION", "-x", "c++", "-c", str(EMULATOR), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            os.unlink(tmp)
            raise AssertionError(f"g++ could not build the emulator's runtime:\n{_trimmed(done.stderr)}")
        os.replace(tmp, obj)
    return obj


def build(
    source: str,
    headers: Sequence[tuple[str, str]],
    entry: str,
    params: Sequence[tuple[bool, str]],
    *,
    workdir: Path,
    fp_contract: bool = False,
    maps: Mapping[int, int] | None = None,
) -> Path:
    """The emulation program of `entry` in `source` (built once per content hash under workdir);
    `maps`: tensor-map parameter -> the parameter index of its array."""
    if CXX is None:
        raise AssertionError("g++ is needed to run kernels on the host emulator")
    flags = (*FLAGS, "-ffp-contract=fast" if fp_contract else "-ffp-contract=off")
    runtime = _runtime(flags, Path(workdir))
    main = _main(entry, params, maps)
    # the harness's own headers first: the kernel's macros must not reach them
    wrapper = "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <new>\n#include <string>\n"
    wrapper += '#define AT_HOST_EMULATION 1\n#include "emulator.h"\n#include "kernel.cu"\n' + main
    blob = "\0".join([*flags, EMULATOR.read_text(), wrapper, source, *(f"{n}\0{t}" for n, t in headers)])
    digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
    workdir = Path(workdir)
    target = workdir / f"emu-{entry}-{digest}"
    exe = target / "kernel"
    if exe.is_file():
        return exe
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{entry}-", dir=workdir))
    (tmp / "kernel.cu").write_text(emulation_source(source))
    for name, text in headers:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(emulation_source(text))
    (tmp / "main.cpp").write_text(wrapper)
    cmd = [CXX, *flags, f"-I{tmp}", f"-I{EMULATOR.parent}", "main.cpp", str(runtime), "-o", "kernel"]
    done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AssertionError(f"g++ could not build the host emulation of kernel {entry}:\n{_trimmed(done.stderr)}")
    try:
        tmp.rename(target)
    except OSError:  # built meanwhile by another process: same content
        shutil.rmtree(tmp, ignore_errors=True)
    return exe


def _storage(p: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Where a kernel's array argument lives: (the bytes the emulation gets, the byte offset of
    the argument's first element in them, where they start in the array that owns the memory).
    A C-contiguous array is its own bytes. A view with other strides (a transpose, a column
    slice, a padded leading dimension) is passed as the bytes of its owner from the view's first
    element to its last, so the kernel walks them by the view's strides; the bytes start at the
    owner's start rounded down the view's offset to 256, so that a view that is misaligned in its
    owner is misaligned on the emulator too, and ASan still reports any access past the view's end."""
    if p.flags.c_contiguous or p.size == 0:
        return np.ascontiguousarray(p).reshape(-1).view(np.uint8), 0, -1
    if any(s < 0 for s in p.strides):
        raise ValueError("the emulator takes views with non-negative strides only")
    owner = p
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    memory = owner if owner.flags.c_contiguous else owner.T  # a Fortran-ordered owner: its transpose
    if not memory.flags.c_contiguous:
        raise ValueError("a view's owning array must be dense (C- or Fortran-contiguous)")
    flat = memory.reshape(-1).view(np.uint8)
    start = p.ctypes.data - owner.ctypes.data
    end = start + sum((n - 1) * s for n, s in zip(p.shape, p.strides)) + p.itemsize
    if start < 0 or end > flat.size:
        raise ValueError("a view outside its owning array")
    first = start - start % 256
    return flat[first:end], start - first, first


def _dims(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
        raise ValueError(f"expected 1 to 3 non-negative dimensions, got {value!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]


def run_kernel(
    source: str,
    headers: Sequence[tuple[str, str]],
    entry: str,
    params: Sequence[Any],
    grid: int | Sequence[int],
    block: int | Sequence[int],
    *,
    workdir: Path,
    mode: str = "deferred",
    timeout_s: float = 120.0,
    shared_bytes: int = 0,
    fp_contract: bool = False,
    cluster: int | Sequence[int] = 1,
) -> None:
    """Launch `entry` with `params` (NumPy arrays, passed as pointers and written back in place,
    and NumPy scalars, e.g. np.float32(2.0), np.int32(5), in the kernel's parameter order) on the
    host emulator. mode: how cp.async copies land ("deferred" or "immediate", see emulator.h).
    cluster: the thread-block cluster's dims (its blocks run together). A grid with a zero
    dimension launches nothing."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    g, b, cl = _dims(grid), _dims(block), _dims(cluster)
    if 0 in g:
        return
    half = _half_type([source, *(t for _, t in headers)])
    kinds: list[tuple[bool, str]] = []
    maps: dict[int, int] = {}
    payload = [struct.pack("<9IQ", *g, *b, *cl, int(shared_bytes))]
    stores: list[tuple[np.ndarray, np.ndarray, int]] = []  # (argument, its bytes, where they start in its owner)
    for i, p in enumerate(params):
        if isinstance(p, np.ndarray):
            buffer, offset, first = _storage(p)
            data = buffer.tobytes()
            stores.append((p, buffer, first))
            kinds.append((True, _c_type(p.dtype, half)))
            payload += [struct.pack("<QQ", len(data), offset), data]
        elif isinstance(p, np.generic):
            kinds.append((False, _c_type(p.dtype, half)))
            payload.append(p.tobytes())
        elif isinstance(p, TensorMapParam):
            kinds.append((False, "CUtensorMap"))
            payload.append(p.to_bytes())
            if p.args is not None:
                maps[i] = p.source
        else:
            raise TypeError(
                f"parameter {i} of {entry}: expected a NumPy array, a NumPy scalar (np.int32(5)) or a TensorMapParam, got {type(p).__name__}"
            )
    exe = build(source, headers, entry, kinds, workdir=Path(workdir), fp_contract=fp_contract, maps=maps)
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{entry}-", dir=workdir))
    try:
        (run_dir / "args.bin").write_bytes(b"".join(payload))
        clusters = "" if cl == (1, 1, 1) else f", clusters {cl}"
        what = f"kernel {entry} (grid {g}, block {b}{clusters}, {mode} cp.async)"
        try:
            done = subprocess.run(
                [str(exe), str(run_dir), mode, str(max(1.0, 0.8 * timeout_s))],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
                env={**os.environ, **_ENV},
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            raise AssertionError(f"{what} did not finish within {timeout_s} s: a hang?\n{_trimmed(err)}") from None
        if done.returncode:
            why = {86: "an emulator check failed", 87: "a block hung"}.get(done.returncode, f"exit status {done.returncode}")
            raise AssertionError(f"{what} failed ({why}):\n{_trimmed(done.stderr + done.stdout)}")
        result = (run_dir / "out.bin").read_bytes()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    pos = 0
    for p, buffer, first in stores:
        n = buffer.size
        if p.flags.writeable and n:
            if first < 0:
                p[...] = np.frombuffer(result[pos : pos + n], dtype=p.dtype).reshape(p.shape)
            else:  # a view: the kernel's writes land in its owner's bytes
                buffer[...] = np.frombuffer(result[pos : pos + n], dtype=np.uint8)
        pos += n
    assert pos == len(result), f"{entry}: the emulation wrote {len(result)} bytes of arrays, expected {pos}"


def _tensor_map_param(
    spec: Any, types: Mapping[str, Any], config: Mapping[str, Any], arg: Any, array: Any, source: int, arch: str
) -> TensorMapParam:
    """A tensor-map argument as the runtime makes it: zeros where its `when` is false for the
    config (on `arch`), else tensor_map_args' checked driver-order arguments for the array."""
    from hatch_autotune.runtime.selection import arch_env
    from hatch_autotune.runtime.tensor_map import tensor_map_args

    decl = arg.tensor_map
    env = {**spec.type_env(types), **config, **arch_env(arch)}
    if decl.when is not None and not decl.when(env):
        return TensorMapParam(source, None)
    dtype = str({a.name: a for a in spec.args}[decl.array].dtype)
    dtype = str(types.get(dtype, dtype))
    strides = tuple(int(st) // array.itemsize for st in array.strides)
    box = tuple(int(e(env)) for e in decl.box)
    args = tensor_map_args(f"{spec.name}: tensor map {arg.name!r}", decl, dtype, tuple(array.shape), strides, box)
    return TensorMapParam(source, args, DTYPE_SIZES[dtype])


class Launch(NamedTuple):
    params: list[Any]  # in the kernel's order
    grid: list[int]
    block: list[int]
    shared: int  # dynamic shared bytes
    cluster: list[int]  # [1, 1, 1]: no clusters


def launch_of(spec: Any, types: Mapping[str, Any], config: Mapping[str, Any], args: Mapping[str, Any], arch: str = "sm_90a") -> Launch:
    """What the runtime would launch for one config of a declared kernel (a KernelSpec) called
    with `args` (the caller's arguments by name: arrays, and the scalars without a `value`).
    Arrays are passed through (NumPy here, CuPy in tests/test_gpu_showcase.py) after a dtype and
    shape check; tensor maps are TensorMapParams (on a GPU, tests/gpu_launch.py encodes them with
    the driver)."""
    key: dict[str, int] = {}
    for k in spec.key:
        given = args[k.source]
        key[k.name] = int(given.shape[k.axis]) if k.axis is not None else int(given)
    instance = spec.type_env(types)
    env: dict[str, Any] = {**key, **instance}
    for a in spec.args:  # strided arrays' strides in elements, for computed scalars (x_stride0, ...)
        arr = args.get(a.name)
        for axis, name in enumerate(a.stride_names()):
            env[name] = int(arr.strides[axis]) // arr.itemsize if arr is not None else 0
    params: list[Any] = []
    position = {a.name: i for i, a in enumerate(spec.args)}
    for a in spec.args:
        if a.tensor_map is not None:
            params.append(_tensor_map_param(spec, types, config, a, args[a.tensor_map.array], position[a.tensor_map.array], arch))
            continue
        dtype = np.dtype(types[a.dtype] if a.dtype in spec.types else a.dtype)
        if a.is_array:
            arr = args[a.name]
            expected = tuple(int(e(env)) for e in a.shape)
            if getattr(arr, "dtype", None) != dtype or tuple(getattr(arr, "shape", ())) != expected:
                got = f"{arr.dtype} {arr.shape}" if hasattr(arr, "shape") else type(arr).__name__
                raise ValueError(f"{spec.name}: argument {a.name!r} must be a {dtype} array of shape {expected}, got {got}")
            params.append(arr)
        else:
            value = a.value(env) if a.value is not None else args[a.name]
            params.append(dtype.type(value))
    geometry = {**key, **config, **instance}
    grid = [int(e(geometry)) for e in spec.grid]
    block = [int(e(geometry)) for e in spec.block]
    cluster = [int(e(geometry)) for e in spec.cluster or ()]
    return Launch(params, grid, block, int(spec.shared(geometry)), [*cluster, 1, 1, 1][:3])


def run_variant(
    spec: Any,
    types: Mapping[str, Any],
    config: Mapping[str, Any],
    args: Mapping[str, Any],
    *,
    workdir: Path,
    mode: str = "deferred",
    timeout_s: float = 120.0,
    fp_contract: bool = False,
) -> Any:
    """Render one config of a declared kernel (a KernelSpec) and run it on the host emulator,
    launched as `launch_of` says. Output arrays are written in place. Returns the rendered Variant."""
    from hatch_autotune.compile.render import render_config

    variant, _ = render_config(spec, types, config)
    params, grid, block, shared, cluster = launch_of(spec, types, config, args)
    for name, p in zip((a.name for a in spec.args), params):
        if not isinstance(p, (np.ndarray, np.generic, TensorMapParam)):
            raise TypeError(f"{spec.name}: argument {name!r} must be a NumPy array or scalar on the emulator, got {type(p).__name__}")
    run_kernel(
        variant.source,
        variant.headers,
        spec.entry,
        params,
        grid,
        block,
        workdir=workdir,
        mode=mode,
        timeout_s=timeout_s,
        shared_bytes=shared,
        fp_contract=fp_contract,
        cluster=cluster,
    )
    return variant
