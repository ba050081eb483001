"""The compare kernel (hatch_autotune/tuning/compare.cu) emulated for the driver stand-in.

The emulation is PLUMBING: it decodes the launch's packed parameters, reads the two device
buffers, applies `verify.compare_host` and merges the result into the record the way the kernel's
atomics do. It shows that `DeviceComparer` packs, launches, initialises and reads the record as
the real cubin expects (the stand-in checks every argument's size against the cubin); it says
nothing about the kernel's rule. That the CUDA source implements the rule is shown by compiling
it as host C++ (tests/test_device_verify.py), and on a GPU by running it.

`register()` adds the emulator for every compare entry to the stand-in's EMULATORS (for a whole
process, such as tests/standin_worker.py); a test uses `monkeypatch.setitem` over `ENTRIES`.
"""

from __future__ import annotations

import struct

import cuda_standin
import numpy as np

from hatch_autotune.tuning.device_verify import PAIRS, RECORD_FIELDS, entry_name
from hatch_autotune.tuning.dtypes import numpy_dtype
from hatch_autotune.tuning.verify import compare_host

ENTRIES = {entry_name(got, expected): (got, expected) for got, expected in PAIRS}
FIELD = {name: i for i, name in enumerate(RECORD_FIELDS)}


def compare_emulator(standin: cuda_standin.StandIn, kernel: cuda_standin.FakeKernel, launch: cuda_standin.Launch) -> float:
    """Do what a launch of a compare kernel does; SYNTHETIC milliseconds."""
    got_dtype, expected_dtype = ENTRIES[kernel.entry]
    got_ptr, expected_ptr = (int.from_bytes(p, "little") for p in launch.params[:2])
    (n,) = struct.unpack("<Q", launch.params[2])
    rtol, atol = (struct.unpack("<d", p)[0] for p in launch.params[3:5])
    record_ptr = int.from_bytes(launch.params[5], "little")
    if launch.block[0] % 32 or launch.block[1:] != (1, 1):
        raise AssertionError(f"the compare kernel's reduction needs whole warps in x, got block {launch.block}")
    got = standin.view(got_ptr, numpy_dtype(got_dtype), n)  # a dtype, not a typestr: '<V2' is no bfloat16
    expected = standin.view(expected_ptr, numpy_dtype(expected_dtype), n)
    found = compare_host("emulated", got, expected, rtol, atol)
    record = standin.view(record_ptr, "<u8", len(RECORD_FIELDS))
    if found.unwritten:
        record[FIELD["unwritten"]] += found.unwritten
        record[FIELD["first_unwritten"]] = min(int(record[FIELD["first_unwritten"]]), found.first_unwritten)
    if found.differ:
        record[FIELD["differ"]] += found.differ
        record[FIELD["first_differ"]] = min(int(record[FIELD["first_differ"]]), found.first_differ)
        worst_bits = int(np.float64(found.worst_error).view(np.uint64))
        record[FIELD["worst_error_bits"]] = max(int(record[FIELD["worst_error_bits"]]), worst_bits)
    return 0.001 + n * 2e-9  # SYNTHETIC: about what an H200 reads at 4 TB/s


def register() -> None:
    for entry in ENTRIES:
        cuda_standin.EMULATORS[entry] = compare_emulator
