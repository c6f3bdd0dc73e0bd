"""Repeated blocks tracked once (``predict/replay.py``): every figure of the memory tracker, cuDNN's convolution
copies and the operator tally equals a full run's, on real diffusers pipelines and on blocks built to catch a
replay applied at the wrong level, a mutated argument, and outputs that are views."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from tiny_runs import quick_or_slow
from torch._subclasses.fake_tensor import FakeTensorMode

from diffmeter.families import DENOISER, Call
from diffmeter.predict.memory import DTYPES, PeakTracker, fake_module, settled_plan, track_call
from diffmeter.predict.operators import OperatorTally
from diffmeter.predict.replay import RUN_ALWAYS, replayed_blocks
from diffmeter.spec import ProfileSpec


def both_ways(make: Callable[[], torch.nn.Module], call: Call, dtype: torch.dtype = torch.float32):
    """(memory, operators) of ``call`` run in full and with repeated blocks replayed, each on a module of its own
    (a module may cache on its first call: Qwen-Image's rotary embedding)."""
    found = []
    for replay in (False, True):
        tally = OperatorTally()
        found.append((track_call(make(), call, dtype, on_cuda=True, also=tally, replay=replay), tally.groups))
    return found


@pytest.mark.parametrize(
    "name",
    quick_or_slow(["tiny-sd", "tiny-flux", "tiny-sd3", "tiny-pixart", "tiny-ltx2", "tiny-hidream", "tiny-qwenimage"]),
)
def test_every_call_of_a_tiny_pipeline_gives_the_full_runs_figures(name):
    entry, spec, plan = settled_plan(ProfileSpec(model=name, steps=1))
    for call in plan:
        if not call.count:
            continue
        dtype = DTYPES[spec.dtype_of(call.component)]
        component = entry.components[call.component]
        full, replayed = both_ways(lambda: fake_module(component, dtype), call, dtype)  # noqa: B023 (called here)
        assert replayed == full, (name, call.component)


class Appending(torch.nn.Module):
    """A block that adds to the list it is given: its arguments change shape, so it runs every time."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, kept: list) -> torch.Tensor:
        kept.append(self.linear(x))
        return x + kept[-1]


class Growing(torch.nn.Module):
    """Identical blocks whose outputs are all kept: each block starts with more memory live than the one before,
    so the peak is in the last block, above the first's by what was kept."""

    def __init__(self, blocks: torch.nn.ModuleList) -> None:
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = [x]
        for block in self.blocks:
            output = block(kept[-1])
            kept.append(output[0] if isinstance(output, tuple) else output)
        return torch.cat(kept, dim=-1)


class Wide(torch.nn.Module):
    """A block whose peak is inside it (a 4x wider hidden tensor) and that returns two views of one new storage
    and a view of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor):
        both = torch.cat([self.down(torch.nn.functional.gelu(self.up(x))), x], dim=1)
        return both[:, : x.shape[1]], both[:, x.shape[1] :], x[:, :1]


class Caching(torch.nn.Module):
    """A block that replaces the cache it is given (as Wan's causal convolutions do): a replay writes the new item
    into the list, and the one it replaces is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        cache[0] = self.linear(x)
        return x + cache[0]


class PairCaching(Caching):
    """A block that replaces a pair in the list it is given: the pair's items cannot be written back one by one
    (a tuple), so it runs every time."""

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        cache[0] = (self.linear(x), cache[0][1])
        return x + cache[0][0]


def growing_call(blocks: int) -> tuple[Callable[[], torch.nn.Module], Call]:
    def make() -> torch.nn.Module:
        return fake_module_of(Growing(torch.nn.ModuleList(Wide() for _ in range(blocks))))

    return make, Call("blocks", DENOISER, 1, 1, lambda device: {"x": torch.empty(1, 8, 64, device=device)})


def fake_module_of(module: torch.nn.Module) -> torch.nn.Module:
    with FakeTensorMode(allow_non_fake_inputs=True):
        return module.to_empty(device="cpu")


def test_a_block_replayed_higher_up_peaks_higher_by_what_is_live():
    make, call = growing_call(4)
    full, replayed = both_ways(make, call)
    assert replayed == full
    # the peak is in the last block, above the three kept outputs: a replay that reused the first block's absolute
    # peak would come out as low as one block's
    one_block, _ = both_ways(growing_call(1)[0], call)
    assert full[0].activation_bytes > one_block[0].activation_bytes


def test_replays_are_counted_and_a_block_that_changes_its_arguments_always_runs():
    make, _ = growing_call(4)
    module = make()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker = PeakTracker()
        with tracker, replayed_blocks(module, [tracker], tracker.current_total) as counted:
            module(torch.empty(1, 8, 64))
    # the first block gets the contiguous input, the others a view with the strides of a 16-row tensor
    assert counted == {"recorded": 2, "replayed": 2}

    caching = fake_module_of(torch.nn.ModuleList(Caching() for _ in range(3)))
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker, x = PeakTracker(), torch.empty(1, 8, 64)
        cache = [torch.empty(1, 8, 64)]
        tracker.track_external(caching, x, *cache)  # as track_call does with a call's inputs
        with tracker, replayed_blocks(caching, [tracker], tracker.current_total) as counted:
            for block in caching:
                before = cache[0]
                x = block(x, cache)
                assert cache[0] is not before and cache[0].shape == before.shape  # replaced, replayed or not
    assert counted == {"recorded": 1, "replayed": 2}

    appending = fake_module_of(torch.nn.ModuleList(Appending() for _ in range(3)))
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker, x, lists = PeakTracker(), torch.empty(1, 8, 64), [[], [], []]
        tracker.track_external(appending, x)
        with tracker, replayed_blocks(appending, [tracker], tracker.current_total) as counted:
            for block, kept in zip(appending, lists, strict=True):
                x = block(x, kept)  # each handed an empty list: one signature
    assert counted == {"recorded": 1, RUN_ALWAYS: 2} and all(len(kept) == 1 for kept in lists)

    pairs = fake_module_of(torch.nn.ModuleList(PairCaching() for _ in range(3)))
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker, x = PeakTracker(), torch.empty(1, 8, 64)
        cache = [(torch.empty(1, 8, 64), torch.empty(1, 8, 64))]
        tracker.track_external(pairs, x, *cache[0])
        with tracker, replayed_blocks(pairs, [tracker], tracker.current_total) as counted:
            for block in pairs:
                x = block(x, cache)
    assert counted == {"recorded": 1, RUN_ALWAYS: 2}


class CachedStack(torch.nn.Module):
    """Blocks that replace the one cache they share, over several frames (Wan's decoder and its frame cache); the
    last cache is kept in the result."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Caching() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = [torch.empty_like(x)]
        for _ in range(3):
            for block in self.blocks:
                x = block(x, cache)
        return x + cache[0]


class Doubler(torch.nn.Module):
    """Replaces each item of the cache it is handed by a new one: a real run frees each old item as it makes its
    successor, so the old items and the new never all coexist, and a replay must not make them coexist."""

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        for index in range(len(cache)):
            cache[index] = cache[index] * 2
        return x + 1


class Doubling(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Doubler() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = [torch.empty(64, 64) for _ in range(4)]
        for block in self.blocks:
            x = block(x, cache)
        return x


def test_blocks_that_replace_list_items_replayed_give_the_full_runs_figures():
    call = Call("blocks", DENOISER, 1, 1, lambda device: {"x": torch.empty(1, 8, 64, device=device)})
    full, replayed = both_ways(lambda: fake_module_of(CachedStack()), call)
    assert replayed == full
    # the new items outweigh what the call's peak rose by: rebuilt beside the old ones, the replay peaked higher
    full, replayed = both_ways(lambda: fake_module_of(Doubling()), call)
    assert replayed == full


class NewPair(Caching):
    """Puts a new inner list where the cache held one: the old list may be held elsewhere, so its items cannot be
    written back into it; it runs every time."""

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        cache[0] = [self.linear(x), self.linear(x)]
        return x + 1


def test_a_block_that_replaces_a_nested_container_runs_every_time():
    blocks = fake_module_of(torch.nn.ModuleList(NewPair() for _ in range(3)))
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker, x = PeakTracker(), torch.empty(1, 8, 64)
        cache = [[torch.empty(1, 8, 64), torch.empty(1, 8, 64)]]
        tracker.track_external(blocks, x, *cache[0])
        with tracker, replayed_blocks(blocks, [tracker], tracker.current_total) as counted:
            for block in blocks:
                old = cache[0]
                x = block(x, cache)
                assert cache[0] is not old and old[0] is not cache[0][0]  # a new list; the old one left as it was
    assert counted == {"recorded": 1, RUN_ALWAYS: 2}


class ViewOfTile(torch.nn.Module):
    def forward(self, tile: torch.Tensor) -> torch.Tensor:
        return tile[:, 1:]  # a view of the tile it is handed


class Tiles(torch.nn.Module):
    """Hands one block three tiles of a larger tensor, views at three offsets, as a tiled VAE decode does."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([ViewOfTile()])

    def forward(self, z: torch.Tensor) -> list[torch.Tensor]:
        return [self.blocks[0](z[:, k : k + 4]) for k in range(0, 12, 4)]


def test_tiles_at_other_offsets_are_replayed_and_their_views_rebuilt_at_their_own_offsets():
    module = Tiles()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        tracker, z = PeakTracker(), torch.empty(2, 12, 3)
        with tracker, replayed_blocks(module, [tracker], tracker.current_total) as counted:
            views = module(z)
        assert counted == {"recorded": 1, "replayed": 2}
        assert [v.storage_offset() for v in views] == [z[:, k : k + 4][:, 1:].storage_offset() for k in (0, 4, 8)]
        assert all(v.untyped_storage()._cdata == z.untyped_storage()._cdata for v in views)


@pytest.mark.parametrize("name", ["tiny-ltx2", "tiny-pixart", "tiny-sd"])
def test_a_tiny_denoisers_repeated_blocks_are_replayed_not_run(name):
    """The speed this buys: a stack of blocks runs as one block per input signature (LTX-2: 48 per call)."""
    entry, spec, plan = settled_plan(ProfileSpec(model=name, steps=1))
    call = next(c for c in plan if c.role == DENOISER and c.count)
    module = fake_module(entry.components[call.component], DTYPES[spec.dtype_of(call.component)])
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(torch.no_grad())
        with torch.device("cpu"):
            inputs = call.build(torch.device("cpu"))
        tracker = PeakTracker()
        tracker.track_external(module, *(value for value in inputs.values() if isinstance(value, torch.Tensor)))
        stack.enter_context(tracker)
        counted = stack.enter_context(replayed_blocks(module, [tracker], tracker.current_total))
        getattr(module, call.method)(**inputs)
    assert counted["replayed"] >= 1 and RUN_ALWAYS not in counted
