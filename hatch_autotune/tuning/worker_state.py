"""The tuning worker's state and its answer to each request: the device, a bucket, its reference, variants verified and timed.

Every CUDA call here goes through the runtime's CudaApi (`cuda_api()`), so that a stand-in
driver set with `runtime.use_gpu` reaches the worker too, and every result through check_cuda.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..lock import Status
from ..runtime import Binaries, CudaApi, CudaCallError, Kernel, KernelTable, Variant, check_cuda, cuda_api, cuda_seam
from ..runtime.launching import variant_launch
from .inputs import InputRecipe
from .protocol import (
    DeviceInfo,
    Done,
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
)
from .worker_memory import DeviceArray, Expected

if TYPE_CHECKING:
    from .device_verify import DeviceComparer

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


class Fatal(RuntimeError):
    """A CUDA error after which this process's context cannot be trusted."""


class _Cubins(Binaries):
    """The worker's binaries: one cubin per variant (files the tuner wrote), for its device's arch."""

    def __init__(self, files: dict[str, str], arch: str) -> None:
        self.files, self.arch = files, arch
        self.cubin_archs = [arch]

    def binary_for(self, cc: tuple[int, int], driver: tuple[int, int] | None = None) -> tuple[str, str]:
        return self.arch, self.arch  # the worker's own compile for its device: its driver loads it

    def read(self, table: KernelTable, variant: str, binary: str) -> bytes:
        return self.cubin(variant)

    def cubin(self, variant: str) -> bytes:
        with open(self.files[variant], "rb") as f:
            return f.read()


@dataclass
class _Bucket:
    """What the worker holds for the bucket it measures (set up by a Setup request)."""

    kernel: Kernel
    arrays: dict[str, DeviceArray]  # every array argument, on the device
    scalars: dict[str, Any]
    outputs: list[str]  # the arrays a variant writes: verified
    poisoned: set[str]  # the outputs poisoned before each run (intent out)
    expected: Expected | None  # what every variant must match (None until a Reference request, without a user reference)
    tolerances: Mapping[str, tuple[float, float]]
    cubins: _Cubins
    types: dict[str, str]
    key: dict[str, int]
    settings: Any  # TuningSpec: the timer's settings
    comparer: DeviceComparer | None  # None: verification on the host
    pairs: frozenset[tuple[str, str]]  # the (got, expected) dtypes it compares
    launches: dict[str, Any] = field(default_factory=dict)  # variant id -> its launch (runtime.launching.variant_launch)


_Inputs = tuple[dict[str, Any], dict[str, Any] | None, float]  # the inputs, the user's reference outputs, seconds


def _made_inputs(recipe: InputRecipe) -> _Inputs:
    """A bucket's inputs and the user's reference outputs (None without a reference function),
    made on the host from the recipe, and the seconds it took."""
    import time

    t0 = time.perf_counter()
    inputs = recipe.make()
    return inputs, recipe.reference_outputs(inputs), time.perf_counter() - t0


class WorkerState:
    """The child's one device and the bucket it measures; `handle` answers one request."""

    def __init__(self) -> None:
        self.cuda: CudaApi | None = None  # set by hello
        self.device = 0  # the device's ordinal, set by hello
        self.arch = ""
        self.timer: Any = None
        self.bucket: _Bucket | None = None
        self._ahead: dict[str, Future[_Inputs]] = {}  # recipe identity -> its inputs, being made in the background
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
        self.device = int(device.device_id)
        optin = cuda_seam.current.shared_limit(self.device)  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        shared = int(props.max_shared_memory_per_block)
        limits = Limits(int(props.max_threads_per_block), int(props.max_registers_per_block), shared, max(optin, shared))
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
        cubins = _Cubins(dict(msg.binaries), self.arch)
        variants = {vid: Variant(config, {}, 0, {}, {}) for vid, config in msg.configs.items()}
        kernel = Kernel(KernelTable(msg.kernel, variants, {}), cubins)  # selects nothing: the tuner names each variant
        outputs = [a.name for a in msg.kernel.args if a.writes]
        poisoned = {a.name for a in msg.kernel.args if a.is_array and a.intent == "out"}
        arrays = {
            name: DeviceArray(cuda.driver, h, keep_pristine=name not in poisoned) for name, h in host.items() if isinstance(h, np.ndarray)
        }
        scalars = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in host.items() if not isinstance(v, np.ndarray)}
        comparer, pairs = self._comparer(msg.comparers)
        expected = None
        if user_reference is not None:
            expected = Expected(cuda.driver)
            for name, ref in user_reference.items():
                if (str(arrays[name].dtype), str(ref.dtype)) not in pairs or not arrays[name].contiguous or not expected.upload(name, ref):
                    expected.host[name] = ref
        check_cuda(cuda.driver.cuCtxSynchronize(), "cuCtxSynchronize after uploading inputs")
        t2 = time.perf_counter()
        self.bucket = _Bucket(
            kernel, arrays, scalars, outputs, poisoned, expected, msg.tolerances, cubins, dict(msg.types), msg.key.as_dict(),
            msg.settings, comparer, pairs,
        )  # fmt: skip
        phases = {"inputs": t1 - t0, "upload": t2 - t1}
        return Ready(phases if ahead is not None else {**phases, "made": made_s}, prefetched=ahead is not None)

    def _comparer(self, files: Mapping[str, str]) -> tuple[DeviceComparer | None, frozenset[tuple[str, str]]]:
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

    def close(self) -> None:
        """The tuner is done (stdin closed): the last bucket's buffers and graphs go."""
        if self.cuda is not None:
            self._free()

    def _free(self) -> None:
        if self.bucket is not None:
            self.timer.release_graphs()  # captured with the bucket's arrays
            for arr in self.bucket.arrays.values():
                arr.free()
            if self.bucket.expected is not None:
                self.bucket.expected.free()
            if self.bucket.comparer is not None:
                self.bucket.comparer.free()
            self.bucket = None

    def _launcher(self, vid: str) -> Any:
        """A function launching variant `vid` on a stream (the timer's cuda.core Stream) with the
        bucket's device arrays, made by the runtime's own code (runtime.launching.variant_launch:
        the function loaded as the wheel loads it, its shared memory opt-in, a cluster launch,
        tensor maps, a parameter buffer), so that a variant is tuned as the wheel launches it.
        Made once per variant and bucket: the arrays stay, only the stream is given per launch."""
        self._started()
        b = self.bucket
        assert b is not None
        launch = b.launches.get(vid)
        if launch is None:
            kernel = b.kernel
            # the instance's, by keyword as a caller passes them (the layout's own are set from the arrays)
            constants = {c: b.types[c] for c in kernel.declaration.call_constants}
            call = kernel.prepare(**{**b.arrays, **b.scalars, **constants})
            launch = b.launches[vid] = variant_launch(kernel, vid, call, self.device)
        return launch

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
            raise Fatal(f"variant {vid} failed at run time: {exc}") from None

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
        b.expected = expected = Expected(self._started().driver)
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
        if name in b.expected.device:  # only where a compare kernel loaded
            assert b.comparer is not None
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
                    return Measured(Status.REJECTED, reason=f"wrong result: {reason}", phases=phases)
        t2 = time.perf_counter()
        phases["verify"] = t2 - t1
        if not msg.timed:
            return Measured(Status.OK, phases=phases)
        fn = self._launcher(vid)
        try:
            timing = self.timer.time(fn, b.settings, msg.leader_ms)
        except Exception as exc:
            raise Fatal(f"variant {vid} failed while timed: {exc}") from None
        phases["time"] = time.perf_counter() - t2
        return Measured(Status.ELIMINATED if timing.eliminated else Status.OK, tuple(timing.samples), phases=phases)

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
