"""Buffers the engines bind: numpy arrays on the host, cuda-python allocations on a GPU.

A DeviceArray is a plain cudaMalloc allocation with a shape and dtype; engines bind its pointer
by name (ONNX Runtime's IOBinding here, TensorRT's tensor addresses later), so KV caches and
stage hand-offs stay on the device and only what the host must see is copied back. Each buffer
knows its GPU and lane; each GPU has one stream a lane (``stream(device, lane)``): lane 0 is
shared by the engines and copies of the stages the loop runs, lane ``BESIDE`` by a stage that
runs its calls on a thread of its own (the vocoder beside the decoders), so that its kernels
can run beside theirs instead of queueing behind them. Stages reach these through an engine's
``buffers`` (runtime/buffers.py), never directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import threading
from typing import Any, TypeVar

import numpy as np


class DeviceError(RuntimeError):
    """No usable GPU, or a CUDA call failed."""


@functools.cache
def _cudart() -> Any:
    """cuda-python's runtime module, imported once (a code predictor frame makes ~100 calls)."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError:
            raise DeviceError(
                "device buffers need cuda-python (pip install 'edgeomni[cuda]')"
            ) from None
    return cudart


@functools.cache
def _kind(name: str) -> Any:
    """A cudaMemcpyKind member, looked up once (each lookup builds an enum object)."""
    return getattr(_cudart().cudaMemcpyKind, name)


BESIDE = 1  # the lane of a stage whose calls run on a thread of their own
_STREAMS: dict[tuple[int, int], int] = {}  # (device index, lane) -> its stream
_DEVICES: set[int] = set()  # the devices those streams are on

# ONNX Runtime captures a CUDA graph in global mode: while it does, a CUDA call that may
# synchronise (cudaMalloc, a copy from pageable memory), made by any thread, invalidates the
# capture. A capturing run holds this lock (OrtBinding.run), and so does each call of a stage
# that runs on a thread of its own, so the two never overlap (the decoders' own captures are
# thread-local and need not wait).
GRAPH_LOCK = threading.RLock()


def stream(device: int = 0, lane: int = 0) -> int:
    """A device's CUDA stream of a lane (created on first use): every engine of that lane runs
    on it and every copy into or out of its buffers is ordered on it, so a download after a
    run is the only synchronisation point."""
    s = _STREAMS.get((device, lane))
    if s is None:
        cudart = _cudart()
        _check(cudart.cudaSetDevice(device), f"cudaSetDevice({device})")
        flags = cudart.cudaStreamNonBlocking
        s = _STREAMS[(device, lane)] = int(
            _check(cudart.cudaStreamCreateWithFlags(flags), "cudaStreamCreate")
        )
        _DEVICES.add(device)
    return s


def use(device: int) -> None:
    """Make ``device`` the calling thread's current one where engines sit on several or on
    another than device 0 (a thread's current device is 0 until it sets one: on device 0
    alone every thread is on it already, and the calls stay as cheap as they were)."""
    if device or len(_DEVICES) > 1:
        _check(_cudart().cudaSetDevice(device), f"cudaSetDevice({device})")


def synchronize(device: int = 0, lane: int = 0) -> None:
    _check(_cudart().cudaStreamSynchronize(stream(device, lane)), "cudaStreamSynchronize")


def _order(first: tuple[int, int], then: tuple[int, int]) -> None:
    """Work queued on stream ``then`` (a device and lane) from now on waits for what stream
    ``first`` has queued so far (an event, made on ``first``'s device as its record needs; the
    host does not wait)."""
    cudart = _cudart()
    use(first[0])
    flags = cudart.cudaEventDisableTiming
    event = _check(cudart.cudaEventCreateWithFlags(flags), "cudaEventCreate")
    _check(cudart.cudaEventRecord(event, stream(*first)), "cudaEventRecord")
    _check(cudart.cudaStreamWaitEvent(stream(*then), event, 0), "cudaStreamWaitEvent")
    _check(cudart.cudaEventDestroy(event), "cudaEventDestroy")  # freed once it has fired


def _check(result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise DeviceError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


class DeviceArray:
    """A contiguous device allocation (or a leading-rows view of one) on one GPU: its copies
    are ordered on the stream of its device and lane."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        ptr: int,
        owner: bool,
        device: int = 0,
        base: DeviceArray | None = None,
        lane: int = 0,
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ptr = int(ptr)
        self.device = device
        self.lane = lane
        self._owner = owner
        # a view keeps its allocation alive, as a numpy view does: a view returned from a
        # function whose buffer went out of scope (a call's new state rows) stays valid
        self.base = base
        # plain ints: views and copies are made per engine call, and numpy's prod of a tuple
        # costs microseconds each time
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: Any, device: int = 0, lane: int = 0
              ) -> DeviceArray:  # fmt: skip
        cudart = _cudart()
        nbytes = max(1, math.prod(int(x) for x in shape) * np.dtype(dtype).itemsize)
        s = stream(device, lane)
        use(device)
        ptr = _check(cudart.cudaMalloc(nbytes), "cudaMalloc")
        # on the device's stream: a memset on the legacy default stream is not ordered with the
        # (non-blocking) stream, so it could land after the first upload or engine run
        _check(cudart.cudaMemsetAsync(ptr, 0, nbytes, s), "cudaMemsetAsync")
        return cls(shape, dtype, int(ptr), owner=True, device=device, lane=lane)

    def rows(self, n: int, start: int = 0) -> DeviceArray:
        """Entries start..start+n of the leading axis: contiguous, a view, not owned."""
        if start + n > self.shape[0]:
            raise ValueError(f"rows {start}..{start + n} of a buffer with {self.shape[0]}")
        row = self.nbytes // self.shape[0]
        return DeviceArray((n, *self.shape[1:]), self.dtype, self.ptr + start * row,
                           owner=False, device=self.device, base=self.base or self,
                           lane=self.lane)  # fmt: skip

    def view(self, shape: tuple[int, ...]) -> DeviceArray:
        """The same memory under another shape of as many entries: a view, not owned."""
        view = DeviceArray(
            shape, self.dtype, self.ptr, owner=False, device=self.device, base=self.base or self,
            lane=self.lane,
        )
        if view.nbytes != self.nbytes:
            raise ValueError(f"a {self.shape} buffer cannot be viewed as {tuple(shape)}")
        return view

    def fill_zero(self) -> None:
        """Every byte zeroed, ordered on this buffer's stream."""
        use(self.device)
        _check(_cudart().cudaMemsetAsync(self.ptr, 0, self.nbytes, stream(self.device, self.lane)),
               "cudaMemsetAsync")  # fmt: skip

    def copy_from(self, src: DeviceArray) -> None:
        """Copy another device buffer of as many bytes and this dtype in, on this buffer's
        stream (a stage's output handed to the next stage's input without leaving the GPU;
        from another GPU or lane, ordered after its stream's work and before its next)."""
        if src.dtype != self.dtype or src.nbytes != self.nbytes:
            raise ValueError(f"copying {src.shape} {src.dtype} into {self.shape} {self.dtype}")
        cudart = _cudart()
        here, there = (self.device, self.lane), (src.device, src.lane)
        s = stream(*here)
        if here == there:
            kind = _kind("cudaMemcpyDeviceToDevice")
            _check(cudart.cudaMemcpyAsync(self.ptr, src.ptr, self.nbytes, kind, s),
                   "cudaMemcpyAsync (device to device)")  # fmt: skip
            return
        _order(there, here)  # after what writes the source
        use(self.device)
        _check(cudart.cudaMemcpyPeerAsync(self.ptr, self.device, src.ptr, src.device,
                                          self.nbytes, s), "cudaMemcpyPeerAsync")  # fmt: skip
        _order(here, there)  # and before what writes it next

    def copy_positions(
        self, src: DeviceArray, axis: int, length: int, *, dst_start: int = 0, src_start: int = 0
    ) -> None:
        """``length`` entries of ``src``'s axis ``axis`` from ``src_start`` over this buffer's
        from ``dst_start`` (the other axes equal, both on this device and lane): one
        cudaMemcpy2DAsync, a row per entry of the axes before ``axis``, on this buffer's
        stream."""
        if src.dtype != self.dtype or (src.device, src.lane) != (self.device, self.lane) or (
            src.shape[:axis] != self.shape[:axis] or src.shape[axis + 1 :] != self.shape[axis + 1 :]
        ):
            raise ValueError(f"copying positions of {src.shape} {src.dtype} into {self.shape} "
                             f"{self.dtype}")  # fmt: skip
        if src_start + length > src.shape[axis] or dst_start + length > self.shape[axis]:
            raise ValueError(f"positions {src_start}+{length} -> {dst_start}+{length} exceed "
                             f"{src.shape[axis]} / {self.shape[axis]}")  # fmt: skip
        inner = math.prod(self.shape[axis + 1 :]) * self.dtype.itemsize
        height = math.prod(self.shape[:axis])
        use(self.device)
        _check(_cudart().cudaMemcpy2DAsync(
            self.ptr + dst_start * inner, self.shape[axis] * inner,
            src.ptr + src_start * inner, src.shape[axis] * inner,
            length * inner, height, _kind("cudaMemcpyDeviceToDevice"),
            stream(self.device, self.lane),
        ), "cudaMemcpy2DAsync")  # fmt: skip

    def upload(self, array: np.ndarray) -> None:
        """Copy a host array of this shape and dtype in, ordered on this buffer's stream."""
        src = np.ascontiguousarray(array, self.dtype)
        if src.shape != self.shape:
            raise ValueError(f"uploading {src.shape} into a device buffer of {self.shape}")
        # from pageable memory the call returns once src is staged, so src may be freed after
        self._host_copy(self.ptr, src.ctypes.data, "cudaMemcpyHostToDevice",
                        "cudaMemcpyAsync (host to device)")  # fmt: skip

    def download(self, out: np.ndarray | None = None, *, sync: bool = True) -> np.ndarray:
        """Copy to the host after everything queued on this buffer's stream (a sync point;
        with ``sync=False`` the copy is only queued: synchronise the stream before reading)."""
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"downloading {self.shape} {self.dtype} into {out.shape} {out.dtype}")
        self._host_copy(out.ctypes.data, self.ptr, "cudaMemcpyDeviceToHost",
                        "cudaMemcpyAsync (device to host)")  # fmt: skip
        if sync:
            synchronize(self.device, self.lane)
        return out

    def _host_copy(self, dst: int, src: int, kind: str, what: str) -> None:
        """This buffer's bytes copied between it and host memory (``kind``, a cudaMemcpyKind's
        name), queued on its stream."""
        use(self.device)
        _check(_cudart().cudaMemcpyAsync(dst, src, self.nbytes, _kind(kind),
                                         stream(self.device, self.lane)), what)  # fmt: skip

    def __del__(self) -> None:
        if getattr(self, "_owner", False):
            if _capturing:  # cudaFree would end a stream capture: freed once it is over
                _deferred.append(self.ptr)
                return
            with contextlib.suppress(Exception):  # at interpreter shutdown there is no runtime
                _cudart().cudaFree(self.ptr)


class HostRead:
    """A device array's bytes for the host to read a little later: ``queue`` copies them into
    pinned host memory and records an event behind the copy; ``wait`` waits for that event
    alone. Work queued on the stream after ``queue`` runs on while the host waits (a download
    into pageable memory would wait for all of it: the speech loop queues the next frame
    behind a step's draw, then reads the draw)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, device: int = 0, lane: int = 0
                 ) -> None:  # fmt: skip
        cudart = _cudart()
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.device, self.lane = device, lane
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        use(device)
        self._ptr = int(_check(cudart.cudaMallocHost(max(1, self.nbytes)), "cudaMallocHost"))
        flags = cudart.cudaEventDisableTiming
        self._event = _check(cudart.cudaEventCreateWithFlags(flags), "cudaEventCreate")
        raw = (ctypes.c_char * max(1, self.nbytes)).from_address(self._ptr)
        self._host = np.frombuffer(raw, self.dtype, math.prod(self.shape)).reshape(self.shape)

    def queue(self, src: Any) -> None:
        """Copy ``src`` (a DeviceArray of this shape and dtype) out behind everything queued on
        its stream."""
        if not isinstance(src, DeviceArray):
            raise TypeError(f"a device read takes a device buffer, not {type(src).__name__}")
        if src.shape != self.shape or src.dtype != self.dtype:
            raise ValueError(f"reading {src.dtype} {src.shape} into {self.dtype} {self.shape}")
        cudart = _cudart()
        s = stream(src.device, src.lane)
        use(src.device)
        _check(cudart.cudaMemcpyAsync(self._ptr, src.ptr, self.nbytes,
                                      _kind("cudaMemcpyDeviceToHost"), s),
               "cudaMemcpyAsync (device to pinned host)")  # fmt: skip
        _check(cudart.cudaEventRecord(self._event, s), "cudaEventRecord")

    def wait(self) -> np.ndarray:
        """The bytes last queued, once their copy is done (a host array of its own)."""
        _check(_cudart().cudaEventSynchronize(self._event), "cudaEventSynchronize")
        return self._host.copy()

    def __del__(self) -> None:
        if getattr(self, "_ptr", None):
            with contextlib.suppress(Exception):  # at interpreter shutdown there is no runtime
                cudart = _cudart()
                cudart.cudaEventDestroy(self._event)
                cudart.cudaFreeHost(self._ptr)


T = TypeVar("T")


def to_host(value: T) -> T | np.ndarray:
    """``value`` as the host reads it (and can send it to another process): a DeviceArray
    downloaded; a host array, or any other value, as it is."""
    return value.download() if isinstance(value, DeviceArray) else value


# buffers dropped while a CUDA graph is being captured (Python frees them whenever their last
# reference goes, or the cyclic collector runs): cudaFree synchronises the device, which
# invalidates the capture, so they are freed after it
_capturing = 0
_deferred: list[int] = []


@contextlib.contextmanager
def capturing() -> Any:
    """Hold buffer frees back while the body captures a CUDA graph, and Python's cycle collector
    too: a collection inside the capture may finalise another library's GPU objects (an ONNX
    Runtime session left in a cycle frees its pinned memory, cudaFreeHost, which a capture
    forbids: CUDA error 900 and an abort)."""
    global _capturing
    _capturing += 1
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        _capturing -= 1
        if not _capturing and _deferred:
            cudart = _cudart()
            while _deferred:
                cudart.cudaFree(_deferred.pop())
