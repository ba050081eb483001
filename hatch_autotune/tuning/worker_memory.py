"""The tuning worker's device memory: a bucket's arrays and the outputs every variant must match.

Every CUDA call here goes through the runtime's CudaApi driver (the worker's `cuda_api()`), so
that a stand-in driver set with `runtime.use_gpu` reaches the worker too, and every result
through check_cuda.
"""

from __future__ import annotations

from typing import Any

from ..runtime import CudaCallError, check_cuda
from .input_layout import buffer_bytes, element_strides


class DeviceArray:
    """A device allocation that exposes __cuda_array_interface__, so the runtime can take it.

    Every variant starts from the bucket's inputs and poisoned outputs. An input keeps a pristine
    copy on the device, so that resetting it is a device-to-device copy instead of an upload from
    pageable host memory (GB/s, and per config: on an H200 it was most of a tuning run, 2026-11-26);
    where the device has no room for the copy, it is uploaded again.

    A strided view (the array of an argument declared with strides, input_layout.py) is uploaded
    with its whole buffer, padding included, and exposes the view's strides: `contiguous` is
    False, and `download()` gives its elements as a C-contiguous array. Such an output is
    compared on the host: a device comparison reads a dense array."""

    def __init__(self, driver: Any, host: Any, keep_pristine: bool) -> None:
        from .verify import poison_byte

        self._driver, self._host = driver, host
        self._bytes = buffer_bytes(host)  # what is uploaded, reset and poisoned: the view's buffer
        self.nbytes = max(self._bytes, 1)
        self.ptr = check_cuda(driver.cuMemAlloc(self.nbytes), "cuMemAlloc")
        self._poison = poison_byte(host.dtype)
        self._pristine = None
        if keep_pristine and self._bytes:
            try:
                self._pristine = check_cuda(driver.cuMemAlloc(self.nbytes), "cuMemAlloc (pristine copy)")
            except CudaCallError:  # out of memory: reset() uploads from the host instead
                self._pristine = None
            else:
                check_cuda(driver.cuMemcpyHtoD(self._pristine, host.ctypes.data, self._bytes), "cuMemcpyHtoD")
        self.shape, self.dtype = host.shape, host.dtype
        self.strides = element_strides(host)  # None: C-contiguous
        self.contiguous = self.strides is None
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": host.dtype.str,
            "data": (int(self.ptr), False),
            "strides": None if self.strides is None else tuple(host.strides),
            "version": 3,
        }

    def reset(self, poisoned: bool, stream: Any) -> None:
        """Poison the buffer or restore the bucket's input, ordered on `stream`; the caller
        synchronises the context before the kernel runs (a host upload is not stream-ordered)."""
        size = self._bytes
        if not size:
            return
        if poisoned:
            check_cuda(self._driver.cuMemsetD8Async(self.ptr, self._poison, size, stream), "cuMemsetD8Async (poison)")
        elif self._pristine is not None:
            check_cuda(self._driver.cuMemcpyDtoDAsync(self.ptr, self._pristine, size, stream), "cuMemcpyDtoDAsync (restore input)")
        else:
            check_cuda(self._driver.cuMemcpyHtoD(self.ptr, self._host.ctypes.data, size), "cuMemcpyHtoD")

    def download(self) -> Any:
        """The array's elements, C-contiguous (a strided view's read out of its buffer)."""
        import numpy as np

        if self.strides is None:
            out = np.empty(self.shape, self.dtype)
            if out.nbytes:
                check_cuda(self._driver.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
            return out
        buffer = np.empty(self._bytes, np.uint8)
        check_cuda(self._driver.cuMemcpyDtoH(buffer.ctypes.data, self.ptr, self._bytes), "cuMemcpyDtoH")
        view = np.lib.stride_tricks.as_strided(buffer.view(self.dtype), self.shape, tuple(self._host.strides))
        return np.ascontiguousarray(view)

    def free(self) -> None:
        check_cuda(self._driver.cuMemFree(self.ptr), "cuMemFree")
        if self._pristine is not None:
            check_cuda(self._driver.cuMemFree(self._pristine), "cuMemFree (pristine copy)")


class Expected:
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

    def keep_device(self, name: str, source: DeviceArray, stream: Any) -> bool:
        """Copy an output on the device (a variant's run); False when there is no room, or
        when the output is a strided view (compared on the host, see DeviceArray)."""
        if not source.contiguous:
            return False
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
