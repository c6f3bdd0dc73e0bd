"""city96's per-architecture GGUF rules (predict/gguf_city96.py), each read from ComfyUI-GGUF's tools/convert.py and
tools/lcpp.patch (auto_convert branch, a0a0d2e) and checked on a meta build of the catalog model it names: what is
kept unquantized, what is F32, and which tensors a mix raises a type."""

from __future__ import annotations

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.gguf_city96 import file_bytes, file_types


@pytest.fixture(scope="module")
def built():
    cache = {}

    def build(model: str):
        if model not in cache:
            cache[model] = meta_module(resolve(model).components["transformer"], torch.bfloat16)
        return cache[model]

    return build


def test_flux2_keeps_its_embedders_and_modulations_and_raises_the_double_blocks_qkv(built):
    module = built("flux2-dev")
    types = file_types(module, "Q4_K_M")
    kept = ["double_stream_modulation_img.linear.weight", "single_stream_modulation.linear.weight"]
    kept += ["context_embedder.weight", "x_embedder.weight", "norm_out.linear.weight", "proj_out.weight"]
    assert {types[name] for name in kept} == {"F16"}
    assert types["transformer_blocks.0.attn.to_v.weight"] == "Q5_K"  # a part of double_blocks.0.img_attn.qkv
    assert types["transformer_blocks.0.attn.add_k_proj.weight"] == "Q5_K"  # txt_attn.qkv
    assert types["single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight"] == "Q4_K"  # linear1: no rule
    before = file_types(module, "Q4_K_M", "city96-before-ec7506d")  # the filter commit ec7506d added
    assert before["single_stream_modulation.linear.weight"] == "Q4_K" and before["x_embedder.weight"] == "F16"
    assert file_bytes(module, "Q4_K_M", "city96-before-ec7506d") < file_bytes(module, "Q4_K_M")


def test_qwen_image_raises_its_first_and_last_blocks_values_and_down_projections(built):
    module = built("qwen-image")
    q2 = file_types(module, "Q2_K")
    assert (
        q2["transformer_blocks.0.attn.to_q.weight"] == q2["transformer_blocks.59.img_mlp.net.0.proj.weight"] == "Q4_K"
    )
    assert q2["transformer_blocks.1.attn.to_q.weight"] == "Q2_K"
    assert q2["transformer_blocks.1.attn.to_v.weight"] == q2["transformer_blocks.1.attn.add_v_proj.weight"] == "Q3_K"
    assert q2["img_in.weight"] == q2["txt_in.weight"] == q2["norm_out.linear.weight"] == "F16"
    assert q2["transformer_blocks.1.attn.norm_q.weight"] == "F32"  # 1-D
    q4 = file_types(module, "Q4_0")
    assert q4["transformer_blocks.5.img_mlp.net.2.weight"] == q4["transformer_blocks.5.txt_mlp.net.2.weight"] == "Q4_1"
    assert q4["transformer_blocks.5.img_mlp.net.0.proj.weight"] == "Q4_0"


def test_hidream_keeps_its_gate_in_f32_and_raises_expert_down_projections_and_the_first_four_values(built):
    types = file_types(built("hidream-i1-full"), "Q4_K_S")
    assert types["double_stream_blocks.0.block.ff_i.gate.weight"] == "F32"  # keys_hiprec
    assert types["double_stream_blocks.0.block.ff_i.experts.2.w2.weight"] == "Q5_K"
    assert types["double_stream_blocks.0.block.ff_i.shared_experts.w2.weight"] == "Q5_K"  # "experts." too
    assert types["double_stream_blocks.0.block.ff_t.w2.weight"] == "Q4_K"
    assert types["caption_projection.3.linear.weight"] == types["final_layer.linear.weight"] == "F16"
    values = [types[name] for name in types if name.endswith(".to_v.weight")]
    assert values[:4] == ["Q5_K"] * 4 and set(values[4:]) == {"Q4_K"}  # qs.i_attention_wv < 4
    assert file_types(built("hidream-i1-full"), "Q3_K_M")["double_stream_blocks.0.block.attn1.to_v_t.weight"] == "Q3_K"


def test_wan_keeps_its_embedders_and_head_at_the_base_files_type(built):
    module = built("wan21-t2v-14b")
    types = file_types(module, "Q5_0")
    assert types["blocks.3.ffn.net.2.weight"] == "Q5_1" and types["blocks.3.ffn.net.0.proj.weight"] == "Q5_0"
    assert types["blocks.3.scale_shift_table"] == types["patch_embedding.weight"] == "F32"  # hiprec; split 5-D
    assert types["condition_embedder.time_proj.weight"] == types["proj_out.weight"] == "F16"
    f32_base = file_types(module, "Q5_0", "city96-f32-base")  # the README: quants made from the FP32 base file
    assert f32_base["condition_embedder.time_proj.weight"] == f32_base["proj_out.weight"] == "F32"
    assert f32_base["blocks.3.ffn.net.2.weight"] == "Q5_1"
    q2 = file_types(module, "Q2_K")
    assert q2["blocks.0.attn1.to_v.weight"] == q2["blocks.0.attn2.to_v.weight"] == "Q3_K"


def test_sd3_keeps_its_positions_and_embedders_and_its_2432_wide_rows_take_no_k_quant(built):
    types = file_types(built("sd35-large"), "Q5_1")
    assert types["pos_embed.pos_embed"] == types["pos_embed.proj.weight"] == types["context_embedder.weight"] == "F16"
    assert types["transformer_blocks.2.attn.to_k.weight"] == types["transformer_blocks.2.ff.net.2.weight"] == "Q5_1"
    assert file_types(built("sd35-large"), "Q4_K_M")["transformer_blocks.2.attn.to_k.weight"] == "F16"  # 2432 % 256


def test_a_k_quant_falls_back_to_f16_where_rows_do_not_split_into_256():
    """lcpp.patch's fallback for K-quants only: tiny-flux's 32-wide rows take Q4_0's blocks of 32, no Q4_K."""
    tiny = meta_module(resolve("tiny-flux").components["transformer"], torch.bfloat16)
    assert file_types(tiny, "Q4_K_S")["transformer_blocks.0.ff.net.0.proj.weight"] == "F16"
    assert file_types(tiny, "Q4_0")["transformer_blocks.0.ff.net.0.proj.weight"] == "Q4_0"
    assert file_types(tiny, "Q4_0")["transformer_blocks.0.attn.to_q.weight"] == "F32"  # 1024 weights: convert.py's F32
