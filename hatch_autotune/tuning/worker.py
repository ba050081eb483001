"""Isolation: variants are measured in a worker subprocess, spoken to in JSON lines.

An illegal memory access poisons a CUDA context for good, an abort kills a process, and a hang
never returns; so the GPU work happens in a child process. The parent (`WorkerClient`) turns
a crash or a timeout into a failed measurement with its reason, starts a fresh worker and goes
on. The child (`main`, run as `python -m hatch_autotune.tuning.worker`) owns one device.

The messages, one JSON object per line each way, are protocol.py's.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..runtime import Binaries, CudaApi, CudaCallError, Kernel, check_cuda, cuda_api
from .protocol import (
    DeviceInfo,
    Done,
    Failure,
    Hello,
    HelloReply,
    Limits,
    Measure,
    Measured,
    Reference,
    Reply,
    Request,
    Setup,
    parse_request,
)


class WorkerDied(RuntimeError):
    """The worker crashed, hung past its timeout, or reported a fatal CUDA error."""


def worker_command() -> list[str]:
    return [sys.executable, "-m", "hatch_autotune.tuning.worker"]


class WorkerClient:
    """Parent side: one worker process, restarted on demand after it dies."""

    def __init__(self, command: list[str] | None = None, env: dict[str, str] | None = None):
        self.command = command or worker_command()
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: Any = None
        self.restarts = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.close()
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
            start_new_session=True,  # its own process group, so a kill takes its children too
            text=True,
            bufsize=1,
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)  # EOF: the worker is gone

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; WorkerDied when the worker does not answer."""
        if not self.alive:
            if self._proc is not None:
                self.restarts += 1
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._death_reason()) from None
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self._kill()
            raise WorkerDied(f"timed out after {timeout:g} s (hang?); the worker was killed") from None
        if line is None:
            raise WorkerDied(self._death_reason())
        try:
            reply = json.loads(line)
        except ValueError:
            self._kill()
            raise WorkerDied(f"sent an unreadable reply: {line[:200]!r}") from None
        if reply.get("fatal"):
            self._kill()
            raise WorkerDied(reply.get("error", "fatal CUDA error"))
        return reply

    def _death_reason(self) -> str:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self._proc.returncode
        if code is not None and code < 0:
            try:
                what = f"signal {signal.Signals(-code).name}"
            except ValueError:
                what = f"signal {-code}"
        else:
            what = f"exit code {code}"
        return f"crashed ({what}){self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f": {tail}" if tail else ""

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self._proc.stdin.close()  # type: ignore[union-attr]
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self._kill()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


# ---- the child process (GPU) ------------------------------------------------------------
# Every CUDA call here goes through the runtime's CudaApi (`cuda_api()`), so that a stand-in
# driver set with `runtime.use_gpu` reaches the worker too, and every result through check_cuda.


class _DeviceArray:
    """A device allocation that exposes __cuda_array_interface__, so the runtime can take it.

    Every variant starts from the bucket's inputs and poisoned outputs. An input keeps a pristine
    copy on the device, so that resetting it is a device-to-device copy instead of an upload from
    pageable host memory (GB/s, and per config: on an H200 it was most of a tuning run, 2026-11-26);
    where the device has no room for the copy, it is uploaded again."""

    def __init__(self, driver: Any, host: Any, keep_pristine: bool):
        from .verify import poison_byte

        self._driver, self._host = driver, host
        self.nbytes = max(int(host.nbytes), 1)
        self.ptr = check_cuda(driver.cuMemAlloc(self.nbytes), "cuMemAlloc")
        self._poison = poison_byte(host.dtype)
        self._pristine = None
        if keep_pristine and host.nbytes:
            try:
                self._pristine = check_cuda(driver.cuMemAlloc(self.nbytes), "cuMemAlloc (pristine copy)")
            except CudaCallError:  # out of memory: reset() uploads from the host instead
                self._pristine = None
            else:
                check_cuda(driver.cuMemcpyHtoD(self._pristine, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        self.shape, self.dtype = host.shape, host.dtype
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": host.dtype.str,
            "data": (int(self.ptr), False),
            "strides": None,
            "version": 3,
        }

    def reset(self, poisoned: bool, stream: Any) -> None:
        """Poison the buffer or restore the bucket's input, ordered on `stream`; the caller
        synchronises the context before the kernel runs (a host upload is not stream-ordered)."""
        if not self._host.nbytes:
            return
        if poisoned:
            check_cuda(self._driver.cuMemsetD8Async(self.ptr, self._poison, self._host.nbytes, stream), "cuMemsetD8Async (poison)")
        elif self._pristine is not None:
            check_cuda(
                self._driver.cuMemcpyDtoDAsync(self.ptr, self._pristine, self._host.nbytes, stream), "cuMemcpyDtoDAsync (restore input)"
            )
        else:
            check_cuda(self._driver.cuMemcpyHtoD(self.ptr, self._host.ctypes.data, self._host.nbytes), "cuMemcpyHtoD")

    def download(self) -> Any:
        import numpy as np

        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            check_cuda(self._driver.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def free(self) -> None:
        check_cuda(self._driver.cuMemFree(self.ptr), "cuMemFree")
        if self._pristine is not None:
            check_cuda(self._driver.cuMemFree(self._pristine), "cuMemFree (pristine copy)")


class _Fatal(RuntimeError):
    """A CUDA error after which this process's context cannot be trusted."""


class _Cubins(Binaries):
    """The worker's binaries: one cubin per variant (files the tuner wrote), for its device's arch."""

    def __init__(self, files: dict[str, str], arch: str):
        self.files, self.arch = files, arch
        self.cubin_archs = [arch]

    def binary_for(self, cc: tuple[int, int]) -> tuple[str, str]:
        return self.arch, self.arch

    def read(self, kernel: Kernel, variant: str, binary: str) -> bytes:
        with open(self.files[variant], "rb") as f:
            return f.read()


@dataclass
class _Bucket:
    """What the worker holds for the bucket it measures (set up by a Setup request)."""

    kernel: Kernel
    arrays: dict[str, _DeviceArray]  # every array argument, on the device
    scalars: dict[str, Any]
    outputs: list[str]  # the arrays a variant writes: downloaded and verified
    poisoned: set[str]  # the outputs poisoned before each run (intent out)
    reference: dict[str, Any] | None  # the outputs every variant must match (None until a Reference request)
    tolerances: Mapping[str, tuple[float, float]]
    cubins: _Cubins
    types: dict[str, str]
    key: dict[str, int]
    settings: Any  # TuningSpec: the timer's settings
    handles: dict[str, Any] = field(default_factory=dict)  # variant id -> its loaded kernel


class _WorkerState:
    def __init__(self) -> None:
        self.cuda: CudaApi | None = None  # set by hello
        self.arch = ""
        self.timer: Any = None
        self.bucket: _Bucket | None = None

    def hello(self, msg: Hello) -> HelloReply:
        from .bench import GpuTimer

        self.cuda = cuda = cuda_api()
        device = cuda.Device(msg.device)
        device.set_current()
        props = device.properties
        major, minor = tuple(device.compute_capability)
        self.arch = f"sm_{major}{minor}"
        self.timer = GpuTimer(device.device_id, msg.flush_l2)
        version = check_cuda(cuda.driver.cuDriverGetVersion(), "cuDriverGetVersion")
        limits = Limits(int(props.max_threads_per_block), int(props.max_registers_per_block), int(props.max_shared_memory_per_block))
        return HelloReply(DeviceInfo(device.name, (major, minor), f"{version // 1000}.{(version % 1000) // 10}", limits))

    def setup(self, msg: Setup) -> Done:
        import numpy as np

        cuda = self._started()
        self._free()
        spec = dict(msg.kernel, select={})
        cubins = _Cubins(dict(msg.binaries), self.arch)
        kernel = Kernel(msg.name, spec, cubins)
        with np.load(msg.inputs, allow_pickle=False) as data:
            host = {k: data[k] for k in data.files}
        outputs = [a["name"] for a in spec["args"] if a["kind"] == "array" and a["intent"] != "in"]
        poisoned = {a["name"] for a in spec["args"] if a["kind"] == "array" and a["intent"] == "out"}
        arrays = {name: _DeviceArray(cuda.driver, h, keep_pristine=name not in poisoned) for name, h in host.items()}
        check_cuda(cuda.driver.cuCtxSynchronize(), "cuCtxSynchronize after uploading inputs")
        reference = None
        if msg.reference:
            with np.load(msg.reference, allow_pickle=False) as data:
                reference = {k: data[k] for k in data.files}
        self.bucket = _Bucket(
            kernel,
            arrays,
            dict(msg.scalars),
            outputs,
            poisoned,
            reference,
            msg.tolerances,
            cubins,
            dict(msg.types),
            msg.key.as_dict(),
            msg.settings,
        )
        return Done()

    def _started(self) -> CudaApi:
        if self.cuda is None:
            raise RuntimeError("no device yet: the first request must be hello")
        return self.cuda

    def _free(self) -> None:
        if self.bucket is not None:
            for arr in self.bucket.arrays.values():
                arr.free()
            self.bucket = None

    def _launcher(self, vid: str) -> Any:
        """A function launching variant `vid` on a stream with the bucket's device arrays."""
        cuda = self._started()
        b = self.bucket
        assert b is not None
        kernel = b.kernel
        handle = b.handles.get(vid)
        if handle is None:
            cubin = b.cubins.read(kernel, vid, self.arch)
            handle = b.handles[vid] = cuda.ObjectCode.from_cubin(cubin).get_kernel(kernel.entry)
        config = kernel.variants[vid]["config"]
        grid, block, shared = kernel.geometry(config, b.types, b.key)
        constants = {c: b.types[c] for c in kernel.constants}  # the instance's, by keyword as a caller passes them
        call = kernel.prepare(**{**b.arrays, **b.scalars, **constants})
        launch_config = cuda.LaunchConfig(grid=grid, block=block, shmem_size=shared)
        launch = cuda.launch
        return lambda stream: launch(stream, launch_config, handle, *call.c_args)

    def _run_once(self, vid: str) -> dict[str, Any]:
        """Fresh inputs, poisoned outputs, one launch, outputs back on the host."""
        cuda = self._started()
        b = self.bucket
        assert b is not None
        for name, arr in b.arrays.items():
            arr.reset(name in b.poisoned, self.timer.stream.handle)
        # cuMemcpyHtoD from pageable memory (the fallback) may return before the copy lands, and it
        # is not ordered with the timer's non-blocking stream: wait before the kernel reads or writes.
        check_cuda(cuda.driver.cuCtxSynchronize(), "cuCtxSynchronize after resetting the buffers")
        fn = self._launcher(vid)
        try:
            fn(self.timer.stream)
            self.timer.stream.sync()
        except Exception as exc:  # illegal address, launch failure: the context is gone
            raise _Fatal(f"variant {vid} failed at run time: {exc}") from None
        return {name: b.arrays[name].download() for name in b.outputs}

    def _bind(self, variant: str, binary: str | None) -> str:
        """The request's variant, with its binary's file when the request names one."""
        assert self.bucket is not None
        if binary:
            self.bucket.cubins.files[variant] = binary
        return variant

    def reference(self, msg: Reference) -> Done:
        assert self.bucket is not None
        self._bind(msg.variant, msg.binary)
        self.bucket.reference = self._run_once(msg.variant)
        return Done()

    def measure(self, msg: Measure) -> Measured:
        """Verify the variant against the reference, then time it. The reply's phases say where
        the worker's wall time went (run: reset, launch and download; verify; time), so that a
        slow tuning run says what made it slow."""
        import time

        from .verify import compare

        b = self.bucket
        assert b is not None
        vid = self._bind(msg.variant, msg.binary)
        t0 = time.perf_counter()
        got = self._run_once(vid)
        t1 = time.perf_counter()
        phases = {"run": t1 - t0}
        if b.reference is not None:
            for name in b.outputs:
                rtol, atol = b.tolerances[name]
                reason = compare(name, got[name], b.reference[name], rtol, atol)
                if reason:
                    phases["verify"] = time.perf_counter() - t1
                    return Measured("rejected", reason=f"wrong result: {reason}", phases=phases)
        t2 = time.perf_counter()
        phases["verify"] = t2 - t1
        fn = self._launcher(vid)
        try:
            timing = self.timer.time(fn, b.settings, msg.leader_ms)
        except Exception as exc:
            raise _Fatal(f"variant {vid} failed while timed: {exc}") from None
        phases["time"] = time.perf_counter() - t2
        return Measured("eliminated" if timing.eliminated else "ok", tuple(timing.samples), phases=phases)

    def handle(self, msg: Request) -> Reply:
        if isinstance(msg, Hello):
            return self.hello(msg)
        if isinstance(msg, Setup):
            return self.setup(msg)
        if isinstance(msg, Reference):
            return self.reference(msg)
        return self.measure(msg)


def main() -> None:
    """Serve requests on stdin; replies go to the original stdout, everything else to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the protocol
    state = _WorkerState()
    for line in sys.stdin:
        raw: Any = None
        try:
            raw = json.loads(line)
            reply: Reply = state.handle(parse_request(raw))
        except (_Fatal, CudaCallError) as exc:
            if isinstance(exc, CudaCallError) and isinstance(raw, dict) and raw.get("op") == "hello":
                # the device was never used: the tuner reports it (it cannot open the device)
                reply = Failure(f"{type(exc).__name__}: {exc}")
            else:  # an error on the bucket's context: its memory and kernels cannot be trusted
                protocol.write(json.dumps(Failure(str(exc), fatal=True).to_json()) + "\n")
                protocol.flush()
                os._exit(3)
        except Exception as exc:
            reply = Failure(f"{type(exc).__name__}: {exc}")
        protocol.write(json.dumps(reply.to_json()) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
