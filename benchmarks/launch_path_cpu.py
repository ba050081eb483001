"""Per-call Python cost of a generated kernel callable on the CPU (no GPU needed), against a raw
pre-packed launch on the same stand-in.

Both sides call the same driver stand-in (tests/cuda_standin.py) through the runtime's seam, with
the driver's launch (`cuLaunchKernel`) and the current-context queries (`cuCtxGetCurrent`,
`cuCtxGetDevice`) replaced by functions that return success at once: what remains is Python. The raw side is what a
hand-written launcher costs at best: `cuLaunchKernel(function, grid, block, shared, stream,
params, 0)` with a parameter buffer packed once. The generated side is `kernels.saxpy(a, x, y)`
on its fast path (pointer reads, the plan's lookup and checks, packing into its buffer, the
context check, the launch). "ours" = generated - raw per call is our layer's Python cost. Arrays:
the stand-in's __cuda_array_interface__ arrays, and imitations of CuPy arrays and PyTorch
tensors (tests/standin_arrays.py: plain Python attributes, so their reads cost less or more than
the real libraries' C attributes; benchmarks/launch_overhead.py measures those on a GPU). Also:
the fast path on two GPUs (arrays on the second device) and the fully checked path.

The profile, step by step: the kernel's generated call (hatch_autotune/runtime/fastcall.py) cut
after each of its `# step:` lines (the call made to return there, its parameter buffer given
back), timed beside the whole call, the raw launch and a call that does nothing (the floor), for
each kind of array; a step's cost is its cut's time less the cut before it (the first less the
floor), and "the launch" is the kernel's whole call less the last cut (the context check
and cuLaunchKernel, as the raw launch calls it).

The contenders are interleaved within each repetition; medians and spreads over repetitions.

    python benchmarks/launch_path_cpu.py [--out DIR] [--quick]   # writes launch_path_cpu.json
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from _common import ROOT, example_project, import_generated, machine, options, write_result

CALLS, REPEATS = 20_000, 9
N = 1024
GOAL_US = 1.5


def loop_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def setup(rt, kernels, gpus: int, patch, steps: bool = False) -> dict:
    """The contenders over a fresh stand-in of `gpus` devices, arrays on the last one; each
    checked once to launch what it should before the launch becomes a no-op."""
    import cuda_standin
    import numpy as np
    from standin_arrays import install_cupy, install_torch

    device = gpus - 1
    ok = cuda_standin.R.CUDA_SUCCESS
    standin = cuda_standin.install_globally([(9, 0)] * gpus, runtime=rt)
    cuda_standin.FakeDevice(device).set_current()
    api = standin.api()
    driver = SimpleNamespace(**vars(api.driver))
    primary = api.driver.cuDevicePrimaryCtxRetain(device)[1]
    driver.cuCtxGetDevice = lambda: (ok, device)
    driver.cuCtxGetCurrent = lambda: (ok, primary)  # the launch's check: the device's primary context is current
    driver.cuPointerGetAttribute = lambda attr, ptr: (ok, device)
    rt.use_gpu(api.replace(driver=driver))
    saxpy = rt.Library.load(kernels._LIBRARY.directory).kernels["saxpy"]
    cupy, torch = install_cupy(patch, standin), install_torch(patch, standin)
    arrays = {"cai": [cuda_standin.DeviceArray.empty(standin, (N,), device=device) for _ in range(2)]}
    if gpus == 1:
        arrays["cupy"] = [cupy.ndarray((N,), device=device) for _ in range(2)]
        arrays["torch"] = [torch.Tensor((N,), device=device) for _ in range(2)]
    pointer = {"cai": lambda a: a.__cuda_array_interface__["data"][0], "cupy": lambda a: a.data.ptr, "torch": lambda a: a.data_ptr()}
    for i, (kind, (x, y)) in enumerate(arrays.items()):
        saxpy(2.0, x, y)  # the checked path: records the plan (and loads the module)
        saxpy(2.0, x, y)
        assert saxpy.checked_calls == 1 + i, f"{kind}: the fast path was missed"
        launch = standin.launches[-1]
        assert float(launch.param(0, "float32")) == 2.0 and int(launch.param(1, "uint64")) == pointer[kind](x), f"{kind}: other parameters"
    driver.cuLaunchKernel = lambda *args: (ok,)  # from here on, launches do nothing
    head = next(iter(saxpy._fast.values())).head
    x, y = arrays["cai"]
    params = rt.params.ParamBuffer([("float32", 0, None), ("pointer", 1, None), ("pointer", 2, None), ("int32", None, N)])
    params.exact.pack_into(params.storage, 0, np.float32(2.0), pointer["cai"](x), pointer["cai"](y))
    launch_kernel, address, stream = driver.cuLaunchKernel, params.address, rt.cuda_seam.current.default_stream
    contenders = {"raw_prepacked": lambda: launch_kernel(*head, stream, address, 0)}
    for kind, (x, y) in arrays.items():
        contenders[f"generated_{kind}"] = lambda x=x, y=y: saxpy(2.0, x, y)
    if gpus == 2:
        x, y = arrays["cai"]
        contenders["checked_path"] = lambda: saxpy._call_checked([2.0, x, y], None, None, {})
        return contenders
    for kind, (x, y) in arrays.items() if steps else ():
        contenders.update(step_cuts(rt, saxpy, (2.0, x, y), kind))
    return contenders


def step_cuts(rt, saxpy, args: tuple, kind: str) -> dict:
    """The kernel's generated call cut after each `# step:` line, and whole (see the docstring)."""
    text = rt.fastcall.source(saxpy._user_kinds, saxpy._optional)
    lines = text.splitlines()
    taken = next(i for i, line in enumerate(lines) if "params = plan.take()" in line)
    cuts = {}
    for i, line in enumerate(lines):
        if line.strip().startswith("# step:"):
            indent = line[: len(line) - len(line.lstrip())]
            back = [f"{indent}plan.give(params)"] if i > taken else []
            call = rt.fastcall.fast_call(saxpy, "\n".join([*lines[:i], *back, f"{indent}return None", *lines[i:]]))
            name = line.split("# step:")[1].strip()
            cuts[f"step_{kind}: {name}"] = lambda call=call: call(saxpy, *args)
    return {f"step_{kind}: floor": lambda: _nothing(saxpy, *args), **cuts}


def _nothing(self: object, *args: object, stream: object = None, **kwargs: object) -> None:
    """A call with the generated call's signature that does nothing: the steps' floor."""


def step_table(per: dict[str, dict[str, float]]) -> dict[str, list[dict[str, float | str]]]:
    """Per kind of array: each step, its cut's median µs and the step's own cost."""
    table: dict[str, list[dict[str, float | str]]] = {}
    for name, stats in per.items():
        if name.startswith("step_"):
            kind, step = name.removeprefix("step_").split(": ", 1)
            rows = table.setdefault(kind, [])
            if step == "floor":
                rows.append({"step": "floor: a Python call that does nothing", "cut_us": stats["median"], "step_us": 0.0})
                continue
            before = rows[-1]["cut_us"]
            rows.append({"step": step, "cut_us": stats["median"], "step_us": stats["median"] - float(before)})
    for kind, rows in table.items():
        whole = per[f"generated_{kind}"]["median"]
        rows.append({"step": "the launch", "cut_us": whole, "step_us": whole - float(rows[-1]["cut_us"])})
    return table


def interleaved(contenders: dict, calls: int, repeats: int, label: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotated: none always first
            samples[name].append(loop_us(contenders[name], calls))
        print(
            f"  {label} [{rep + 1}/{repeats}] " + ", ".join(f"{n} {samples[n][-1]:.2f}" for n in names if not n.startswith("step_")),
            flush=True,
        )
    return samples


def main() -> None:
    opts = options(__doc__).parse_args()
    calls, repeats = (CALLS // 10, 5) if opts.quick else (CALLS, REPEATS)
    sys.path.insert(0, str(ROOT / "tests"))
    import pytest

    host = machine()  # before the stand-in is installed, which would answer for a "GPU"
    kernels = import_generated(example_project(), Path(tempfile.mkdtemp()))
    rt = kernels._runtime
    patch = pytest.MonkeyPatch()  # sys.modules entries for the CuPy and PyTorch imitations
    samples = {
        "one_gpu": interleaved(setup(rt, kernels, 1, patch, steps=True), calls, repeats, "one GPU"),
        "two_gpus": interleaved(setup(rt, kernels, 2, patch), calls, repeats, "two GPUs"),
    }
    patch.undo()
    results = {setup_name: {name: summary(values) for name, values in per.items()} for setup_name, per in samples.items()}
    ours = {}
    for setup_name, per in results.items():
        raw = per["raw_prepacked"]["median"]
        for name, stats in per.items():
            if name.startswith("generated_") and not name.startswith("step_"):
                ours[f"{setup_name}_{name.removeprefix('generated_')}"] = stats["median"] - raw
    steps = step_table(results["one_gpu"])
    for kind, rows in steps.items():
        print(f"{kind}: " + ", ".join(f"{row['step']} {row['step_us']:+.2f}" for row in rows))
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "calls_per_loop": calls,
        "repeats": repeats,
        "quick": opts.quick,
        "results_us_per_call": results,
        "our_layer_us": ours,
        "steps_us": steps,
        "goal_us": GOAL_US,
        "goal_met": all(v <= GOAL_US for v in ours.values()),
        "samples_us": samples,
        "machine": host,
    }
    print(write_result("launch_path_cpu.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
