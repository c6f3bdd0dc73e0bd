"""Operator-level FLOP counting with attribution to modules and operator kinds.

torch.utils.flop_counter supplies the per-operator formulas. Two things are added:

* attention is counted once, at the ``F.scaled_dot_product_attention`` call, whatever
  kernel runs underneath. On the meta device SDPA decomposes into ``bmm``; on CPU it
  runs ``_scaled_dot_product_flash_attention_for_cpu``, which torch's registry does not
  know (it would count 0). Counting at the function level gives the same number on
  every device and lets us report attention as its own kind.
* counts are attributed to the module path that ran them, to any depth.

SDPA called from inside another function that a torch-function mode handles (e.g.
``F.multi_head_attention_forward``) is not seen at the function level; there the fused
kernels torch's registry lacks are counted as attention at the dispatch level, and on
the meta device the decomposed ``bmm`` pair is counted as matmul: same total.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

MATMUL, CONVOLUTION, ATTENTION = "matmul", "convolution", "attention"
KINDS = (MATMUL, CONVOLUTION, ATTENTION)

_KIND_OF_OP = {
    aten.mm: MATMUL,
    aten.addmm: MATMUL,
    aten.bmm: MATMUL,
    aten.baddbmm: MATMUL,
    aten._scaled_mm: MATMUL,
    aten.convolution: CONVOLUTION,
    aten._convolution: CONVOLUTION,
    aten.cudnn_convolution: CONVOLUTION,
    aten.convolution_overrideable: CONVOLUTION,
    aten._slow_conv2d_forward: CONVOLUTION,
}


def attention_flops(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> int:
    """FLOPs of softmax(Q K^T) V: two batched matmuls (2 FLOPs per multiply-add)."""
    *batch, q_len, head_dim = query.shape
    kv_len, v_dim = key.shape[-2], value.shape[-1]
    batch_size = 1
    for size in batch:
        batch_size *= size
    return 2 * batch_size * q_len * kv_len * head_dim + 2 * batch_size * q_len * kv_len * v_dim


@dataclass
class FlopCounts:
    """FLOPs gathered by one counting session, keyed by module path and operator kind."""

    by_module: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    @property
    def total(self) -> int:
        return sum(self.by_module[""].values())

    def by_kind(self, module: str = "") -> dict[str, int]:
        counts = self.by_module.get(module, {})
        return {kind: int(counts.get(kind, 0)) for kind in KINDS}

    def modules(self, depth: int) -> dict[str, int]:
        """Total FLOPs of every module path ``depth`` levels below its root component, and of each shallower path
        what its children leave out: the whole of a module without children (FLUX's ``proj_out`` at depth 2), the
        rest of one with them as "PATH (outside its submodules)". The paths sum to the component's total."""
        totals = {path: sum(kinds.values()) for path, kinds in self.by_module.items() if path}
        children: dict[str, int] = defaultdict(int)  # each path's direct children's FLOPs, summed in one pass
        for path, flops in totals.items():
            if "." in path:
                children[path.rpartition(".")[0]] += flops
        found = {path: flops for path, flops in totals.items() if path.count(".") == depth}
        for path, flops in totals.items():
            if path.count(".") < depth and flops > children[path]:
                found[path if not children[path] else f"{path} (outside its submodules)"] = flops - children[path]
        return found

    def add(self, paths: list[str], kind: str, flops: int) -> None:
        for path in paths:
            self.by_module[path][kind] += flops


def _fused_attention_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return attention_flops(query, key, value)


#: fused attention kernels that torch.utils.flop_counter does not know
_EXTRA_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _fused_attention_flops,
    aten._scaled_dot_product_fused_attention_overrideable: _fused_attention_flops,
}
#: every formula of torch.utils.flop_counter plus the fused attention kernels it lacks, by operator packet
#: every formula of torch.utils.flop_counter, plus the fused attention kernels it lacks, by operator packet
FORMULAS = {**flop_registry, **_EXTRA_FORMULAS}
_KIND_OF_OP.update({op: ATTENTION for op in _EXTRA_FORMULAS})
_KIND_OF_OP.update({op: ATTENTION for op in flop_registry if "attention" in str(op)})


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, state: _State) -> None:
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if self.state.inside_attention or packet not in FORMULAS:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        flops = FORMULAS[packet](*args, **kwargs, out_val=out)
        self.state.counts.add(self.state.paths(), _KIND_OF_OP.get(packet, MATMUL), flops)
        return out


class _AttentionCounter(TorchFunctionMode):
    def __init__(self, state: _State) -> None:
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self.state.inside_attention:
            return func(*args, **kwargs)
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs["key"]
        value = args[2] if len(args) > 2 else kwargs["value"]
        self.state.counts.add(self.state.paths(), ATTENTION, attention_flops(query, key, value))
        self.state.inside_attention = True
        try:
            return func(*args, **kwargs)
        finally:
            self.state.inside_attention = False


@dataclass
class _State:
    counts: FlopCounts
    stack: list[str] = field(default_factory=list)
    inside_attention: bool = False

    def paths(self) -> list[str]:
        """The root, and the innermost running module with each of its ancestors.

        Ancestors come from the path itself, so a component entered through a method
        other than ``forward`` (``vae.decode``) still gets its FLOPs.
        """
        if not self.stack:
            return [""]
        parts = self.stack[-1].split(".")
        return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


@contextmanager
def count_flops(
    modules: dict[str, torch.nn.Module] | None = None,
    reuse_repeated_blocks: bool = False,
    submodules: bool = True,
    replayed: tuple[str, ...] = (),
) -> Iterator[FlopCounts]:
    """Count FLOPs of everything run inside the block.

    ``modules`` maps a name to a root module (e.g. pipeline components); FLOPs run inside
    a root's forward are attributed to ``name`` and to ``name.sub.module`` paths.

    ``reuse_repeated_blocks`` (meta device only): a block of a ``ModuleList`` that has the
    same structure and gets inputs of the same shapes as one already run is not run again;
    its output and counts are replayed. Transformer stacks then cost one block each.

    ``submodules=False`` tracks only the roots (and reused blocks): faster, no breakdown.

    ``replayed`` names submodules of the roots (e.g. ``decoder``) whose repeated calls with inputs of
    the same shapes and values are replayed the same way, whether or not reuse is on: for a module
    called once per frame whose state, if any, lives in its arguments (see ``Call.replayed``).
    """
    counts = FlopCounts()
    state = _State(counts)
    handles, memo = [], {}
    for root_name, root in (modules or {}).items():
        blocks = {id(root.get_submodule(name)): name for name in replayed}
        if reuse_repeated_blocks:
            blocks |= {
                id(block): index
                for _, module in root.named_modules()
                if isinstance(module, torch.nn.ModuleList)
                for index, block in enumerate(module)
            }
        for sub_name, module in root.named_modules():
            path = f"{root_name}.{sub_name}" if sub_name else root_name
            if submodules or not sub_name or id(module) in blocks:
                pushed: list[bool] = []
                handles.append(module.register_forward_pre_hook(_push(state, path, root_name, pushed)))
                handles.append(module.register_forward_hook(_pop(state, pushed), always_call=True))
            if id(module) in blocks:
                handles.append(_ReusedForward(module, path, state, memo))
    try:
        with _AttentionCounter(state), _DispatchCounter(state):
            yield counts
    finally:
        for handle in handles:
            handle.remove()


def block_structure(block: torch.nn.Module) -> tuple:
    """What makes two blocks run alike: what ``repr(block)`` says (every submodule's path, class and settings,
    without building the string) and every parameter's and buffer's shape and dtype."""
    layout = tuple((name, type(module), module.extra_repr()) for name, module in block.named_modules())
    tensors = tuple(
        (name, tuple(tensor.shape), tensor.dtype) for name, tensor in block.state_dict(keep_vars=True).items()
    )
    return layout, tensors


class _ReusedForward:
    """Wraps one block's ``forward`` to replay counts of an identical earlier call."""

    def __init__(self, block: torch.nn.Module, path: str, state: _State, memo: dict) -> None:
        self.block, self.path, self.state, self.memo = block, path, state, memo
        self.structure = block_structure(block)
        self.original = block.forward
        block.forward = self

    def __call__(self, *args, **kwargs):
        key = (self.structure, call_signature(args), call_signature(kwargs))
        if key in self.memo:
            output, recorded = self.memo[key]
            for relative, kinds in recorded.items():
                paths = self.state.paths() if not relative else [f"{self.path}.{relative}"]
                for kind, flops in kinds.items():
                    self.state.counts.add(paths, kind, flops)
            return output
        before = self._inside()
        output = self.original(*args, **kwargs)
        after = self._inside()
        recorded = {
            relative: {kind: flops - before.get(relative, {}).get(kind, 0) for kind, flops in kinds.items()}
            for relative, kinds in after.items()
        }
        self.memo[key] = (output, recorded)
        return output

    def _inside(self) -> dict[str, dict[str, int]]:
        prefix = self.path + "."
        return {
            ("" if path == self.path else path[len(prefix) :]): dict(kinds)
            for path, kinds in self.state.counts.by_module.items()
            if path == self.path or path.startswith(prefix)
        }

    def remove(self) -> None:
        del self.block.forward


def call_signature(value):
    """A hashable description of call arguments: shapes for tensors, values otherwise."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(call_signature(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple((key, call_signature(item)) for key, item in value.items()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return ("object", type(value).__qualname__, id(value))


def _push(state: _State, path: str, root: str, pushed: list[bool]):
    """Enter ``path``, unless it is a module another root shares and that root is the one running: a module of two
    roots (Z-Image's ControlNet runs the transformer's own refiners, ``ZImageControlNetModel.from_transformer``) counts
    for the root whose call runs it."""

    def hook(module, args):
        running = state.stack[-1].split(".", 1)[0] if state.stack else None
        enter = running is None or running == root or path == root
        pushed.append(enter)
        if enter:
            state.stack.append(path)

    return hook


def _pop(state: _State, pushed: list[bool]):
    def hook(module, args, output):
        if pushed.pop():
            state.stack.pop()

    return hook
