"""A fake CUDA device for the tests: diffmeter's CUDA paths run on a CPU-only torch build (docs/fake-cuda.md).

``with FakeCuda(own="cuda:1") as cuda:`` gives two fake GPUs; the code under test must keep to ``own``.

What it fakes
- **Tensors on ``cuda:N``** are ``FakeTensor``s (torch's ``FakeTensorMode``): real shapes, dtypes and
  devices, no data. A CPU build has no device guard for CUDA, so ``.to("cuda")``, ``.cuda()``, ``copy_``
  and ``nn.Linear(device="cuda")`` fail there with "PyTorch is not linked with support for cuda devices"
  (c10/core/impl/DeviceGuardImplInterface.h, ``getDeviceGuardImpl``). ``guard.cpp``, a
  ``DeviceGuardImplInterface`` for ``DeviceType::CUDA`` built with g++ against torch's own headers and
  libc10, loaded with ctypes and registered only where no CUDA guard exists, supplies one; its current
  device is a thread-local, so an index-less ``"cuda"`` follows ``set_device``.
- **Values** (``checker.py``): operators touching neither a fake tensor nor CUDA run for real on the CPU;
  a fake tensor whose inputs have values gets its real value computed beside it (its shadow), so
  ``.item()``, masks, ``nonzero`` and timestep lookups read what a real run reads; without one, a read
  gets a made-up answer (``MADE_UP_SCALAR``, True, every element nonzero, zeros for ``.numpy()``).
- **``torch.cuda``**, Zeus's ``ZeusMonitor`` and CUDA generators (``shims.py``): recording stand-ins
  (``FakeCuda.calls``); RAPL reads as absent; the host link probe's pinned buffer is pageable (no pinned allocator).

What it checks (each a ``FakeCudaViolation`` raised where it happens, and kept in ``violations``)
- every operator's tensor arguments on one device (0-dim CPU scalars aside; ``_to_copy``, ``copy_``,
  ``index`` and ``index_put`` may cross), which torch's fake kernels do not all check (a convolution
  with its weight on cuda:0 and its input on cuda:1 passes them silently);
- no tensor on a CUDA device other than the run's own;
- every memory, event, stream, synchronization and energy query on the run's own device (an index-less
  one resolves to the current device, so a query made before ``set_device`` is caught), and no
  ``set_device`` to another device.

What it cannot do
- Times and memory figures are invented (``EVENT_MS``, ``mem_get_info`` = the card's size): no test may
  assert one. No kernel runs: CUDA kernels' own support (flash attention, fp8 matmuls), torch.compile
  (dynamo skips frames under a dispatch mode), CUDA graphs, ONNX Runtime and TensorRT (they need real
  device memory) cannot be tested here; their device options are covered by their own tests.

The torch internals it leans on: ``torch._subclasses.fake_tensor`` (FakeTensorMode, FakeTensor, the
converter's memo), ``torch.utils._python_dispatch.TorchDispatchMode`` and
``torch.utils._mode_utils.no_dispatch``; ``Module._apply`` swaps a FakeTensor parameter with
``torch.utils.swap_tensors``, which refuses a tensor something holds a weak reference to, so the shim
drops the converter's memo entries (and shadows) for both tensors first (torch/nn/modules/module.py,
``_apply``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fake_cuda.shims import install

GUARD_SOURCE = Path(__file__).with_name("guard.cpp")
#: (what ran, how it went) for every run the fake_cuda tests made: printed at the end of the test session
LEDGER: list[tuple[str, str]] = []
#: operators whose tensor arguments may sit on different devices
CROSSING = {
    "aten._to_copy.default",
    "aten.copy_.default",
    "aten.index.Tensor",
    "aten.index_put_.default",
    "aten.index_put.default",
    "aten._copy_from.default",
    "aten._copy_from_and_resize.default",
}


class FakeCudaViolation(AssertionError):
    """A device error the fake CUDA device caught: the message names the call and both devices."""


class FakeCudaUnavailable(RuntimeError):
    """The guard could not be built or registered here; the message says why."""


@dataclasses.dataclass(frozen=True)
class CudaCall:
    """One ``torch.cuda`` call: its name and the device index it resolved to (None: no device)."""

    name: str
    device: int | None
    explicit: bool


def unavailable_reason() -> str | None:
    """Why the fake cannot run in this process, or None when it can."""
    if torch.version.cuda is not None or torch.version.hip is not None:
        return f"torch {torch.__version__} is a real CUDA/ROCm build: run the CUDA tests on a GPU instead"
    try:
        _guard_library()
    except FakeCudaUnavailable as error:
        return str(error)
    return None


def _guard_library() -> ctypes.CDLL:
    """The guard, built once per torch version and source into a cache folder, then loaded."""
    loaded = getattr(_guard_library, "loaded", None)
    if loaded is not None:
        return loaded
    root = Path(torch.__file__).parent
    key = hashlib.sha256(f"{torch.__version__}{sys.version}{GUARD_SOURCE.read_text()}".encode()).hexdigest()[:16]
    library = Path(tempfile.gettempdir()) / "diffmeter-fake-cuda" / f"guard-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.partial")
        command = [
            "g++",
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            f"-I{root / 'include'}",
            str(GUARD_SOURCE),
            "-o",
            str(partial),
            f"-L{root / 'lib'}",
            "-lc10",
            f"-Wl,-rpath,{root / 'lib'}",
        ]
        try:
            built = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise FakeCudaUnavailable(f"the fake CUDA guard could not be built (g++: {error})") from None
        if built.returncode != 0:
            raise FakeCudaUnavailable(f"the fake CUDA guard did not compile: {built.stderr.strip()[-300:]}")
        os.replace(partial, library)
    try:
        _guard_library.loaded = ctypes.CDLL(str(library))
    except OSError as error:
        raise FakeCudaUnavailable(f"the fake CUDA guard could not be loaded: {error}") from None
    return _guard_library.loaded


class FakeCuda:
    """``with FakeCuda(own="cuda:1") as cuda:``: ``devices`` fake GPUs named ``name`` with ``memory_gib``
    each; the code under test must keep to ``own``. ``cuda.calls`` and ``cuda.violations`` afterwards."""

    def __init__(
        self,
        own: str = "cuda:1",
        devices: int = 2,
        name: str = "NVIDIA H100 80GB HBM3",
        memory_gib: float = 80.0,
        capability: tuple[int, int] = (9, 0),
    ) -> None:
        self.own = torch.device(own).index or 0
        self.devices, self.name, self.capability = devices, name, capability
        self.memory = int(memory_gib * 2**30)
        self.calls: list[CudaCall] = []
        self.violations: list[str] = []
        self._stack = contextlib.ExitStack()

    # what the code under test sees ------------------------------------------------------------
    def violation(self, message: str) -> None:
        self.violations.append(message)
        raise FakeCudaViolation(message)

    def resolve(self, name: str, device=None, *, own_only: bool = True) -> int:
        """The index ``device`` names (the current device when it names none), recorded and checked."""
        explicit = isinstance(device, int)
        if isinstance(device, torch.device | str):
            device = torch.device(device)
            explicit = device.index is not None
            index = device.index if explicit else self.current()
        elif isinstance(device, int):
            index = device
        else:
            index = self.current()
        self.calls.append(CudaCall(name, index, explicit))
        if index != self.own and (own_only or not explicit):
            how = "on" if explicit else "index-less, resolved to the current device"
            self.violation(f"torch.cuda.{name} {how} cuda:{index}; the run's device is cuda:{self.own}")
        return index

    def record(self, name: str) -> None:
        """A call that names no device and reads none (``empty_cache``)."""
        self.calls.append(CudaCall(name, None, False))

    def current(self) -> int:
        return self._library.fake_cuda_current()

    def set_device(self, device) -> None:
        index = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        index = index.index if index.index is not None else self.current()
        self.calls.append(CudaCall("set_device", index, True))
        if index != self.own:
            self.violation(f"torch.cuda.set_device(cuda:{index}); the run's device is cuda:{self.own}")
        self._library.fake_cuda_set(index)

    def exchange(self, device: int) -> int:
        previous = self.current()
        if device >= 0:
            self._library.fake_cuda_set(device)
        return previous

    def check_tensors(self, op: str, tensors: list[torch.Tensor]) -> None:
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1 and op not in CROSSING:
            self.violation(f"{op} got tensors on {sorted(map(str, devices))}")
        for device in devices:
            if device.type == "cuda" and device.index != self.own:
                self.violation(f"{op} has a tensor on {device}; the run's device is cuda:{self.own}")

    # entering and leaving --------------------------------------------------------------------
    def __enter__(self) -> FakeCuda:
        self._library = _guard_library()
        if not self._library.fake_cuda_register(self.devices):
            raise FakeCudaUnavailable("another CUDA device guard is registered in this process")
        self._stack.callback(self._library.fake_cuda_unregister)
        self._library.fake_cuda_set(0)
        install(self, self._stack)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
