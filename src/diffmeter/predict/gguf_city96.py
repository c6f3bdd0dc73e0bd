"""Each tensor's type in a GGUF file of a component as city96's tools make one, under diffusers' names: ComfyUI-GGUF's
tools/convert.py (the reference checkpoint to BF16/F16), then ``llama-quantize`` built with tools/lcpp.patch
(``img_tensor_get_type`` and the per-architecture filters of ``llama_model_quantize_internal``), as published on the
repository's ``auto_convert`` branch (commit a0a0d2e, 2025-11-27; github.com/city96/ComfyUI-GGUF). No library is
imported; shapes come from a meta build of the catalog's config.

What every file gets (convert.py ``handle_tensors``; llama.cpp b3962 ``llama_model_quantize_internal``):

* a 1-D tensor, one of at most 1024 elements (``QUANTIZATION_THRESHOLD``) or one the architecture's ``keys_hiprec``
  names: F32 from an F32 or BF16 source, kept F16 from an F16 one (convert.py:308, ``if old_dtype in (torch.float32,
  torch.bfloat16)``); a tensor of more than 4 dimensions is split off and added back in F32 (``fix_5d_tensors.py``:60);
* a tensor the architecture's filter keeps, one of 3 or 4 dimensions (``quantize &= ggml_n_dims(tensor) == 2``) or a
  parameter that is not a linear weight: the source's 16-bit type, unquantized;
* every other 2-D weight: the file's type, a type up where ``img_tensor_get_type`` raises it (attention values,
  fused q/k/v, the feed-forward's down projection, Qwen-Image's first and last blocks, FLUX.2's edge blocks), F16
  where a K-quant's rows do not split into blocks of 256 (its fallback).

The reference checkpoints name tensors otherwise (FLUX's ``double_blocks.N.img_attn.qkv``, Wan's ``blocks.N.ffn.2``,
SD3's ``joint_blocks.N.x_block.attn.qkv``): each rule below is the patch's, written for the diffusers names of the
same tensors. A reference tensor that diffusers splits (FLUX's and SD3's fused q/k/v) takes the type of the whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from diffmeter.predict import quantized_layouts as layouts

#: convert.py QUANTIZATION_THRESHOLD
THRESHOLD = 1024
#: the file types whose values ``img_tensor_get_type`` raises, per rule (lcpp.patch)
V_MIX = {"Q2_K": "Q3_K", "Q3_K_L": "Q5_K", "Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K"}
QKV_MIX = {"Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}
FFN_MIX = {
    "Q3_K_M": "Q4_K",
    "Q3_K_L": "Q5_K",
    "Q4_K_S": "Q5_K",
    "Q4_K_M": "Q6_K",
    "Q5_K_M": "Q6_K",
    "Q4_0": "Q4_1",
    "Q5_0": "Q5_1",
}
EDGE_MIX = {"Q2_K": "Q4_K", "Q3_K_S": "Q4_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}
#: the first values of a file raised further by a counter (``qs.i_attention_wv``): Q3_K_M's first 2 to Q5_K (the rest
#: Q4_K), Q4_K_S's first 4 to Q5_K
V_FIRST = {"Q3_K_M": (2, "Q5_K", "Q4_K"), "Q4_K_S": (4, "Q5_K", "Q4_K")}
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class Arch:
    """One architecture's rules as regular expressions searched in the diffusers name (None: no such rule)."""

    #: kept unquantized at the source's 16-bit type (the patch's filter)
    keep: str | None = None
    #: kept in F32 (convert.py ``keys_hiprec``; FLUX.1's files: the inputs' first layers and the final linear)
    f32: str | None = None
    #: ``img_tensor_get_type``'s rules: attention values, fused q/k/v, feed-forward down projections, edge blocks
    v: str | None = None
    qkv: str | None = None
    ffn: str | None = None
    edge: str | None = None


FLUX_QKV = r"^transformer_blocks\.\d+\.attn\.(to_[qkv]|add_[qkv]_proj)\.weight$"
ARCHS = {
    # lcpp.patch LLM_ARCH_FLUX: txt_in, img_in, time_in, vector_in, guidance_in, final_layer kept; the published
    # FLUX.1 files hold img_in, the embedders' in_layer and final_layer.linear in F32, the rest of them F16;
    # double_blocks' img_attn.qkv/txt_attn.qkv match "attn.qkv.weight"
    "FluxTransformer2DModel": Arch(
        keep=r"^(context_embedder|time_text_embed|norm_out)\.",
        f32=r"^(x_embedder|time_text_embed\.(timestep|text|guidance)_embedder\.linear_1|proj_out)\.",
        qkv=FLUX_QKV,
    ),
    # LLM_ARCH_FLUX with FLUX.2's filter (commit ec7506d): its modulations kept too. Edge blocks: city96's FLUX.2 files
    # (README: "As with Qwen-Image, Q5_K_M, Q4_K_M, Q3_K_M, Q3_K_S and Q2_K have some extra logic as to which blocks
    # to keep in high precision"; in no published lcpp.patch) raise 2 double and 6 single blocks whole to Qwen-Image's
    # EDGE_MIX types: the only block counts that give the Q3_K_S (+4420) and Q4_K_M (+3776 units of 6144^2/256 bytes)
    # files, and then Q3_K_M and Q5_K_M (+4012 each) to the byte. Which blocks is not in the sizes (every double block
    # has the same bytes, every single block too): the first and last of each stack, as Qwen-Image's rule, is a guess.
    # The Q2_K file raises 8 single-block equivalents, not 10: its branch is not known (the catalog says why)
    "Flux2Transformer2DModel": Arch(
        keep=r"^(context_embedder|x_embedder|time_guidance_embed|proj_out|norm_out|double_stream_modulation_"
        r"(img|txt)|single_stream_modulation)\.",
        qkv=FLUX_QKV,
        edge=r"^(transformer_blocks\.(0|7)|single_transformer_blocks\.(0|1|2|45|46|47))\.",
    ),
    # LLM_ARCH_QWEN_IMAGE (diffusers' names are the reference's): img_in, txt_in, time_text_embed, proj_out, norm_out
    # kept; blocks 0 and 59 raised ("this should be dynamic": Qwen-Image's 60 blocks)
    "QwenImageTransformer2DModel": Arch(
        keep=r"^(img_in|txt_in|time_text_embed|proj_out|norm_out)\.",
        v=r"\.(to_v|add_v_proj)\.weight$",
        ffn=r"\.(img|txt)_mlp\.net\.2\.weight$",
        edge=r"^transformer_blocks\.(0|59)\.",
    ),
    # LLM_ARCH_HIDREAM (the reference's names): embedders, final_layer, caption_projection and the MoE gate kept, the
    # gate in F32 (keys_hiprec); "experts." with ".w2.weight" (shared experts too) is the down projection
    "HiDreamImageTransformer2DModel": Arch(
        keep=r"^(p_embedder|t_embedder|x_embedder|final_layer|caption_projection)\.|\.ff_i\.gate\.weight$",
        f32=r"\.ff_i\.gate\.weight$",
        v=r"\.to_v\.weight$",
        ffn=r"^(?=.*experts\.).*\.w2\.weight$",  # both substrings, which may share the dot
    ),
    # LLM_ARCH_WAN: patch_embedding, text_embedding, time_embedding, time_projection, img_emb (condition_embedder) and
    # head (proj_out) kept; modulation (scale_shift_table) F32 (keys_hiprec); self_attn.v/cross_attn.v match
    # ".v.weight", ffn.2 ".ffn.2.weight"
    "WanTransformer3DModel": Arch(
        keep=r"^(condition_embedder|patch_embedding|proj_out)\.",
        f32=r"scale_shift_table$",
        v=r"\.attn[12]\.to_v\.weight$",
        ffn=r"\.ffn\.net\.2\.weight$",
    ),
    # LLM_ARCH_SD3: final_layer, time_text_embed/t_embedder/y_embedder, context_embedder, x_embedder, pos_embed kept;
    # joint_blocks' x_block/context_block attn.qkv match "attn.qkv.weight"
    "SD3Transformer2DModel": Arch(
        keep=r"^(pos_embed|time_text_embed|context_embedder|proj_out|norm_out)\.",
        qkv=FLUX_QKV,
    ),
}
#: an architecture the patch has no filter for: its name rules alone, as they read diffusers' names
OTHER = Arch(v=r"\.(to_v|add_v_proj)\.weight$", ffn=r"\.ff\.net\.2\.weight$")


@dataclass(frozen=True)
class Rules:
    """A rule set: the architectures' rules, the type a kept tensor has in the base file ``llama-quantize`` read
    (BF16/F16 from convert.py; F32 from an F32 base file, which llama.cpp copies as it is), and whether convert.py
    wrote the 1-D, small and ``keys_hiprec`` tensors F32 (an F32 or BF16 source) or left them F16 (an F16 source)."""

    archs: dict[str, Arch]
    kept: str = "F16"
    small_f32: bool = True


#: the rule sets by name: the published one (with FLUX.2's edge blocks, which city96's own files show); the same
#: tools before FLUX.2's modulation filter (the parent of commit ec7506d, 2025-11-27), whose FLUX.2 files quantize the
#: modulations and raise no edge block; files quantized from an F32 base file; files converted from an F16 checkpoint
#: (the Wan 2.2 re-upload in the catalog is that layout plus its header, to the byte)
RULES = {
    "city96": Rules(ARCHS),
    "city96-before-ec7506d": Rules(
        {
            **ARCHS,
            "Flux2Transformer2DModel": Arch(
                keep=r"^(context_embedder|x_embedder|time_guidance_embed|proj_out|norm_out)\.", qkv=FLUX_QKV
            ),
        }
    ),
    "city96-f32-base": Rules(ARCHS, kept="F32"),
    "city96-f16-source": Rules(ARCHS, small_f32=False),
}


def _matches(pattern: str | None, name: str) -> bool:
    return pattern is not None and re.search(pattern, name) is not None


def file_types(module: torch.nn.Module, kind: str, rules: str = "city96") -> dict[str, str]:
    """Each state-dict tensor's type in a ``kind`` file of ``module`` made by the ``rules`` set (module docstring); the
    16-bit type of a kept tensor is F16 (BF16 in a BF16 file: two bytes either way)."""
    arch = RULES[rules].archs.get(type(module).__name__, OTHER)
    base = layouts.gguf_base(kind)
    whole = "BF16" if kind == "BF16" else "F16"
    kept = RULES[rules].kept if RULES[rules].kept == "F32" else whole
    quantizing = kind not in ("BF16", "F16")
    linears = {f"{name}.weight" for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    values = 0
    types = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        small = tensor.dim() < 2 or tensor.numel() <= THRESHOLD or _matches(arch.f32, name)
        if tensor.dim() > 4 or (small and RULES[rules].small_f32):
            types[name] = "F32"
            continue
        if name not in linears or _matches(arch.keep, name):
            types[name] = kept
            continue
        if not quantizing:
            types[name] = whole
            continue
        chosen = base
        if _matches(arch.v, name):
            count, first, rest = V_FIRST.get(kind, (0, None, V_MIX.get(kind, base)))
            chosen = first if values < count else rest
            values += 1
        elif _matches(arch.qkv, name):
            chosen = QKV_MIX.get(kind, base)
        elif _matches(arch.ffn, name):
            chosen = FFN_MIX.get(kind, base)
        if _matches(arch.edge, name):
            chosen = EDGE_MIX.get(kind, chosen)
        types[name] = "F16" if chosen in K_QUANTS and not layouts.gguf_fits(tensor.shape[-1], chosen) else chosen
    return types


def file_bytes(module: torch.nn.Module, kind: str, rules: str = "city96") -> int:
    """The tensor data of such a file (``file_types``; its header of names and shapes, and the alignment of each
    tensor to 32 bytes, left out: kilobytes)."""
    types = file_types(module, kind, rules)
    whole = {"F32": 4, "F16": 2}
    return sum(
        tensor.numel() * whole[types[name]] if types[name] in whole else layouts.gguf_bytes(tensor.shape, types[name])
        for name, tensor in module.state_dict(keep_vars=True).items()
    )
