"""nunchaku's 2024 SVDQuant files (predict/svdquant_files.py) against their published sizes, the safetensors header
against the one safetensors writes, and the published rounding against other ranks and layer kinds."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import all_files
from diffmeter.predict import svdquant_files
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.quantized_files import error, predicted_bytes
from diffmeter.predict.svdquant_files import block_tensors, file_bytes, safetensors_bytes, unquantized_tensors

DTYPES = {"F32": torch.float32, "I32": torch.int32, "BF16": torch.bfloat16, "I8": torch.int8}


def svdquant_files_listed():
    return [file for file in all_files() if file.rules in svdquant_files.RULES]


def test_the_2024_files_are_predicted_inside_their_published_rounding():
    """transformer_blocks.safetensors and svdq-int4-flux.1-schnell.safetensors (6.64 GB: 6.635e9 to 6.645e9 bytes) and
    unquantized_layers.safetensors (128 MB), each modelled and predicted through the catalog's table."""
    files = svdquant_files_listed()
    assert {(file.model, file.file) for file in files} == {
        ("flux-dev", "transformer_blocks.safetensors"),
        ("flux-dev", "unquantized_layers.safetensors"),
        ("flux-schnell", "svdq-int4-flux.1-schnell.safetensors"),
    }
    for file, size in zip(files, predicted_bytes(files), strict=True):
        low, high = file.size.byte_range()
        assert file.rules_modelled and low <= size <= high and error(size, file) == 0, (file.file, size)


def test_the_header_is_the_one_safetensors_writes():
    """A FLUX-shaped transformer of one 128-wide head, one block of each kind, and tiny-flux's unquantized layers,
    written by the installed safetensors from zeros of each tensor's shape and dtype: the same bytes."""
    config = {"num_attention_heads": 1, "attention_head_dim": 128, "num_layers": 1, "num_single_layers": 1}
    small = block_tensors(config)
    assert {dtype for _, dtype, _ in small} == {"I32", "BF16", "I8"}  # the order safetensors sorts them in matters
    for tensors in (small, unquantized_tensors(resolve("tiny-flux").components["transformer"])):
        written = save({name: torch.zeros(shape, dtype=DTYPES[dtype]) for name, dtype, shape in tensors})
        assert len(written) == safetensors_bytes(tensors)


def test_the_unquantized_layers_are_the_transformer_outside_its_blocks():
    """The published parameter count of FLUX.1-dev's transformer (its index's total size) less the blocks' parameters
    of diffusers' model, at two bytes each, is the unquantized file's tensor data."""
    component = resolve("flux-dev").components["transformer"]
    module = meta_module(component, torch.bfloat16)
    blocks = sum(
        p.numel() for name, p in module.named_parameters() if name.startswith(("transformer_blocks.", "single_"))
    )
    tensors = unquantized_tensors(component)
    data = sum(2 * torch.Size(shape).numel() for _, _, shape in tensors)
    assert data == 2 * (component.published_params - blocks)
    assert {name.split(".")[0] for name, _, _ in tensors} == {
        "time_text_embed", "context_embedder", "x_embedder", "norm_out", "proj_out"
    }  # fmt: skip


@pytest.mark.parametrize("rank", [16, 64])
def test_the_published_size_tells_the_rank(monkeypatch, rank):
    """Rank 32 is the loader's; at rank 16 or 64 the blocks file would fall outside the published 6.64 GB."""
    file = next(file for file in svdquant_files_listed() if file.file == "transformer_blocks.safetensors")
    monkeypatch.setattr(svdquant_files, "RANK", rank)
    assert abs(error(file_bytes(resolve("flux-dev").components["transformer"], file.rules), file)) > 0.01


def test_the_published_size_tells_the_adaln_linears_are_int4(monkeypatch):
    """The modulation linears in AWQ int4 (FluxModel.h's USE_4BIT): kept in bfloat16 they would add 4.6 GB (+70%)."""
    file = next(file for file in svdquant_files_listed() if file.file == "transformer_blocks.safetensors")

    def bf16(name, n_in, n_out):
        return [(f"{name}.weight", "BF16", (n_out, n_in)), (f"{name}.bias", "BF16", (n_out,))]

    monkeypatch.setattr(svdquant_files, "awq", bf16)
    assert error(file_bytes(resolve("flux-dev").components["transformer"], file.rules), file) > 0.1


def test_an_unknown_rule_set_is_refused():
    with pytest.raises(ValueError, match="not a nunchaku 2024 rule set"):
        file_bytes(resolve("flux-dev").components["transformer"], "nunchaku-lite")
