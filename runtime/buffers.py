"""Where an engine's buffers live, and the operations the runtime moves them with.

Every engine has ``buffers``: a ``HostBuffers`` (a CPU engine: buffers are numpy arrays, every
operation is numpy's, nothing is copied that numpy would not copy) or a ``DeviceBuffers`` (a GPU:
buffers are memory.DeviceArrays on one device, copies ordered on its stream). Stages allocate,
slice, copy in and out through them and never ask what kind an array is. Every operation also
takes a stage's own host arrays where a buffer may be given (a feed, an input the stage made);
``resident`` tells the two apart where it matters (a buffer is read where it is, a host array is
sent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from edgeomni.runtime import memory
from edgeomni.runtime.memory import DeviceArray

Array: TypeAlias = DeviceArray | np.ndarray  # a buffer, or a stage's own host array


class Buffers(Protocol):
    on_host: bool  # buffers are host arrays: staging host inputs in buffers saves nothing

    def zeros(self, shape: tuple[int, ...], dtype: DTypeLike) -> Array: ...
    def resident(self, x: Array) -> bool: ...
    def rows(self, x: Array, n: int, start: int = 0) -> Array: ...
    def view(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def upload(self, dst: Array, host: np.ndarray) -> None: ...
    def copy_into(self, dst: Array, src: Array) -> None: ...
    def copy(self, x: Array) -> Array: ...
    def copy_row(
        self, x: Array, src: int, dst: int, length: int | None = None, axis: int | None = None
    ) -> None: ...
    def copy_positions(
        self, dst: Array, src: Array, axis: int, length: int, *, dst_start: int = 0,
        src_start: int = 0,
    ) -> None: ...
    def fill_zero(self, x: Array) -> None: ...
    def to_host(self, x: Array, *, wait: bool = True) -> np.ndarray: ...
    def download(self, x: Array) -> np.ndarray: ...
    def synchronize(self) -> None: ...
    def overlaps(self, x: Array, buffers: Iterable[Array]) -> bool: ...
    def reader(self, shape: tuple[int, ...], dtype: DTypeLike) -> Reader: ...


class Reader(Protocol):
    """A buffer's bytes read by the host later (Buffers.reader): ``queue`` them now, behind
    what is queued so far; ``wait`` for them, while what was queued after runs on."""

    def queue(self, x: Array) -> None: ...
    def wait(self) -> np.ndarray: ...


class _HostReader:
    """A CPU engine's Reader: the array copied when queued (nothing runs behind it)."""

    def __init__(self) -> None:
        self._got: np.ndarray | None = None

    def queue(self, x: Array) -> None:
        self._got = _host(x).copy()

    def wait(self) -> np.ndarray:
        if self._got is None:
            raise RuntimeError("a read waited for before anything was queued")
        return self._got


def _host(x: Array) -> np.ndarray:
    """A CPU engine's buffer: every one is a host array (a device buffer is a caller's bug)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"a CPU engine's buffers are host arrays, not {type(x).__name__}")
    return x


def _device(x: Array) -> DeviceArray:
    """A GPU engine's own buffer, where a host array cannot stand (written on the device)."""
    if isinstance(x, np.ndarray):
        raise TypeError("a GPU engine's buffer is a device array, not a host array")
    return x


class HostBuffers:
    """A CPU engine's buffers: numpy arrays, read and written in place."""

    on_host = True

    def zeros(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        return np.zeros(shape, dtype)  # pages are mapped lazily: untouched capacity is free

    def resident(self, x: Array) -> bool:
        """Whether ``x`` is a buffer to read where it is rather than a host array to send: a
        CPU engine reads host arrays where they are, so none needs telling apart."""
        return False

    def rows(self, x: Array, n: int, start: int = 0) -> np.ndarray:
        """Entries start..start+n of the leading axis, a view."""
        return _host(x)[start : start + n]

    def view(self, x: Array, shape: tuple[int, ...]) -> np.ndarray:
        return _host(x).reshape(shape)

    def upload(self, dst: Array, host: np.ndarray) -> None:
        _host(dst)[...] = host

    def copy_into(self, dst: Array, src: Array) -> None:
        _host(dst)[...] = _host(src)

    def copy(self, x: Array) -> np.ndarray:
        return _host(x).copy()

    def copy_row(
        self, x: Array, src: int, dst: int, length: int | None = None, axis: int | None = None
    ) -> None:
        """Row ``src`` over row ``dst``: whole, or only the first ``length`` entries of the
        row's axis ``axis`` (a KV row's positions: those after are not read)."""
        a = _host(x)
        if length is None or axis is None:
            a[dst] = a[src]
            return
        part = (slice(None),) * axis + (slice(0, length),)
        a[(dst,) + part] = a[(src,) + part]

    def copy_positions(
        self, dst: Array, src: Array, axis: int, length: int, *, dst_start: int = 0,
        src_start: int = 0,
    ) -> None:
        """``length`` entries of ``src``'s axis ``axis`` from ``src_start`` over ``dst``'s from
        ``dst_start``, the other axes equal (a KV row's positions to or from a cache block)."""
        lead = (slice(None),) * axis
        _host(dst)[lead + (slice(dst_start, dst_start + length),)] = _host(src)[
            lead + (slice(src_start, src_start + length),)
        ]

    def fill_zero(self, x: Array) -> None:
        _host(x)[...] = 0

    def to_host(self, x: Array, *, wait: bool = True) -> np.ndarray:
        """The buffer as a host array: itself (the engine's next call may overwrite it)."""
        return _host(x)

    def download(self, x: Array) -> np.ndarray:
        """A host copy of its own."""
        return _host(x).copy()

    def synchronize(self) -> None:
        pass

    def reader(self, shape: tuple[int, ...], dtype: DTypeLike) -> Reader:
        return _HostReader()

    def overlaps(self, x: Array, buffers: Iterable[Array]) -> bool:
        """Whether ``x`` may share memory with one of ``buffers`` (an earlier call's output fed
        back, to be copied before the call writes them). An array that owns its memory, the
        common feed, is checked by identity: the engine allocated its outputs, so only an
        output or a view of one can overlap them; anything else by its memory."""
        root = _host(x)
        while isinstance(root.base, np.ndarray):
            root = root.base
        if root.base is None:
            return any(b is root for b in buffers)
        return any(np.shares_memory(x, b) for b in buffers)


class DeviceBuffers:
    """A GPU engine's buffers: memory.DeviceArrays on device ``device``, ordered on its stream
    of ``lane`` (memory.py). Host arrays given where a buffer may be are uploaded (or, read,
    returned as they are)."""

    on_host = False

    def __init__(self, device: int = 0, lane: int = 0) -> None:
        self.device = device
        self.lane = lane

    def zeros(self, shape: tuple[int, ...], dtype: DTypeLike) -> DeviceArray:
        return memory.DeviceArray.zeros(shape, dtype, device=self.device, lane=self.lane)

    def resident(self, x: Array) -> bool:
        """Whether ``x`` is a device buffer (this engine's or another's), read where it is."""
        return not isinstance(x, np.ndarray)

    def rows(self, x: Array, n: int, start: int = 0) -> Array:
        return x[start : start + n] if isinstance(x, np.ndarray) else x.rows(n, start)

    def view(self, x: Array, shape: tuple[int, ...]) -> Array:
        return x.reshape(shape) if isinstance(x, np.ndarray) else x.view(shape)

    def upload(self, dst: Array, host: np.ndarray) -> None:
        _device(dst).upload(host)

    def copy_into(self, dst: Array, src: Array) -> None:
        """Copied on the device (queued), or uploaded from a host array."""
        if isinstance(src, np.ndarray):
            _device(dst).upload(src)
        else:
            _device(dst).copy_from(src)

    def copy(self, x: Array) -> Array:
        if isinstance(x, np.ndarray):
            return x.copy()
        out = memory.DeviceArray.zeros(x.shape, x.dtype, device=x.device, lane=x.lane)
        out.copy_from(x)
        return out

    def copy_row(
        self, x: Array, src: int, dst: int, length: int | None = None, axis: int | None = None
    ) -> None:
        """As HostBuffers.copy_row, copying the whole row: one contiguous copy."""
        buf = _device(x)
        buf.rows(1, dst).copy_from(buf.rows(1, src))

    def copy_positions(
        self, dst: Array, src: Array, axis: int, length: int, *, dst_start: int = 0,
        src_start: int = 0,
    ) -> None:
        """As HostBuffers.copy_positions: one 2-D copy on the device (a row per entry of the
        axes before ``axis``)."""
        _device(dst).copy_positions(_device(src), axis, length, dst_start=dst_start,
                                    src_start=src_start)  # fmt: skip

    def fill_zero(self, x: Array) -> None:
        """Zeroed on the device, ordered on its stream."""
        _device(x).fill_zero()

    def to_host(self, x: Array, *, wait: bool = True) -> np.ndarray:
        """Downloaded (``wait=False``: only queued; ``synchronize()`` before reading it)."""
        return x if isinstance(x, np.ndarray) else x.download(sync=wait)

    def download(self, x: Array) -> np.ndarray:
        return x.copy() if isinstance(x, np.ndarray) else x.download()

    def synchronize(self) -> None:
        memory.synchronize(self.device, self.lane)

    def reader(self, shape: tuple[int, ...], dtype: DTypeLike) -> Reader:
        """Pinned host memory and an event (memory.HostRead): allocate once, use per read."""
        return memory.HostRead(shape, dtype, self.device, self.lane)

    def overlaps(self, x: Array, buffers: Iterable[Array]) -> bool:
        """By address range: device buffers overlap device buffers only."""
        if isinstance(x, np.ndarray):
            return False
        return any(
            not isinstance(b, np.ndarray) and x.ptr < b.ptr + b.nbytes and b.ptr < x.ptr + x.nbytes
            for b in buffers
        )


class FixedInputs:
    """A captured call's inputs at fixed addresses (what its CUDA graph replays against): each
    feed is copied into a buffer of its own, bound once; a host array is uploaded only when it
    differs from what was last sent (only this binding's calls write those buffers), a device
    buffer is copied on the device and never visits the host."""

    def __init__(self, buffers: Buffers, bind: Callable[[str, Array], None]) -> None:
        self._buffers, self._bind = buffers, bind
        self.held: dict[str, DeviceArray] = {}
        # what each buffer holds, as last uploaded (dtype and bytes: comparing those costs a
        # fraction of np.array_equal's ~3.5 us on the small feeds)
        self._sent: dict[str, tuple[np.dtype, bytes]] = {}

    def put(self, name: str, value: Array) -> None:
        """Per replayed call and feed: the buffers' own methods, no more (device buffers)."""
        buf = self.held.get(name)
        if buf is None:
            buf = self.held[name] = _device(self._buffers.zeros(value.shape, value.dtype))
            self._bind(name, buf)
        if not isinstance(value, np.ndarray):
            buf.copy_from(value)
            self._sent.pop(name, None)
            return
        sent = (value.dtype, value.tobytes())  # a captured call keeps its shapes
        if self._sent.get(name) != sent:
            buf.upload(value)
            self._sent[name] = sent

    def holds(self, name: str, value: np.ndarray) -> bool:
        """Whether ``name``'s buffer holds this host array, as last uploaded."""
        return name in self.held and self._sent.get(name) == (value.dtype, value.tobytes())
