"""Where a call's weight-bearing layers run in its memory: the live activations as each starts and with its output,
recorded on the fake-tensor run (``memory.track_call``). A quantized layer whose kernel dequantizes its weight holds
that copy only while it runs (``quantized_kernels``), so the copy adds to the activations live at that moment, not
to the call's peak, which another operator (an attention's scores, a decoder's upsampled image) usually reaches;
so does a second output where the backend adds the bias or applies the scales out of place.

Layers are keyed by their weight's shape: layers of one shape allocate the same for their weights, so each shape's
highest levels give its layers' highest level with those allocations. A layer called inside a replayed block
(``replay``) is recorded at its level in the block's first run and applied again where the block is replayed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_leaves

#: MemTracker's categories of what a call allocates (``track_call``'s activation bytes)
ACTIVATIONS = ("Activation", "Temp")


def is_tensor(value) -> bool:
    """Whether ``value`` is a tensor (an output's leaves)."""
    return isinstance(value, torch.Tensor)


def activations(snapshot: dict) -> int:
    """The bytes a call allocated, of a MemTracker snapshot (its categories as keys)."""
    return sum(size for kind, size in snapshot.items() if getattr(kind, "value", kind) in ACTIVATIONS)


def layer_key(module: torch.nn.Module) -> str | None:
    """A layer's key, its weight's shape ("3072x3072"); None for a module without a weight of 2 or more dimensions."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return None
    return "x".join(str(size) for size in weight.shape)


class LayerLevels:
    """Per layer key, the highest activations (bytes) as a layer of it starts, with its output (on CUDA, with cuDNN's
    copies during a convolution: ``copies``) and with two outputs, read from ``tracker`` (``memory.PeakTracker``). A
    layer's output is counted from what it returns, not from the tracker's peak inside it: a parameter's views there
    (``nn.Linear``'s ``weight.t()``) are tracked as fresh storages on fake tensors, where a real run allocates nothing.
    A replay recorder (``replay.Recorder``): a block's layers relative to the activations at its entry."""

    def __init__(self, tracker, copies=None) -> None:
        self.tracker, self.copies = tracker, copies
        self.levels: dict[str, tuple[int, int, int]] = {}
        self.scopes: list[tuple[dict[str, tuple[int, int, int]], int]] = []  # the blocks being recorded
        self.running: list[tuple] = []

    def level(self) -> int:
        return activations(self.tracker.current())

    def hooked(self, module: torch.nn.Module) -> Callable[[], None]:
        """Records every layer of ``module`` while it runs; returns what removes the hooks."""
        handles = []
        for layer in module.modules():
            key = layer_key(layer)
            if key is not None:
                handles.append(layer.register_forward_pre_hook(lambda _m, _a, _key=key: self._start(_key)))
                handles.append(layer.register_forward_hook(lambda _m, _a, output: self._stop(output)))
        return lambda: [handle.remove() for handle in handles]

    def _start(self, key: str) -> None:
        begun = self.copies.begin() if self.copies is not None else None
        self.running.append((key, self.level(), begun))

    def _stop(self, output) -> None:
        key, start, begun = self.running.pop()
        made = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tree_leaves(output) if is_tensor(t)}
        out = sum(made.values())
        top = start + out
        if begun is not None:
            during = self.copies.end(begun)  # total bytes above the entry's while cuDNN held its copies
            top = max(top, start + during) if during is not None else top
        self._note(key, (start, top, start + 2 * out))

    def _note(self, key: str, found: tuple[int, int, int]) -> None:
        for levels, entry in [(self.levels, 0), *self.scopes]:
            held = levels.get(key)
            relative = tuple(level - entry for level in found)
            levels[key] = relative if held is None else tuple(map(max, held, relative))

    def begin(self) -> None:
        self.scopes.append(({}, self.level()))

    def end(self, _begun) -> dict[str, tuple[int, int, int]]:
        return self.scopes.pop()[0]

    def apply(self, effect: dict[str, tuple[int, int, int]]) -> None:
        now = self.level()
        for key, found in effect.items():
            self._note(key, tuple(now + level for level in found))
