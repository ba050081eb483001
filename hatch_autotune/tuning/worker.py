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
import re
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..runtime import Binaries, CudaApi, CudaCallError, Kernel, check_cuda, cuda_api
from .inputs import InputError, InputRecipe
from .protocol import (
    DeviceInfo,
    Done,
    Failure,
    Hello,
    HelloReply,
    Limits,
    Measure,
    Measured,
    Prepare,
    Ready,
    Reference,
    Reply,
    Request,
    Setup,
    parse_request,
)

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"  # Linux: 'NVRM version: NVIDIA UNIX ... Kernel Module  580.159.04  ...'


def driver_release(path: str = DRIVER_VERSION_FILE) -> str:
    """The NVIDIA driver's release ('580.159.04') for the provenance: the CUDA driver API says only
    which CUDA version it supports. 'unknown' where the kernel module does not say (not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return "unknown"
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9]+(?:\.[0-9]+)+)", text)
    return found.group(1) if found else "unknown"


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


class _Expected:
    """The outputs every variant must match, kept on the device where there is room (a variant's
    outputs are then compared there, and only a verdict comes back: DeviceComparer), else on the
    host (the variant's outputs are downloaded and compared there: verify.compare_host)."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.device: dict[str, tuple[int, Any]] = {}  # output -> (device pointer, dtype)
        self.host: dict[str, Any] = {}  # output -> array

    def _room(self, nbytes: int) -> int | None:
        """Device memory for one reference output; None when there is no room."""
        try:
            return int(check_cuda(self._driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc (reference)"))
        except CudaCallError:
            return None

    def keep_device(self, name: str, source: _DeviceArray, stream: Any) -> bool:
        """Copy an output on the device (a variant's run); False when there is no room."""
        ptr = self._room(source.nbytes)
        if ptr is None:
            return False
        check_cuda(self._driver.cuMemcpyDtoDAsync(ptr, source.ptr, source.nbytes, stream), "cuMemcpyDtoDAsync (reference)")
        self.device[name] = (ptr, source.dtype)
        return True

    def upload(self, name: str, host: Any) -> bool:
        """The user's reference output on the device; False when there is no room."""
        ptr = self._room(int(host.nbytes))
        if ptr is None:
            return False
        if host.nbytes:
            check_cuda(self._driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD (reference)")
        self.device[name] = (ptr, host.dtype)
        return True

    def free(self) -> None:
        for ptr, _ in self.device.values():
            check_cuda(self._driver.cuMemFree(ptr), "cuMemFree (reference)")
        self.device, self.host = {}, {}


@dataclass
class _Bucket:
    """What the worker holds for the bucket it measures (set up by a Setup request)."""

    kernel: Kernel
    arrays: dict[str, _DeviceArray]  # every array argument, on the device
    scalars: dict[str, Any]
    outputs: list[str]  # the arrays a variant writes: verified
    poisoned: set[str]  # the outputs poisoned before each run (intent out)
    expected: _Expected | None  # what every variant must match (None until a Reference request, without a user reference)
    tolerances: Mapping[str, tuple[float, float]]
    cubins: _Cubins
    types: dict[str, str]
    key: dict[str, int]
    settings: Any  # TuningSpec: the timer's settings
    comparer: Any  # device_verify.DeviceComparer, or None (verification on the host)
    pairs: frozenset[tuple[str, str]]  # the (got, expected) dtypes it compares
    handles: dict[str, Any] = field(default_factory=dict)  # variant id -> its loaded kernel


def _made_inputs(recipe: InputRecipe) -> tuple[dict[str, Any], dict[str, Any] | None, float]:
    """A bucket's inputs and the user's reference outputs (None without a reference function),
    made on the host from the recipe, and the seconds it took."""
    import time

    t0 = time.perf_counter()
    inputs = recipe.make()
    return inputs, recipe.reference_outputs(inputs), time.perf_counter() - t0


class _WorkerState:
    def __init__(self) -> None:
        self.cuda: CudaApi | None = None  # set by hello
        self.arch = ""
        self.timer: Any = None
        self.bucket: _Bucket | None = None
        self._ahead: dict[str, Future] = {}  # recipe identity -> its inputs, being made in the background
        self._pool: ThreadPoolExecutor | None = None

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
        cuda_version = f"{version // 1000}.{(version % 1000) // 10}"
        return HelloReply(DeviceInfo(device.name, (major, minor), cuda_version, limits, driver_release()))

    def prepare(self, msg: Prepare) -> Done:
        """Start making a later bucket's inputs on a background thread (host work only)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="hatch-autotune-inputs")
        identity = msg.inputs.identity()
        if identity not in self._ahead:
            self._ahead = {identity: self._pool.submit(_made_inputs, msg.inputs)}  # one bucket ahead: memory stays bounded
        return Done()

    def setup(self, msg: Setup) -> Ready:
        """The bucket's inputs (made ahead by a Prepare, else now) on the device, its outputs
        allocated (never uploaded), and the user's reference outputs on the device too."""
        import time

        import numpy as np

        cuda = self._started()
        self._free()
        t0 = time.perf_counter()
        ahead = self._ahead.pop(msg.inputs.identity(), None)
        self._ahead.clear()
        host, user_reference, made_s = ahead.result() if ahead is not None else _made_inputs(msg.inputs)
        t1 = time.perf_counter()
        spec = dict(msg.kernel, select={})
        cubins = _Cubins(dict(msg.binaries), self.arch)
        kernel = Kernel(msg.name, spec, cubins)
        outputs = [a["name"] for a in spec["args"] if a["kind"] == "array" and a["intent"] != "in"]
        poisoned = {a["name"] for a in spec["args"] if a["kind"] == "array" and a["intent"] == "out"}
        arrays = {
            name: _DeviceArray(cuda.driver, h, keep_pristine=name not in poisoned) for name, h in host.items() if isinstance(h, np.ndarray)
        }
        scalars = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in host.items() if not isinstance(v, np.ndarray)}
        comparer, pairs = self._comparer(msg.comparers)
        expected = None
        if user_reference is not None:
            expected = _Expected(cuda.driver)
            for name, ref in user_reference.items():
                if (str(arrays[name].dtype), str(ref.dtype)) not in pairs or not expected.upload(name, ref):
                    expected.host[name] = ref
        check_cuda(cuda.driver.cuCtxSynchronize(), "cuCtxSynchronize after uploading inputs")
        t2 = time.perf_counter()
        self.bucket = _Bucket(
            kernel, arrays, scalars, outputs, poisoned, expected, msg.tolerances, cubins, dict(msg.types), msg.key.as_dict(),
            msg.settings, comparer, pairs,
        )  # fmt: skip
        phases = {"inputs": t1 - t0, "upload": t2 - t1}
        return Ready(phases if ahead is not None else {**phases, "made": made_s}, prefetched=ahead is not None)

    def _comparer(self, files: Mapping[str, str]) -> tuple[Any, frozenset[tuple[str, str]]]:
        """The compare kernels of this bucket's dtypes and the (got, expected) dtype pairs they
        compare (none given, or they do not load: verification on the host)."""
        if not files:
            return None, frozenset()
        from .device_verify import DeviceComparer

        cubins = {}
        for pair, path in files.items():
            got, _, expected = pair.partition("/")
            with open(path, "rb") as f:
                cubins[(got, expected)] = f.read()
        try:
            return DeviceComparer(self._started(), cubins), frozenset(cubins)
        except CudaCallError as exc:
            print(f"hatch-autotune worker: the compare kernels do not load ({exc}); verifying on the host", file=sys.stderr)
            return None, frozenset()

    def _started(self) -> CudaApi:
        if self.cuda is None:
            raise RuntimeError("no device yet: the first request must be hello")
        return self.cuda

    def _free(self) -> None:
        if self.bucket is not None:
            for arr in self.bucket.arrays.values():
                arr.free()
            if self.bucket.expected is not None:
                self.bucket.expected.free()
            if self.bucket.comparer is not None:
                self.bucket.comparer.free()
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

    def _run_once(self, vid: str) -> None:
        """Fresh inputs, poisoned outputs, one launch; the outputs stay on the device."""
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

    def _bind(self, variant: str, binary: str | None) -> str:
        """The request's variant, with its binary's file when the request names one."""
        assert self.bucket is not None
        if binary:
            self.bucket.cubins.files[variant] = binary
        return variant

    def reference(self, msg: Reference) -> Done:
        """Run a variant once: its outputs become what every variant must match (on the device
        where there is room)."""
        b = self.bucket
        assert b is not None
        self._run_once(self._bind(msg.variant, msg.binary))
        if b.expected is not None:
            b.expected.free()
        b.expected = expected = _Expected(self._started().driver)
        for name in b.outputs:
            same = (str(b.arrays[name].dtype),) * 2
            if same not in b.pairs or not expected.keep_device(name, b.arrays[name], self.timer.stream.handle):
                expected.host[name] = b.arrays[name].download()
        self.timer.stream.sync()
        return Done()

    def _mismatch(self, name: str) -> str | None:
        """Why output `name` of the variant just run is wrong (None: it matches), compared on
        the device when the reference is there, else on the host."""
        from .verify import compare

        b = self.bucket
        assert b is not None and b.expected is not None
        rtol, atol = b.tolerances[name]
        got = b.arrays[name]
        if name in b.expected.device:
            ptr, dtype = b.expected.device[name]
            found = b.comparer.compare(name, got.ptr, ptr, tuple(got.shape), str(got.dtype), str(dtype), rtol, atol, self.timer.stream)
            return found.message()
        return compare(name, got.download(), b.expected.host[name], rtol, atol)

    def measure(self, msg: Measure) -> Measured:
        """Verify the variant against the reference, then time it (unless the request only
        verifies). The reply's phases say where the worker's wall time went (run: reset and
        launch; verify; time), so that a slow tuning run says what made it slow."""
        import time

        b = self.bucket
        assert b is not None
        vid = self._bind(msg.variant, msg.binary)
        t0 = time.perf_counter()
        self._run_once(vid)
        t1 = time.perf_counter()
        phases = {"run": t1 - t0}
        if b.expected is not None:
            for name in b.outputs:
                reason = self._mismatch(name)
                if reason:
                    phases["verify"] = time.perf_counter() - t1
                    return Measured("rejected", reason=f"wrong result: {reason}", phases=phases)
        t2 = time.perf_counter()
        phases["verify"] = t2 - t1
        if not msg.timed:
            return Measured("ok", phases=phases)
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
        if isinstance(msg, Prepare):
            return self.prepare(msg)
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
        except InputError as exc:  # the user's generator or reference: the build's error, with their message
            reply = Failure(str(exc), kind="input")
        except Exception as exc:
            reply = Failure(f"{type(exc).__name__}: {exc}")
        protocol.write(json.dumps(reply.to_json()) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
