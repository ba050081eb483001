"""Every config of a declared kernel compiled for the GPU here and launched as the runtime would
launch it (host_cuda.launch_of: arguments, strides, grid, block and dynamic shared memory from the
declaration) on CuPy arrays: what tests/test_gpu_showcase.py and tests/test_gpu_tensor_core.py
check each config with, past what the tuner measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import host_cuda

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import compile_all
from hatch_autotune.compile.render import render_kernel

_FUNCTIONS: dict[Path, Any] = {}


def runs_on_arch(spec: Any, types: Any, config: Any, arch: str) -> bool:
    """Whether a config is a candidate on `arch` at some bucket (its point constraints: e.g. the
    gemm's WGMMA = 1 family only on sm_90a)."""
    from hatch_autotune.declare.space import bucket_points
    from hatch_autotune.runtime.selection import arch_env

    env = {**spec.type_env(types), **dict(getattr(spec, "dims", {}) or {}), **config, **arch_env(arch)}
    names = [k.name for k in spec.key]
    for point in bucket_points([k.buckets for k in spec.key]):
        here = {**env, **dict(zip(names, point))}
        if all(c(here) for _, c in spec.point_constraints):
            return True
    return False


def compile_every_config(project: Any, names: tuple[str, ...], arch: str, cache_dir: Path, folder: Path) -> dict[str, list]:
    """kernel -> [(types, config, cubin path)] for every config of every type instance that runs
    on `arch` (its point constraints), for `arch`."""
    out: dict[str, list] = {}
    for name in names:
        spec = project.kernels[name]
        variants = [v for vs in render_kernel(spec).values() for v in vs if runs_on_arch(spec, v.types_dict, v.config_dict, arch)]
        results = compile_all([v.compile_job(arch, spec.entry, spec.nvrtc_options) for v in variants], CompileCache(cache_dir))
        out[name] = []
        for i, (v, r) in enumerate(zip(variants, results)):
            assert r.ok, f"{name} {v.types_dict} {v.config_dict}: {r.log[-500:]}"
            path = folder / f"{name}_{i}.cubin"
            path.write_bytes(r.binary)
            out[name].append((v.types_dict, v.config_dict, path))
    return out


def tensor_map_bytes(param: host_cuda.TensorMapParam, array: Any) -> bytes:
    """The 128 bytes of a tensor-map argument for a CuPy array, as the runtime encodes them: the
    driver's cuTensorMapEncodeTiled of launch_of's checked arguments (zeros where the map's
    `when` is false for the config)."""
    import ctypes

    from cuda.bindings import driver

    from hatch_autotune.runtime.tensor_map import encode_tiled

    if param.args is None:
        return bytes(128)
    err, tensor_map = encode_tiled(driver, param.args, array.data.ptr)  # the runtime's own call
    assert err == driver.CUresult.CUDA_SUCCESS, f"cuTensorMapEncodeTiled: {err}"
    return ctypes.string_at(int(tensor_map.getPtr()), 128)


def _launch_raw(cp: Any, function: Any, grid: Any, block: Any, shared: int, values: list[Any], cluster: Any = (1, 1, 1)) -> None:
    """cuLaunchKernel with each parameter's bytes (a kernel with tensor maps, 128 bytes by value,
    which a CuPy kernel call cannot pass), on CuPy's current stream; cuLaunchKernelEx with the
    runtime's own CUlaunchConfig (launching.ExConfig) for a cluster launch."""
    import ctypes

    from cuda.bindings import driver

    keep = []
    for v in values:
        raw = (
            v
            if isinstance(v, bytes)
            else (v.data.ptr.to_bytes(8, "little") if hasattr(v, "data") and hasattr(v.data, "ptr") else v.tobytes())
        )
        buf = ctypes.create_string_buffer(raw, len(raw) + 64)
        start = (ctypes.addressof(buf) + 63) // 64 * 64  # 64-byte aligned, as a CUtensorMap is
        ctypes.memmove(start, raw, len(raw))
        keep.append((buf, start))
    pointers = (ctypes.c_void_p * len(keep))(*[start for _, start in keep])
    stream = cp.cuda.get_current_stream().ptr
    if tuple(cluster) == (1, 1, 1):
        (err,) = driver.cuLaunchKernel(function.ptr, *grid, *block, shared, stream, ctypes.addressof(pointers), 0)
        assert err == driver.CUresult.CUDA_SUCCESS, f"cuLaunchKernel: {err}"
    else:
        from hatch_autotune.runtime.launching import ExConfig

        launch = ExConfig(driver, (None, *grid, *block, shared), tuple(cluster))
        launch.config.hStream = stream
        (err,) = driver.cuLaunchKernelEx(launch.config, function.ptr, ctypes.addressof(pointers), 0)
        assert err == driver.CUresult.CUDA_SUCCESS, f"cuLaunchKernelEx (cluster {tuple(cluster)}): {err}"
    cp.cuda.get_current_stream().synchronize()


def launch(cp: Any, spec: Any, types: Any, config: Any, cubin: Path, args: dict[str, Any]) -> None:
    """One launch of one config's cubin with `args` (CuPy arrays and scalars by argument name);
    tensor-map arguments encoded from their arrays as the runtime encodes them."""
    params, grid, block, shared, cluster = host_cuda.launch_of(spec, types, config, args)
    maps = {i: a for i, a in enumerate(spec.args) if getattr(a, "tensor_map", None) is not None}
    if cubin not in _FUNCTIONS:
        _FUNCTIONS[cubin] = cp.RawModule(path=str(cubin)).get_function(spec.entry)
    function = _FUNCTIONS[cubin]
    if shared > 48 * 1024:  # the opt-in the runtime makes (cuFuncSetAttribute) before such a launch
        function.max_dynamic_shared_size_bytes = shared
    if 0 in grid:
        return
    if not maps and cluster == [1, 1, 1]:
        function(tuple(grid), tuple(block), tuple(params), shared_mem=shared)
        return
    values = list(params)
    for i, a in maps.items():
        values[i] = tensor_map_bytes(params[i], args[a.tensor_map.array])
    _launch_raw(cp, function, (*grid, 1, 1)[:3], (*block, 1, 1)[:3], shared, values, cluster)
