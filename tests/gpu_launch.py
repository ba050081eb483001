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


def compile_every_config(project: Any, names: tuple[str, ...], arch: str, cache_dir: Path, folder: Path) -> dict[str, list]:
    """kernel -> [(types, config, cubin path)] for every config of every type instance, for `arch`."""
    out: dict[str, list] = {}
    for name in names:
        spec = project.kernels[name]
        variants = [v for vs in render_kernel(spec).values() for v in vs]
        results = compile_all([v.compile_job(arch, spec.entry, spec.nvrtc_options) for v in variants], CompileCache(cache_dir))
        out[name] = []
        for i, (v, r) in enumerate(zip(variants, results)):
            assert r.ok, f"{name} {v.types_dict} {v.config_dict}: {r.log[-500:]}"
            path = folder / f"{name}_{i}.cubin"
            path.write_bytes(r.binary)
            out[name].append((v.types_dict, v.config_dict, path))
    return out


def launch(cp: Any, spec: Any, types: Any, config: Any, cubin: Path, args: dict[str, Any]) -> None:
    """One launch of one config's cubin with `args` (CuPy arrays and scalars by argument name)."""
    params, grid, block, shared = host_cuda.launch_of(spec, types, config, args)
    if cubin not in _FUNCTIONS:
        _FUNCTIONS[cubin] = cp.RawModule(path=str(cubin)).get_function(spec.entry)
    function = _FUNCTIONS[cubin]
    if shared > 48 * 1024:  # the opt-in the runtime makes (cuFuncSetAttribute) before such a launch
        function.max_dynamic_shared_size_bytes = shared
    if 0 not in grid:
        function(tuple(grid), tuple(block), tuple(params), shared_mem=shared)
