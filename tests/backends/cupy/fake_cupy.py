"""A stand-in for the part of CuPy the executor uses, on NumPy, for machines without a GPU.

It keeps what matters for correctness of the GPU path: work issued to a stream is not
done when the call returns, but queued, and queued work of different streams runs in an
adversarial (seeded random) order until someone synchronizes; event records and waits
order streams as CUDA orders them. So a missing wait between steps, or a read before a
stream finished, shows up as wrong values. It also holds the executor to CUDA's rules
on devices: a kernel's arrays and stream belong to the current device, a copy names
the devices its pointers are on, an event is recorded on a stream of its own device.
"""

from __future__ import annotations

import ctypes
import random
import types
from collections import deque
from typing import Any, Callable

import numpy as np


class FakeArray(np.ndarray):
    """A NumPy array that knows its device and exposes `.data.ptr` like a CuPy array."""

    device_id: int = 0

    def __array_finalize__(self, obj: Any) -> None:
        self.device_id = getattr(obj, "device_id", 0)

    @property
    def data(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(ptr=self.ctypes.data)


class CUDARuntimeError(RuntimeError):
    pass


class FakeGpus:
    def __init__(self, count: int, seed: int, peer_access: bool = True):
        self.count = count
        self.rng = random.Random(seed)
        self.peer_access = peer_access
        self.current_device = 0
        self.stream_stack: list["Stream"] = []
        self.streams: dict[int, "Stream"] = {}
        # (start, end, device, array): the arrays are kept, so that no address is reused
        self.allocations: list[tuple[int, int, int, Any]] = []
        self.peer_enabled: set[tuple[int, int]] = set()
        self.launches = 0

    # --- what lies where -----------------------------------------------------------
    def device_of(self, ptr: int) -> int:
        for start, end, device, _ in self.allocations:
            if start <= ptr < end or (start == end == ptr):
                return device
        raise AssertionError(f"pointer {ptr:#x} is not in any device allocation")

    def current_stream(self) -> "Stream | None":
        return self.stream_stack[-1] if self.stream_stack else None

    # --- running queued work --------------------------------------------------------------
    def enqueue(self, stream: "Stream | None", work: Callable[[], Any]) -> None:
        self.launches += 1
        if stream is None:
            work()  # the legacy default stream: no ordering with the non-blocking streams
        else:
            stream.queue.append(("work", work))

    def drain(self, target: "Stream") -> None:
        """Run queued work, streams picked at random, until `target` is empty."""
        while target.queue:
            ready = [s for s in self.streams.values() if s.queue and s.head_ready()]
            if not ready:
                raise AssertionError("streams wait on each other forever (an event that is never recorded)")
            stream = self.rng.choice(ready)
            kind, payload = stream.queue.popleft()
            if kind == "work":
                payload()
            elif kind == "record":
                event, version = payload
                event.done = max(event.done, version)


class Stream:
    def __init__(self, gpus: FakeGpus, non_blocking: bool = False):
        self.gpus = gpus
        self.device = gpus.current_device
        self.queue: deque[tuple[str, Any]] = deque()
        self.ptr = id(self)
        gpus.streams[self.ptr] = self

    def head_ready(self) -> bool:
        kind, payload = self.queue[0]
        if kind == "wait":
            event, version = payload
            return event.done >= version
        return True

    def wait_event(self, event: "Event") -> None:
        self.queue.append(("wait", (event, event.recorded)))

    def synchronize(self) -> None:
        self.gpus.drain(self)

    def __enter__(self) -> "Stream":
        assert self.gpus.current_device == self.device, "a stream made current on another device"
        self.gpus.stream_stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gpus.stream_stack.pop()


class Event:
    def __init__(self, gpus: FakeGpus, disable_timing: bool = False):
        self.gpus = gpus
        self.device = gpus.current_device
        self.recorded = 0  # records issued
        self.done = 0  # records reached by their stream

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or self.gpus.current_stream()
        assert stream is not None
        assert stream.device == self.device, "an event recorded on a stream of another device"
        self.recorded += 1
        stream.queue.append(("record", (self, self.recorded)))


class Device:
    def __init__(self, gpus: FakeGpus, device_id: int):
        assert 0 <= device_id < gpus.count, f"no device {device_id}"
        self.gpus, self.id = gpus, device_id
        self.previous: list[int] = []

    def __enter__(self) -> "Device":
        self.previous.append(self.gpus.current_device)
        self.gpus.current_device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gpus.current_device = self.previous.pop()

    def use(self) -> None:
        self.gpus.current_device = self.id


def make_fake_cupy(devices: int = 2, seed: int = 0, peer_access: bool = True) -> types.ModuleType:
    gpus = FakeGpus(devices, seed, peer_access)
    cp = types.ModuleType("cupy")
    cp.__version__ = "0.0-fake"
    cp.gpus = gpus
    cp.int64, cp.uint64, cp.float64, cp.uint8 = np.int64, np.uint64, np.float64, np.uint8

    def on_device(array: np.ndarray) -> FakeArray:
        out = array.view(FakeArray)
        out.device_id = gpus.current_device
        return out

    def empty(n: int, dtype: Any = np.float64) -> FakeArray:
        array = on_device(np.empty(n, dtype=dtype))
        start = array.ctypes.data
        gpus.allocations.append((start, start + array.nbytes, gpus.current_device, array))
        return array

    def zeros(n: int, dtype: Any = np.float64) -> FakeArray:
        array = empty(n, dtype)
        array[...] = 0
        return array

    def arange(n: int, dtype: Any = None) -> FakeArray:
        return on_device(np.arange(n, dtype=dtype))

    def add(a: FakeArray, b: FakeArray, out: FakeArray) -> FakeArray:
        for x in (a, b, out):
            assert x.device_id == gpus.current_device, "a kernel reads or writes another device's array"
        stream = gpus.current_stream()
        assert stream is None or stream.device == gpus.current_device
        gpus.enqueue(stream, lambda: np.add(np.asarray(a), np.asarray(b), out=np.asarray(out)))
        return out

    cp.empty, cp.zeros, cp.arange, cp.add = empty, zeros, arange, add
    cp.count_nonzero = np.count_nonzero

    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.CUDARuntimeError = CUDARuntimeError
    runtime.memcpyDeviceToDevice = 3
    runtime.getDeviceCount = lambda: gpus.count
    runtime.getDeviceProperties = lambda d: {"name": f"Fake GPU {d}".encode()}
    runtime.deviceCanAccessPeer = lambda d, p: int(gpus.peer_access and d != p)

    def enable_peer(peer: int) -> None:
        key = (gpus.current_device, peer)
        if key in gpus.peer_enabled:
            raise CUDARuntimeError("cudaErrorPeerAccessAlreadyEnabled")
        gpus.peer_enabled.add(key)

    def memcpy_async(dst: int, src: int, size: int, kind: int, stream_ptr: int) -> None:
        stream = gpus.streams[stream_ptr]
        assert kind == 3
        assert stream.device == gpus.current_device, "a copy issued to another device's stream"
        assert gpus.device_of(dst) == gpus.device_of(src) == stream.device, "a same-device copy across devices"
        assert not (dst < src + size and src < dst + size) or dst == src, "overlapping copy"
        gpus.enqueue(stream, lambda: ctypes.memmove(dst, src, size))

    def memcpy_peer_async(dst: int, dst_device: int, src: int, src_device: int, size: int, stream_ptr: int) -> None:
        stream = gpus.streams[stream_ptr]
        assert stream.device == gpus.current_device, "a copy issued to another device's stream"
        assert gpus.device_of(dst) == dst_device and gpus.device_of(src) == src_device, "wrong devices named"
        gpus.enqueue(stream, lambda: ctypes.memmove(dst, src, size))

    runtime.deviceEnablePeerAccess = enable_peer
    runtime.memcpyAsync = memcpy_async
    runtime.memcpyPeerAsync = memcpy_peer_async

    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime
    cuda.Device = lambda d: Device(gpus, d)
    cuda.Stream = lambda null=False, non_blocking=False: Stream(gpus, non_blocking)
    cuda.Event = lambda block=False, disable_timing=False, interprocess=False: Event(gpus, disable_timing)
    cp.cuda = cuda
    return cp
