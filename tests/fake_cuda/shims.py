"""The fake CUDA device's stand-ins: ``torch.cuda``'s functions, streams and events, Zeus's monitor, CUDA
generators, and the few tensor methods that read data or build tensors below the dispatch modes."""

from __future__ import annotations

import contextlib
import types

import torch

from fake_cuda.checker import MADE_UP_SCALAR, dispatch_checker

#: what an event pair reports as elapsed, in milliseconds (invented)
EVENT_MS = 1.0
#: numpy's dtype for a fake tensor's zeros (bfloat16 has none: float32, as ``.float().numpy()`` gives)
NUMPY = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "float32",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def properties(cuda) -> types.SimpleNamespace:
    """What ``get_device_properties`` returns: the fields diffmeter and the libraries read."""
    major, minor = cuda.capability
    return types.SimpleNamespace(
        name=cuda.name,
        total_memory=cuda.memory,
        major=major,
        minor=minor,
        multi_processor_count=132,
        uuid="GPU-fake",
        L2_cache_size=50 * 2**20,
    )


class _Stream:
    """A CUDA stream that knows its device and does nothing."""

    def __init__(self, cuda, index: int) -> None:
        self.cuda, self.device_index = cuda, index
        self.device = torch.device("cuda", index)
        self.cuda_stream = 0

    def synchronize(self) -> None:
        self.cuda.resolve("Stream.synchronize", self.device_index)

    def wait_stream(self, other) -> None:
        self.cuda.resolve("Stream.wait_stream", other.device_index)

    def wait_event(self, event) -> None:
        self.cuda.resolve("Stream.wait_event", event.device_index)

    def record_event(self, event=None):
        event = event or _event_class(self.cuda)()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(self.device_index)


def _stream_class(cuda) -> type:
    class Stream(_Stream):
        """``torch.cuda.Stream(device)``: a new stream on the device named, or the current one."""

        def __init__(self, device=None, priority=0, **_) -> None:
            super().__init__(cuda, cuda.resolve("Stream", device))

    return Stream


def _event_class(cuda) -> type:
    class Event:
        """A CUDA event: recorded on a stream of the run's device; elapsed times are invented."""

        def __init__(self, enable_timing=False, blocking=False, interprocess=False) -> None:
            self.device_index = None

        def record(self, stream=None) -> None:
            index = stream.device_index if stream is not None else None
            self.device_index = cuda.resolve("Event.record", index)

        def elapsed_time(self, end) -> float:
            if self.device_index is None or end.device_index is None:
                cuda.violation("Event.elapsed_time between events not both recorded")
            if self.device_index != end.device_index:
                cuda.violation(f"Event.elapsed_time across cuda:{self.device_index} and cuda:{end.device_index}")
            return EVENT_MS

        def synchronize(self) -> None:
            cuda.resolve("Event.synchronize", self.device_index)

        def query(self) -> bool:
            return True

        def wait(self, stream=None) -> None:
            cuda.resolve("Event.wait", stream.device_index if stream is not None else None)

    return Event


def _zeus_monitor_class(cuda) -> type:
    from zeus.monitor.energy import Measurement

    class ZeusMonitor:
        """Zeus's monitor without NVML: records the GPUs it is asked to watch; joules invented."""

        def __init__(self, gpu_indices=None, cpu_indices=None, sync_execution_with="torch", **_) -> None:
            indices = list(range(cuda.devices)) if gpu_indices is None else list(gpu_indices)
            for index in indices:
                cuda.resolve("zeus.ZeusMonitor", index)
            self.gpu_indices, self.cpu_indices = indices, list(cpu_indices or [])

        def begin_window(self, key, sync_execution=True) -> None:
            pass

        def end_window(self, key, sync_execution=True, cancel=False):
            return Measurement(
                time=0.5, gpu_energy={index: 100.0 for index in self.gpu_indices}, cpu_energy=None, dram_energy=None
            )

    return ZeusMonitor


def _fake_generator_class() -> type:
    real = torch.Generator

    class Generator(real):
        """A CPU generator that reports the CUDA device it was asked for."""

        def __init__(self, device="cpu") -> None:
            super().__init__()
            self._reported = torch.device(device)

        @property
        def device(self) -> torch.device:
            return self._reported

    return Generator


def _built_on_cpu(factory):
    """``torch.tensor(data, device="cuda")`` copies its data to the device below the dispatch modes, where a
    CPU build has no CUDA kernels: built on the CPU, then moved (``_to_copy``, which the fake mode sees).
    Fake tensors in ``data`` are read as ``tolist`` reads them."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_map_only

    def build(data, *args, device=None, **kwargs):
        if isinstance(data, FakeTensor):
            return data.detach().clone().to(device=device, dtype=kwargs.get("dtype"))
        data = tree_map_only(FakeTensor, lambda t: t.tolist(), data)
        if device is not None and torch.device(device).type == "cuda":
            return factory(data, *args, **kwargs).to(device)
        return factory(data, *args, device=device, **kwargs)

    return build


def _indexed(method):
    """``fake[list]`` turns the list into a tensor on the fake's device below the dispatch modes: a CPU one."""

    def index(self, key, *rest):
        if isinstance(key, list):
            key = torch.tensor(key)
        elif isinstance(key, tuple):
            key = tuple(torch.tensor(part) if isinstance(part, list) else part for part in key)
        return method(self, key, *rest)

    return index


def install(cuda, stack: contextlib.ExitStack) -> None:
    """Every shim, each undone by ``stack``; then FakeTensorMode and the checker above it."""
    import numpy
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    def patch(owner, name, value) -> None:
        stack.enter_context(_patched(owner, name, value))

    event = _event_class(cuda)

    def stream(device=None):
        return _Stream(cuda, cuda.resolve("current_stream", device))

    def zeros(device=None) -> int:
        cuda.resolve("memory statistics", device)
        return 0

    def reset_peaks(device=None) -> None:
        cuda.resolve("reset_peak_memory_stats", device)

    memory_module = torch.cuda.memory
    for owner in (torch.cuda, memory_module):
        patch(
            owner,
            "mem_get_info",
            lambda device=None: (cuda.resolve("mem_get_info", device), (cuda.memory, cuda.memory))[1],
        )
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
            patch(owner, name, zeros)
        patch(owner, "reset_peak_memory_stats", reset_peaks)
        patch(owner, "memory_stats", lambda device=None: (cuda.resolve("memory_stats", device), {})[1])
        patch(owner, "empty_cache", lambda: cuda.record("empty_cache"))
    fake_properties = properties(cuda)
    shims = {
        "is_available": lambda: True,
        "device_count": lambda: cuda.devices,
        "is_initialized": lambda: True,
        "_lazy_init": lambda: None,
        "init": lambda: None,
        "is_bf16_supported": lambda *_, **__: True,
        "current_device": lambda: cuda.current(),
        "set_device": cuda.set_device,
        "_exchange_device": cuda.exchange,
        "_maybe_exchange_device": cuda.exchange,
        "synchronize": lambda device=None: cuda.resolve("synchronize", device) and None,
        "current_stream": stream,
        "default_stream": stream,
        "Stream": _stream_class(cuda),
        "stream": lambda s: contextlib.nullcontext(s),
        "Event": event,
        "get_device_properties": lambda device=None: (
            cuda.resolve("get_device_properties", device, own_only=False),
            fake_properties,
        )[1],
        "get_device_name": lambda device=None: (cuda.resolve("get_device_name", device, own_only=False), cuda.name)[1],
        "get_device_capability": lambda device=None: (
            cuda.resolve("get_device_capability", device, own_only=False),
            cuda.capability,
        )[1],
    }
    for name, shim in shims.items():
        patch(torch.cuda, name, shim)
    patch(torch, "Generator", _fake_generator_class())
    # page-locked host memory needs a CUDA driver to lock its pages and a CPU build has no pinned allocator: the host
    # link probe's one pinned buffer (every CUDA run) is pageable here, written as pinned pages are resident
    from diffmeter.measure import host_link

    patch(host_link, "pinned_host", lambda size: torch.zeros(size, dtype=torch.uint8))

    def values(self, *, force=False):
        found = cuda.shadows.get(self)
        if found is not None:
            return found.detach().float().numpy() if self.dtype == torch.bfloat16 else found.detach().numpy()
        return numpy.zeros(tuple(self.shape), NUMPY.get(self.dtype))

    patch(FakeTensor, "numpy", values)

    def listed(self):
        found = cuda.shadows.get(self)
        return found.tolist() if found is not None else numpy.full(tuple(self.shape), MADE_UP_SCALAR).tolist()

    patch(FakeTensor, "tolist", listed)
    for name in ("__getitem__", "__setitem__"):
        patch(FakeTensor, name, _indexed(getattr(torch.Tensor, name)))
    for name in ("tensor", "as_tensor"):
        patch(torch, name, _built_on_cpu(getattr(torch, name)))
    real_swap = torch.utils.swap_tensors
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def swap(first, second):
        for tensor in (first, second):
            cuda.shadows.pop(tensor, None)
        for memo in (mode.fake_tensor_converter.tensor_memo, mode.fake_tensor_converter.meta_converter.tensor_memo):
            for key in [key for key, value in list(memo.items()) if value is first or value is second]:
                del memo[key]
        return real_swap(first, second)

    patch(torch.utils, "swap_tensors", swap)
    with contextlib.suppress(ImportError):
        import zeus.device.cpu
        import zeus.monitor

        patch(zeus.monitor, "ZeusMonitor", _zeus_monitor_class(cuda))
        patch(zeus.device.cpu, "rapl_is_available", lambda: False)
    stack.enter_context(mode)
    stack.enter_context(dispatch_checker(cuda, mode))


@contextlib.contextmanager
def _patched(owner, name: str, value):
    missing = object()
    old = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(owner, name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
