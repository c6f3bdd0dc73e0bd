"""Repeated blocks tracked once: a block of a ``ModuleList`` (or another unit of work: a VAE's decode of one
slice, its decoder on one tile) called with inputs like those of an identical block already run on fake tensors
is not run again. What the first run did to each recorder (the memory
tracker's peak above its level at the block's entry, cuDNN's convolution copies, the operators counted) is
applied again at the current level, and the block's outputs are allocated afresh with the same shapes,
strides and dtypes (or are the same input objects, where the block returned an input). A transformer's
stack then costs one block per distinct input signature, and every figure is the one a full run gives
(``tests/test_replay.py`` compares both on real diffusers blocks).

A block that replaces items of a list or dict it is handed (Wan's decoder fills the frame cache it is given) is
replayed too: the new items are recorded as its outputs are, and written into the same places on replay.

A block is run every time, never replayed, where replaying could differ: it changed its arguments otherwise
(added items, reshaped a tensor in place), left more or less memory live than its new outputs and items hold
less what it freed (a hook that keeps its attention weights), returned views of one storage at two dtypes,
or returned an object that is not a tensor, a number, a string or None.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch
from torch.utils._pytree import SequenceKey, tree_flatten, tree_flatten_with_path, tree_unflatten

from diffmeter.flops.counter import block_structure

#: a memo entry for a block that must run every time
RUN_ALWAYS = "run always"
#: set while a replayed block's outputs are allocated again: no operator the model dispatched
REBUILDING = contextvars.ContextVar("rebuilding", default=False)
PLAIN = (type(None), bool, int, float, str)


class Recorder(Protocol):
    """Something a block's run changes, recorded once and applied again on replay."""

    def begin(self) -> object:
        """Called as a block starts running; returns what ``end`` needs."""

    def end(self, begun: object) -> object:
        """Called as it ends; returns the block's effect, relative to its start."""

    def apply(self, effect: object) -> None:
        """Does the recorded effect again, from the current state."""


def input_signature(args: tuple, kwargs: dict) -> tuple:
    """The flattened inputs' structure; per tensor its shape, strides, dtype, device, which earlier input shares
    its storage and its offset from that input's (a tile or a slice of a larger tensor runs as the whole tensor
    would: where its view starts changes no operator); other values as they are (by identity where they are not
    plain)."""
    leaves, structure = tree_flatten((args, kwargs))
    first_with_storage: dict[int, int] = {}
    described = []
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            storage = first_with_storage.setdefault(leaf.untyped_storage()._cdata, index)
            offset = leaf.storage_offset() - leaves[storage].storage_offset()
            described.append((tuple(leaf.shape), leaf.stride(), offset, leaf.dtype, leaf.device.type, storage))
        else:
            described.append(leaf if isinstance(leaf, PLAIN) else ("object", type(leaf).__qualname__, id(leaf)))
    return str(structure), tuple(described)


def output_layout(output, inputs: list):
    """How to make ``output`` again from a later call's inputs (``inputs``: the call's flattened inputs, None
    where an input is not to be used), or None where that could differ: the storages the block allocated
    (elements, dtype, device), and per leaf the input it is, its view of an input (shape, strides, offset from
    the input's) or of an allocated storage (shape, strides, offset), or a plain value."""
    position = {id(leaf): index for index, leaf in enumerate(inputs) if isinstance(leaf, torch.Tensor)}
    input_storage = {
        leaf.untyped_storage()._cdata: index for index, leaf in enumerate(inputs) if isinstance(leaf, torch.Tensor)
    }
    leaves, structure = tree_flatten(output)
    storages: dict[int, tuple[int, torch.dtype, torch.device]] = {}
    made = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in position:
                made.append(("input", position[id(leaf)]))
                continue
            storage, view = leaf.untyped_storage(), (tuple(leaf.shape), leaf.stride(), leaf.storage_offset())
            if storage._cdata in input_storage:
                if inputs[input_storage[storage._cdata]].dtype != leaf.dtype:
                    return None
                relative = leaf.storage_offset() - inputs[input_storage[storage._cdata]].storage_offset()
                if relative < 0:  # a view reaching before its input's start: another call's storage may not have it
                    return None
                made.append(("view of input", input_storage[storage._cdata], *view[:2], relative))
                continue
            if storage.nbytes() % leaf.element_size():
                return None
            found = storages.setdefault(
                storage._cdata, (storage.nbytes() // leaf.element_size(), leaf.dtype, leaf.device)
            )
            if found[1] != leaf.dtype:
                return None
            made.append(("view of new", list(storages).index(storage._cdata), *view))
        elif isinstance(leaf, PLAIN):
            made.append(("value", leaf))
        else:
            return None
    return structure, list(storages.values()), made


def new_bytes(layout) -> int:
    """The bytes of the storages a block's outputs were allocated in."""
    return sum(elements * dtype.itemsize for elements, dtype, _ in layout[1])


def rebuild(layout, inputs: list):
    """The outputs described by ``layout`` for a call with these flattened inputs (storages are allocated through
    the active modes, so the tracker sees them; ``REBUILDING`` is set meanwhile, so no operator count takes these
    allocations and views for the model's)."""
    token = REBUILDING.set(True)
    try:
        return rebuilt(layout, inputs)
    finally:
        REBUILDING.reset(token)


def rebuilt(layout, inputs: list):
    """``rebuild``'s work: the storages allocated, each output a view of one or an input."""
    structure, storages, made = layout
    allocated = [torch.empty(elements, dtype=dtype, device=device) for elements, dtype, device in storages]
    leaves = []
    for how, *what in made:
        if how == "input":
            leaves.append(inputs[what[0]])
        elif how == "value":
            leaves.append(what[0])
        else:
            base = inputs[what[0]] if how == "view of input" else allocated[what[0]]
            shape, strides, offset = what[1:]
            offset += base.storage_offset() if how == "view of input" else 0
            leaves.append(base.as_strided(shape, strides, offset))
    return tree_unflatten(leaves, structure)


class Watched:
    """A call's inputs as it starts, held weakly (holding them would keep alive what the call frees): which items
    of its lists and dicts it replaced, and the bytes of the input storages it freed."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        leaves, self.structure = tree_flatten_with_path((args, kwargs))
        self.leaves = [
            (path, weakref.ref(leaf) if isinstance(leaf, torch.Tensor) else leaf, metadata(leaf))
            for path, leaf in leaves
        ]
        self.storages = {
            leaf.untyped_storage()._cdata: (weakref.ref(leaf.untyped_storage()), leaf.untyped_storage().nbytes())
            for _, leaf in leaves
            if isinstance(leaf, torch.Tensor)
        }

    def replaced(self, args: tuple, kwargs: dict) -> list | None:
        """The paths of the items the call replaced in the lists and dicts it was handed; None where it changed its
        inputs in another way (added or removed items, a tensor reshaped in place, an item of a tuple, of an object,
        or of a container inside one: the callee may have replaced the container itself)."""
        leaves, structure = tree_flatten_with_path((args, kwargs))
        if structure != self.structure:
            return None
        replaced = []
        for (path, leaf), (_, held, described) in zip(leaves, self.leaves, strict=True):
            same = held() is leaf if isinstance(held, weakref.ref) else held is leaf
            if same and metadata(leaf) == described:
                continue
            if same or len(path) != 3 or not isinstance(parent(args, kwargs, path), (list, dict)):
                return None  # a tensor changed in place; an item of a tuple, of an object or of a nested container
            replaced.append(path)
        return replaced

    def freed(self) -> int:
        """Bytes of the input storages no longer alive."""
        return sum(size for held, size in self.storages.values() if held() is None)


def metadata(leaf) -> tuple | None:
    """What an in-place change to a tensor could alter: its shape, strides, offset and dtype."""
    return (
        (tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype)
        if isinstance(leaf, torch.Tensor)
        else None
    )


def inputs_less(args: tuple, kwargs: dict, replaced: list) -> list:
    """The call's flattened inputs, None at the paths in ``replaced`` (items the call replaces are not inputs of
    what it makes)."""
    if not replaced:  # most calls (every transformer block): the plain flattening, without building key paths
        return tree_flatten((args, kwargs))[0]
    return [None if path in replaced else leaf for path, leaf in tree_flatten_with_path((args, kwargs))[0]]


def parent(args: tuple, kwargs: dict, path: tuple):
    """The argument holding the leaf at ``path`` (pytree key entries from ``(args, kwargs)``, three of them: which
    of the two, which argument, which item)."""
    which, argument = path[:2]
    return args[argument.idx] if which.idx == 0 else kwargs[argument.key]


def place(args: tuple, kwargs: dict, path: tuple, item) -> None:
    """Puts ``item`` at ``path`` in its list or dict."""
    last = path[-1]
    parent(args, kwargs, path)[last.idx if isinstance(last, SequenceKey) else last.key] = item


class _ReplayedCall:
    """Wraps one unit's method (a block's ``forward``): runs it while recording, or replays an identical earlier
    run."""

    def __init__(
        self,
        block: torch.nn.Module,
        method: str,
        recorders: Sequence[Recorder],
        live: Callable[[], int],
        memo: dict,
        tally: Counter,
    ) -> None:
        self.block, self.method = block, method
        self.recorders, self.live, self.memo, self.tally = recorders, live, memo, tally
        self.structure = (block_structure(block), method)
        self.own = block.__dict__.get(method)  # an instance attribute already there (a hook's forward) is kept
        self.original = getattr(block, method)
        setattr(block, method, self)

    def __call__(self, *args, **kwargs):
        signature = input_signature(args, kwargs)
        key = (self.structure, signature)
        found = self.memo.get(key)
        self.tally[RUN_ALWAYS if found == RUN_ALWAYS else "recorded" if found is None else "replayed"] += 1
        if found == RUN_ALWAYS:
            return self.original(*args, **kwargs)
        if found is not None:
            effects, layout, replaced, kept = found
            start = self.live()
            for recorder, effect in zip(self.recorders, effects, strict=True):
                recorder.apply(effect)
            inputs = inputs_less(args, kwargs, replaced)
            for path in replaced:  # what the call frees goes before what it makes, as a real run's never coexist
                place(args, kwargs, path, None)
            output, items = rebuild(layout, inputs)
            for path, item in zip(replaced, items, strict=True):
                place(args, kwargs, path, item)
            if self.live() - start != kept:  # an item held elsewhere too was not freed: run such calls from now on
                self.memo[key] = RUN_ALWAYS
            return output
        try:
            watched = Watched(args, kwargs)
        except ValueError:  # a pytree node without keys (diffusers' BaseOutput): its items cannot be placed
            self.memo[key] = RUN_ALWAYS
            return self.original(*args, **kwargs)
        before, begun = self.live(), [recorder.begin() for recorder in self.recorders]
        output = self.original(*args, **kwargs)
        effects = [recorder.end(started) for recorder, started in zip(self.recorders, begun, strict=True)]
        replaced = watched.replaced(args, kwargs)
        layout = None
        if replaced is not None:
            items = [leaf for path, leaf in tree_flatten_with_path((args, kwargs))[0] if path in replaced]
            layout = output_layout((output, items), inputs_less(args, kwargs, replaced))
        kept = self.live() - before
        kept_only_outputs = layout is not None and kept == new_bytes(layout) - watched.freed()
        self.memo[key] = (effects, layout, replaced, kept) if kept_only_outputs else RUN_ALWAYS
        return output

    def remove(self) -> None:
        if self.own is not None:
            setattr(self.block, self.method, self.own)
        else:
            delattr(self.block, self.method)


def module_list_blocks(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """Every ``ModuleList`` block of ``module``, as a unit to replay (its ``forward``)."""
    return [
        (block, "forward")
        for _, modules in module.named_modules()
        if isinstance(modules, torch.nn.ModuleList)
        for block in modules
    ]


@contextmanager
def replayed_calls(
    units: Sequence[tuple[torch.nn.Module, str]], recorders: Sequence[Recorder], live: Callable[[], int]
) -> Iterator[Counter]:
    """Inside the block, each unit (a module and the name of its method) is run once per input signature and
    replayed after that (see the module docstring); ``live()``: the bytes live now. The memo lives as long as the
    block. Yields the count of unit calls "recorded", "replayed" and "run always"."""
    memo: dict = {}
    tally: Counter = Counter()
    wrapped = [_ReplayedCall(block, method, recorders, live, memo, tally) for block, method in units]
    try:
        yield tally
    finally:
        for call in reversed(wrapped):
            call.remove()


def replayed_blocks(
    module: torch.nn.Module, recorders: Sequence[Recorder], live: Callable[[], int]
) -> contextlib.AbstractContextManager[Counter]:
    """``replayed_calls`` of every ``ModuleList`` block of ``module``."""
    return replayed_calls(module_list_blocks(module), recorders, live)
