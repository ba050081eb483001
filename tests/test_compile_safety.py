"""Compiling safely: NVRTC output buffers that cannot corrupt Python's shared objects, a compile
pool that does not fork a process holding the CUDA driver, and the PTX facts (ISA version, NVRTC)
the runtime needs to refuse PTX that the driver cannot JIT.

The compile checks run in a subprocess: a corrupted interpreter or a broken pool must not take
the pytest process with it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, build, load_project, write_tiny_project

from hatch_autotune.compile import nvrtc as compile_mod
from hatch_autotune.errors import BuildError
from hatch_autotune.wheel import table as package


def run_python(script: str, tmp_path, *, stdin: bool = False, env: dict | None = None) -> dict:
    """Run `script` in a fresh interpreter (as a file, or as `python -`); return its last stdout line as JSON."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    cmd = [sys.executable, "-"] if stdin else [sys.executable, str(path)]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(
        cmd, input=path.read_text() if stdin else None, capture_output=True, text=True, cwd=tmp_path, env=full_env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"stdout": proc.stdout, **json.loads(proc.stdout.strip().splitlines()[-1])}


ONE_BYTE_BUFFERS = """\
import json
from hatch_autotune.compile.nvrtc import CompileJob, compile_one

SRC = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 2.0f; }'
ok_ptx, ptx, ptx_log = compile_one(CompileJob(SRC, "compute_90", "k"))  # PTX: an empty log, a 1-byte buffer
ok_cubin, cubin, cubin_log = compile_one(CompileJob(SRC, "sm_90", "k"))
ok_bad, _, bad_log = compile_one(CompileJob("this_is_not_cuda(;", "sm_90", "k"))
print(json.dumps({
    "space_byte": bytes([32])[0],
    "space_decodes": b" ".decode() == " ",
    "ptx": [ok_ptx, ptx_log, ptx.startswith(b"//"), b".entry k" in ptx, ptx.endswith(b"\\x00")],
    "cubin": [ok_cubin, cubin[:4] == b"\\x7fELF", "Used" in cubin_log and "registers" in cubin_log],
    "bad": [ok_bad, "this_is_not_cuda" in bad_log, bad_log.endswith("\\x00")],
}))
"""


def test_empty_log_does_not_overwrite_the_shared_one_byte_object(tmp_path):
    out = run_python(ONE_BYTE_BUFFERS, tmp_path)
    assert out["space_byte"] == 32 and out["space_decodes"]
    assert out["ptx"] == [True, "", True, True, False]
    assert out["cubin"] == [True, True, True]
    assert out["bad"] == [False, True, False]


MAPS = """\
5581c0a00000-5581c0a01000 r--p 00000000 08:01 1234 /usr/bin/python3.11
7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 2345 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2d000000 r-xp 00000000 08:01 3456 /venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13
7f1c2e000000-7f1c2e100000 r-xp 00000000 08:01 4567 /venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13
"""
MAPS_DRIVER = MAPS + "7f1c30000000-7f1c31000000 r-xp 00000000 08:01 5678 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n"


def test_start_method_forks_only_without_a_cuda_driver():
    assert not compile_mod.cuda_driver_loaded(MAPS)  # NVRTC and the runtime library are not the driver
    assert compile_mod.cuda_driver_loaded(MAPS_DRIVER)
    assert compile_mod.start_method(MAPS) == "fork"
    assert compile_mod.start_method(MAPS_DRIVER) in ("forkserver", "spawn") and compile_mod.start_method(MAPS_DRIVER) != "fork"


# No `if __name__ == "__main__":` guard on purpose: workers must not re-run the caller's script.
PARALLEL_BATCH = """\
import json, multiprocessing
print("MAIN RAN")
import hatch_autotune.compile.nvrtc as c
from hatch_autotune.compile.nvrtc import CompileJob, PARALLEL_THRESHOLD, compile_all, compile_one

c.cuda_driver_loaded = lambda maps=None: True  # as on a GPU builder, after cuInit in this process
methods = []
real_get_context = multiprocessing.get_context
multiprocessing.get_context = lambda method=None: methods.append(method) or real_get_context(method)

SRC = 'extern "C" __global__ void k(float* y) {{ y[threadIdx.x] = {}.0f * y[threadIdx.x]; }}'
jobs = [CompileJob(SRC.format(i), arch, "k") for i in range(PARALLEL_THRESHOLD // 2 + 1) for arch in ("sm_90", "compute_90")]
jobs.append(CompileJob("this_is_not_cuda(;", "sm_90", "k"))
serial = [compile_one(j) for j in jobs]
parallel = compile_all(jobs, None)
print(json.dumps({
    "n": len(jobs),
    "methods": methods,
    "ok": [r.ok for r in parallel],
    "serial_ok": [ok for ok, _, _ in serial],
    "same_binaries": all(r.binary == b for r, (_, b, _) in zip(parallel, serial)),
    "resources": [bool(r.resources and r.resources.registers) for r in parallel],
    "failure_logged": "this_is_not_cuda" in parallel[-1].log,
}))
"""


@pytest.mark.parametrize("stdin", [False, True], ids=["script", "stdin"])
def test_parallel_batch_with_cuda_driver_loaded_avoids_fork(tmp_path, stdin):
    out = run_python(PARALLEL_BATCH, tmp_path, stdin=stdin, env={"HATCH_AUTOTUNE_JOBS": "2"})
    assert out["n"] >= 16
    assert out["methods"] and "fork" not in out["methods"]
    assert set(out["methods"]) <= {"forkserver", "spawn"}
    assert out["stdout"].count("MAIN RAN") == 1  # no worker re-ran the caller's __main__
    assert out["ok"] == out["serial_ok"] == [True] * (out["n"] - 1) + [False]
    assert out["same_binaries"] and out["failure_logged"]
    assert out["resources"] == [True, False] * ((out["n"] - 1) // 2) + [False]  # ptxas -v for cubins only


def test_ptx_isa_is_parsed_from_the_version_directive():
    ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 9.5\n.target sm_90\n.address_size 64\n"
    assert package.ptx_isa(ptx, "bin/k.compute_90.ptx") == "9.5"
    assert package.ptx_isa(b"// .version 1.0 in a comment\n  .version 8.7\n", "x") == "8.7"
    with pytest.raises(BuildError, match=r"bin/k\.compute_90\.ptx.*\.version"):
        package.ptx_isa(b"// .version 9.5\n.target sm_90\n", "bin/k.compute_90.ptx")


def test_table_records_ptx_isa_and_nvrtc_for_ptx_binaries_only(tmp_path, session_cache):
    root = write_tiny_project(tmp_path / "p")
    result = build(root, session_cache)
    table, files = package.build_table(load_project(root), result)
    assert result.compiler == re.fullmatch(r"\d+\.\d+", result.compiler).group(0)
    seen = {"ptx": 0, "cubin": 0}
    for variant in table["kernels"]["scale"]["variants"].values():
        for bin_arch, info in variant["binaries"].items():
            if bin_arch.startswith("compute_"):
                version = re.search(rb"^\.version (\d+\.\d+)$", files[info["file"]], re.M).group(1).decode()
                assert info["ptx_isa"] == version and info["nvrtc"] == result.compiler
                seen["ptx"] += 1
            else:
                assert "ptx_isa" not in info and "nvrtc" not in info
                seen["cubin"] += 1
    assert seen["ptx"] and seen["cubin"]
