"""Issue #53's showcase kernels against their peers (GPU only), side by side in one run.

gemm (bfloat16 and float16 on the tensor cores, float32 accumulation) against cuBLAS in the same
precision: PyTorch's `torch.matmul` with reduced-precision reductions off
(`allow_bf16_reduced_precision_reduction = False`, and the float16 one), so both accumulate in
float32 and round once to the output type. Sizes: 4096^3, 1024^3 and the skinny LLM shapes
M = 16, 128, 512 with N = K = 4096. Layouts: `NN` (A and B row-major, `x @ w`) and `NT` (B the
transpose of a row-major [N, K] weight, `x @ W.T` as nn.Linear computes it); cuBLAS gets the same
views (PyTorch hands it the transpose flag, no copy). TFLOP/s = 2 m n k / time.

rmsnorm and add_rmsnorm (bfloat16, rows of 4096 and 8192) against two peers: the streaming
ceiling (roofline.py's streaming copy kernels, the fastest correct launch shape in this run) on
BIG_BYTES arrays, each DRAM byte counted once (rmsnorm: x read, y written; add_rmsnorm: x and
residual read, y and residual_out written; the weight vector is not counted), and PyTorch eager
(`torch.nn.functional.rms_norm`; for add_rmsnorm `r = x + residual` then rms_norm of r).

Every result is checked before it counts: gemm against cuBLAS over the whole matrix (max |ours -
cuBLAS| / max |cuBLAS| <= GEMM_TOL) and both against float64 on sampled rows; the norms against
a float32 reference on sampled rows. A wrong result makes the script exit 1 after writing.

Timing: CUDA events on one CuPy stream that PyTorch also runs on (torch.cuda.ExternalStream).
ROUNDS interleaved rounds (7; --quick 5) after a warm-up round, the order rotated each round;
GEMMs timed one launch at a time after an L2 flush, the 2 GiB norms back to back. Medians with
p25/p75 and the rounds' paired ratios; the selected config of each call and whether it was tuned.

    python benchmarks/tensor_core.py [--out DIR] [--quick]
"""

from __future__ import annotations

import time
from typing import Any

from _common import example_project, import_generated, machine, options, require_gpu, write_result
from roofline import (
    Contender,
    GiB,
    Timer,
    load_stream_kernels,
    paired,
    rate,
    run_section,
    sm_count,
    spread,
    streaming_contenders,
)

GEMM_SHAPES = ((4096, 4096, 4096), (1024, 1024, 1024), (16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096))
GEMM_TOL = 2e-2  # bfloat16 output: one rounding is up to 2^-8 of the element; both round from float32 sums
NORM_COLS = (4096, 8192)
EPS = 1e-6
BIG_BYTES = 2 * GiB
ROUNDS, QUICK_ROUNDS = 7, 5
GEMM_LAUNCHES, QUICK_GEMM_LAUNCHES = 5, 3
BIG_LAUNCHES, QUICK_BIG_LAUNCHES = 5, 3
FLUSH_BYTES = 256 << 20
GOALS = {"gemm_4096_mma_sync": 0.60, "gemm_skinny": 0.90, "norm_streaming": 0.90, "norm_vs_torch": 1.5}


def gemm_section(torch: Any, cp: Any, kernels: Any, timer: Timer, rounds: int, launches: int, quick: bool, errors: dict) -> tuple:
    """Ours and cuBLAS at each (shape, dtype, layout), interleaved, the L2 flushed before each launch."""
    gen = torch.Generator(device="cuda").manual_seed(53)
    contenders = []
    cases = [(s, "bfloat16", layout) for s in GEMM_SHAPES for layout in ("NN", "NT")]
    cases += [((4096, 4096, 4096), "float16", "NN")]
    if quick:
        cases = [c for c in cases if c[2] == "NN" or c[0][0] == 4096]
    for (m, n, k), dtype_name, layout in cases:
        dtype = getattr(torch, dtype_name)
        a = torch.empty((m, k), device="cuda", dtype=dtype).uniform_(-1, 1, generator=gen)
        if layout == "NN":
            b = torch.empty((k, n), device="cuda", dtype=dtype).uniform_(-1, 1, generator=gen)
        else:  # B = W.T of an nn.Linear weight W [n, k]
            b = torch.empty((n, k), device="cuda", dtype=dtype).uniform_(-1, 1, generator=gen).t()
        c_ours, c_blas = torch.empty((m, n), device="cuda", dtype=dtype), torch.empty((m, n), device="cuda", dtype=dtype)
        tag = f"{dtype_name} {layout} {m}x{n}x{k}"

        def ours(a: Any = a, b: Any = b, c: Any = c_ours) -> None:
            kernels.gemm(a, b, c, stream=timer.stream.ptr)

        def cublas(a: Any = a, b: Any = b, c: Any = c_blas) -> None:
            torch.matmul(a, b, out=c)

        def check(a: Any = a, b: Any = b, c: Any = c_ours, ref: Any = c_blas, ours: Any = ours, cublas: Any = cublas) -> dict:
            c.fill_(float("nan"))
            ours()
            cublas()
            scale = float(ref.float().abs().max())
            rel = float((c.float() - ref.float()).abs().max()) / scale
            rows = torch.cat([torch.arange(min(16, a.shape[0])), torch.arange(max(0, a.shape[0] - 16), a.shape[0])]).cuda()
            exact = a[rows].double() @ b.double()
            top = float(exact.abs().max())
            vs64 = {
                "ours": float((c[rows].double() - exact).abs().max()) / top,
                "cublas": float((ref[rows].double() - exact).abs().max()) / top,
            }
            return {"ok": rel <= GEMM_TOL, "rel_err_vs_cublas": rel, "tol": GEMM_TOL, "rel_err_vs_float64_sample_rows": vs64}

        meta: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dtype_name, "layout": layout, "flop": 2.0 * m * n * k}
        try:
            sel = kernels.gemm.select(m=m, n=n, k=k, T=dtype_name, A_unit_stride=True, B_unit_stride=layout == "NN")
            meta.update(config=sel.config, tuned=sel.tuned, bucket=sel.bucket, binary=sel.binary)
        except Exception as exc:  # the figures still count; say why the selection is missing
            meta["select_error"] = f"{type(exc).__name__}: {exc}"[:300]
        contenders.append(Contender(f"gemm {tag}", ours, launches, True, {**meta, "kind": "gemm", "peer": f"cublas {tag}"}, check))
        contenders.append(Contender(f"cublas {tag}", cublas, launches, True, {**meta, "kind": "cublas"}))
    print(f"[tensor_core] gemm: {len(cases)} cases, ours and cuBLAS, {rounds} rounds of {launches} launches", flush=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(timer.stream.ptr)):
        samples, checks = run_section("gemm", timer, contenders, rounds, errors)
    return {c.name: c.meta for c in contenders}, samples, checks


def norm_section(torch: Any, cp: Any, np: Any, kernels: Any, timer: Timer, arch: str, rounds: int, launches: int, errors: dict) -> tuple:
    """The streaming ceiling, ours and PyTorch eager for both norms at each row length, interleaved."""
    F = torch.nn.functional
    gen = torch.Generator(device="cuda").manual_seed(54)
    contenders: list[Contender] = []
    n = BIG_BYTES // 4
    src, dst = cp.random.RandomState(1).random_sample(n, dtype=cp.float32), cp.zeros(n, cp.float32)
    funcs, failed = load_stream_kernels(cp, arch)
    errors.update({f"stream {e}": why for e, why in failed.items()})

    def copy_check(call: Any) -> Any:
        def check() -> dict:
            dst.fill(0)
            call()
            return {"ok": bool(cp.array_equal(dst, src))}

        return check

    contenders += streaming_contenders(np, funcs, src, dst, sm_count(cp), launches, {"bytes": 2 * BIG_BYTES}, copy_check)
    for cols in NORM_COLS:
        rows = BIG_BYTES // (cols * 2)
        x = torch.empty((rows, cols), device="cuda", dtype=torch.bfloat16).normal_(generator=gen)
        res = torch.empty_like(x).normal_(generator=gen)
        w = torch.empty(cols, device="cuda", dtype=torch.bfloat16).uniform_(0.5, 1.5, generator=gen)
        y, r_out = torch.empty_like(x), torch.empty_like(x)
        sample = torch.cat([torch.arange(64), torch.arange(rows - 64, rows)]).cuda()

        def ours_rms(x: Any = x, w: Any = w, y: Any = y) -> None:
            kernels.rmsnorm(x=x, w=w, y=y, eps=EPS, stream=timer.stream.ptr)

        def torch_rms(x: Any = x, w: Any = w) -> None:  # eager: allocates its output, as a model's forward does
            F.rms_norm(x, (x.shape[1],), w, EPS)

        def ours_add(x: Any = x, res: Any = res, w: Any = w, y: Any = y, r_out: Any = r_out) -> None:
            kernels.add_rmsnorm(x=x, residual=res, w=w, y=y, residual_out=r_out, eps=EPS, stream=timer.stream.ptr)

        def torch_add(x: Any = x, res: Any = res, w: Any = w) -> None:
            F.rms_norm(x + res, (x.shape[1],), w, EPS)

        def reference(rows_x: Any, w: Any) -> Any:
            xf = rows_x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + EPS) * w.float()).to(torch.bfloat16).float()

        def check_rms(x: Any = x, w: Any = w, y: Any = y, ours: Any = ours_rms, sample: Any = sample) -> dict:
            y.fill_(float("nan"))
            ours()
            err = float((y[sample].float() - reference(x[sample], w)).abs().max())
            return {"ok": err <= 0.05, "max_abs_err_sample_rows": err}

        def check_add(
            x: Any = x, res: Any = res, w: Any = w, y: Any = y, r_out: Any = r_out, ours: Any = ours_add, sample: Any = sample
        ) -> dict:
            y.fill_(float("nan"))
            r_out.fill_(float("nan"))
            ours()
            r_want = (x[sample].float() + res[sample].float()).to(torch.bfloat16)
            err_r = float((r_out[sample].float() - r_want.float()).abs().max())
            err_y = float((y[sample].float() - reference(r_want, w)).abs().max())
            return {"ok": err_r == 0.0 and err_y <= 0.05, "max_abs_err_residual": err_r, "max_abs_err_y": err_y}

        base = {"rows": rows, "cols": cols, "dtype": "bfloat16"}
        for kernel, ours, peer, check, arrays in (
            ("rmsnorm", ours_rms, torch_rms, check_rms, 2),
            ("add_rmsnorm", ours_add, torch_add, check_add, 4),
        ):
            meta = {**base, "bytes": arrays * rows * cols * 2, "kernel": kernel}
            try:
                sel = getattr(kernels, kernel).select(rows=rows, cols=cols, T="bfloat16")
                meta.update(config=sel.config, tuned=sel.tuned, bucket=sel.bucket)
            except Exception as exc:
                meta["select_error"] = f"{type(exc).__name__}: {exc}"[:300]
            contenders.append(Contender(f"{kernel} {cols}", ours, launches, False, {**meta, "kind": "ours"}, check))
            contenders.append(Contender(f"torch {kernel} {cols}", peer, launches, False, {**meta, "kind": "torch"}))
    print(f"[tensor_core] norms: {len(contenders)} contenders, {rounds} rounds of {launches} back-to-back launches", flush=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(timer.stream.ptr)):
        samples, checks = run_section("norms", timer, contenders, rounds, errors)
    return {c.name: c.meta for c in contenders}, samples, checks


def rows_of(meta: dict, samples: dict, checks: dict) -> tuple[list[dict], dict | None]:
    """The result rows (pure): gemm against cuBLAS; norms against the ceiling and PyTorch."""
    streams = {name: s for name, s in samples.items() if name.startswith("stream:") and checks.get(name, {}).get("ok")}
    ceiling = min(streams, key=lambda name: spread(streams[name])["median"]) if streams else None
    out = []
    for name, m in meta.items():
        if name not in samples or m["kind"] not in ("gemm", "ours"):
            continue
        row = {
            "name": name,
            **{k: v for k, v in m.items() if k not in ("kind", "peer")},
            "ms": spread(samples[name]),
            "check": checks.get(name),
        }
        if m["kind"] == "gemm":
            row["tflops"] = rate(m["flop"], samples[name], 1e9)
            if m["peer"] in samples:
                row["vs_cublas"] = paired(samples[name], samples[m["peer"]], 1.0, 1.0)  # our rate over cuBLAS's
        else:
            row["gbps"] = rate(m["bytes"], samples[name], 1e6)
            peer = f"torch {name}"
            if peer in samples:
                row["vs_torch"] = paired(samples[name], samples[peer], 1.0, 1.0)
            if ceiling is not None:
                row["of_streaming"] = paired(samples[name], samples[ceiling], m["bytes"], 2 * BIG_BYTES)
        out.append(row)
    return out, ({"name": ceiling, "gbps": rate(2 * BIG_BYTES, samples[ceiling], 1e6)} if ceiling else None)


def main() -> None:
    ap = options(__doc__)
    opts = ap.parse_args()
    arch = require_gpu("tensor_core.py")
    import tempfile
    from pathlib import Path

    import cupy as cp
    import numpy as np
    import torch

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    t0 = time.monotonic()
    kernels = import_generated(example_project(), Path(tempfile.mkdtemp()))
    rounds = QUICK_ROUNDS if opts.quick else ROUNDS
    stream = cp.cuda.Stream(non_blocking=True)
    timer = Timer(cp, stream, FLUSH_BYTES)
    errors: dict[str, str] = {}
    meta, samples, checks = {}, {}, {}
    for section in (
        lambda: gemm_section(torch, cp, kernels, timer, rounds, QUICK_GEMM_LAUNCHES if opts.quick else GEMM_LAUNCHES, opts.quick, errors),
        lambda: norm_section(torch, cp, np, kernels, timer, arch, rounds, QUICK_BIG_LAUNCHES if opts.quick else BIG_LAUNCHES, errors),
    ):
        m, s, c = section()
        meta.update(m), samples.update(s), checks.update(c)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    rows, ceiling = rows_of(meta, samples, checks)
    wrong = [r["name"] for r in rows if not (r.get("check") or {}).get("ok")]
    payload = {
        "machine": machine(),
        "arch": arch,
        "rounds": rounds,
        "rows": rows,
        "streaming_ceiling": ceiling,
        "goals": GOALS,
        "errors": errors,
        "wrong": wrong,
        "seconds": time.monotonic() - t0,
    }
    path = write_result("tensor_core.json", payload, opts.out)
    for r in rows:
        ratio = r.get("vs_cublas") or r.get("of_streaming") or {}
        print(
            f"  {r['name']:<34} {'TFLOP/s' if 'tflops' in r else 'GB/s':>7} {(r.get('tflops') or r.get('gbps'))['median']:9.1f}  ratio {ratio.get('median', float('nan')):.3f}"
        )
    print(f"[tensor_core] wrote {path} in {time.monotonic() - t0:.0f} s; wrong: {wrong or 'none'}", flush=True)
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
