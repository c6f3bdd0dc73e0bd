"""Random weights for a component built on the CPU (a held component, or a CPU run): no serial CPU random fill over
a million elements, yet exact shapes and dtypes, the class's own buffers, tied weights kept tied and finite,
non-degenerate activations."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from diffmeter.catalog import resolve
from diffmeter.loading import default_dtype
from diffmeter.pipelines import build_component
from diffmeter.random_weights import build_random


class RandomFills(TorchDispatchMode):
    """Every random operator (torch tags them ``nondeterministic_seeded``) run on a real tensor, with its size."""

    def __init__(self):
        super().__init__()
        self.fills: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.Tag.nondeterministic_seeded in func.tags and isinstance(out, torch.Tensor) and not out.is_meta:
            self.fills.append((str(func), out.numel()))
        return out


def test_a_real_size_component_built_on_the_cpu_draws_no_large_random_fill():
    """SD 1.5's CLIP text encoder at its real size (123M parameters, a 38M-element token embedding), built by the
    path loading takes for a component on the CPU."""
    component = resolve("sd15").components["text_encoder"]
    with RandomFills() as seen, default_dtype(torch.bfloat16):
        module = build_random(component, "cpu", seed=0)
    assert [fill for fill in seen.fills if fill[1] > 1_000_000] == []
    reference = build_component(component, "meta")
    assert {k: (v.shape, v.dtype) for k, v in module.state_dict().items()} == {
        k: (v.shape, torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in reference.state_dict().items()
    }
    assert not any(p.is_meta for p in module.parameters())
    ids = module.embeddings.position_ids  # a buffer the class computes: computed, not left empty
    assert torch.equal(ids, torch.arange(ids.shape[-1]).expand_as(ids))
    with torch.no_grad():
        hidden = module.float()(torch.randint(0, 49408, (2, 77))).last_hidden_state
    assert torch.isfinite(hidden).all() and hidden.std() > 1e-2
    assert not torch.allclose(hidden[0, 1], hidden[0, 2])  # tokens are told apart


def test_tied_weights_stay_tied_and_a_gpu_build_keeps_the_classes_own_initialisation():
    """A T5 encoder's token embedding is one tensor shared by ``shared`` and ``encoder.embed_tokens``."""
    component = resolve("tiny-flux").components["text_encoder_2"]
    module = build_random(component, "cpu")
    assert module.shared.weight is module.encoder.embed_tokens.weight
    meta = build_random(component, "meta")  # any device but the CPU: the classes' own path, unchanged
    assert all(p.is_meta for p in meta.parameters())
