"""The files of nunchaku's first SVDQuant layout (``rules: nunchaku-2024-blocks`` / ``nunchaku-2024-unquantized``:
mit-han-lab/svdquant-models' svdq-int4-flux.1-schnell.safetensors, Nov 2024; mit-han-lab/svdq-int4-flux.1-dev's
transformer_blocks.safetensors and unquantized_layers.safetensors, Dec 2024), predicted from a FLUX.1 transformer's
config as nunchaku's C++ engine of that time loads them, every tensor by name, shape and dtype. Lines cited are of
github.com/mit-han-lab/nunchaku at 8c3e3c0b0871d3a757fd69924627c1d0970362c6 ("Support ComfyUI; Improve model loading",
2024-12-08, the first to load the dev repo's two files; the initial release 37c494a allocates the same tensors)."""

from __future__ import annotations

import json

import torch

from diffmeter.catalog.entry import ComponentEntry
from diffmeter.predict.footprints import meta_module

#: the low-rank branch's rank: ``SVD_RANK = 32`` (nunchaku/models/transformer_flux.py:15); the loader takes the rank
#: from the file's lora_down (src/Linear.cpp:106-113), the model cards say "rank 32"
RANK = 32
#: int4 weights share a scale per 64 inputs: W4A4 ``wscales`` {in / 64, out} (src/Linear.cpp:81), AWQ
#: ``group_size(64)`` (src/Linear.cpp:8)
GROUP = 64
#: bytes per element of the safetensors dtypes these files hold, in the order safetensors writes the data (by dtype,
#: F32 first, then by name, as the installed safetensors 0.8.0 does; the tests check it): the order only changes the
#: offsets' digits in the header
DTYPE_BYTES = {"F32": 4, "I32": 4, "BF16": 2, "I8": 1}

#: the rule sets (``QuantizedFile.rules``) this module predicts
RULES = ("nunchaku-2024-blocks", "nunchaku-2024-unquantized")

Tensor = tuple[str, str, tuple[int, ...]]


def w4a4(name: str, n_in: int, n_out: int) -> list[Tensor]:
    """A ``GEMM_W4A4`` layer (src/Linear.cpp:77-99): int4 weights two to a byte, bf16 scales per group of 64 inputs,
    bias, the low-rank branch (lora_down {in, rank}, lora_up {out, rank}: Linear.cpp:85-86) and the smoothing factor
    per input; every one read by the loader, the two lora tensors optional (src/Module.h:51-58)."""
    return [
        (f"{name}.qweight", "I8", (n_out, n_in // 2)),
        (f"{name}.wscales", "BF16", (n_in // GROUP, n_out)),
        (f"{name}.bias", "BF16", (n_out,)),
        (f"{name}.lora_down", "BF16", (n_in, RANK)),
        (f"{name}.lora_up", "BF16", (n_out, RANK)),
        (f"{name}.smooth", "BF16", (n_in,)),
    ]


def awq(name: str, n_in: int, n_out: int) -> list[Tensor]:
    """A ``GEMV_AWQ`` layer, the W4A16 int4 the adaLN modulation linears use (``USE_4BIT``: src/FluxModel.h:11-12,
    33-34): int4 weights eight to an int32, bf16 scales and zeros per group of 64 (src/Linear.cpp:10-13); no
    low-rank branch (rank 0, its tensors optional: Linear.cpp:8, 24-25)."""
    groups = -(-n_in // GROUP)
    return [
        (f"{name}.qweight", "I32", (n_out // 4, -(-n_in // 8) * 4)),
        (f"{name}.wscales", "BF16", (groups, n_out)),
        (f"{name}.wzeros", "BF16", (groups, n_out)),
        (f"{name}.bias", "BF16", (n_out,)),
    ]


def rms(name: str, dim: int) -> list[Tensor]:
    """An ``RMSNorm``'s weight (src/layernorm.h:23-28); the blocks' LayerNorms have no affine part, and an invalid
    tensor is not registered (src/layernorm.cpp:7-15, src/Module.h:97-101)."""
    return [(f"{name}.weight", "BF16", (dim,))]


def block_tensors(config: dict) -> list[Tensor]:
    """transformer_blocks.safetensors: the engine's ``FluxModel`` (src/FluxModel.cpp:608-617), ``num_layers`` joint
    blocks (FluxModel.cpp:328-369: q, k, v fused into one qkv_proj per stream) and ``num_single_layers`` single
    blocks (FluxModel.cpp:260-284: diffusers' proj_out split into out_proj and mlp_fc2), MLP ratio 4
    (FluxModel.cpp:346, 614)."""
    dim, head = config["num_attention_heads"] * config["attention_head_dim"], config["attention_head_dim"]
    tensors = []
    for i in range(config["num_layers"]):
        p = f"transformer_blocks.{i}"
        tensors += awq(f"{p}.norm1.linear", dim, 6 * dim) + awq(f"{p}.norm1_context.linear", dim, 6 * dim)
        for stream in ("", "_context"):
            tensors += w4a4(f"{p}.qkv_proj{stream}", dim, 3 * dim) + w4a4(f"{p}.out_proj{stream}", dim, dim)
            tensors += w4a4(f"{p}.mlp{stream}_fc1", dim, 4 * dim) + w4a4(f"{p}.mlp{stream}_fc2", 4 * dim, dim)
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            tensors += rms(f"{p}.{norm}", head)
    for i in range(config["num_single_layers"]):
        p = f"single_transformer_blocks.{i}"
        tensors += awq(f"{p}.norm.linear", dim, 3 * dim) + w4a4(f"{p}.qkv_proj", dim, 3 * dim)
        tensors += w4a4(f"{p}.out_proj", dim, dim) + w4a4(f"{p}.mlp_fc1", dim, 4 * dim)
        tensors += w4a4(f"{p}.mlp_fc2", 4 * dim, dim) + rms(f"{p}.norm_q", head) + rms(f"{p}.norm_k", head)
    return tensors


def unquantized_tensors(component: ComponentEntry) -> list[Tensor]:
    """unquantized_layers.safetensors: the state dict of diffusers' transformer built with no blocks
    (nunchaku/models/transformer_flux.py:133-144) at bfloat16 (:201-203), which the loader loads (:204-205): the
    embedders, norm_out and proj_out."""
    config = {**component.config, "num_layers": 0, "num_single_layers": 0}
    module = meta_module(component.model_copy(update={"config": config}), torch.bfloat16)
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    return [(name, names[t.dtype], tuple(t.shape)) for name, t in module.state_dict().items()]


def safetensors_bytes(tensors: list[Tensor]) -> int:
    """A safetensors file of ``tensors``: the 8-byte header length, the JSON header (compact, padded with spaces
    to 8 bytes) and the data, as safetensors writes it with no ``__metadata__`` (one the writer may have added
    is not counted; the whole header of the FLUX.1 blocks file is 0.004% of it)."""
    dtypes = list(DTYPE_BYTES)
    header, offset = {}, 0
    for name, dtype, shape in sorted(tensors, key=lambda t: (dtypes.index(t[1]), t[0])):
        size = DTYPE_BYTES[dtype] * int(torch.Size(shape).numel())
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = len(json.dumps(header, separators=(",", ":")))
    return 8 + text + (-text) % 8 + offset


def file_bytes(component: ComponentEntry, rules: str) -> int:
    """The predicted bytes of a ``nunchaku-2024-*`` file of ``component`` (a FLUX.1 transformer)."""
    if rules == "nunchaku-2024-blocks":
        return safetensors_bytes(block_tensors(component.config))
    if rules == "nunchaku-2024-unquantized":
        return safetensors_bytes(unquantized_tensors(component))
    raise ValueError(f"{rules}: not a nunchaku 2024 rule set ({', '.join(RULES)})")
