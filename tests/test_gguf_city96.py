"""city96's per-architecture GGUF rules (predict/gguf_city96.py), each read from ComfyUI-GGUF's tools/convert.py and
tools/lcpp.patch (auto_convert branch, a0a0d2e) and checked on a meta build of the catalog model it names: what is
kept unquantized, what is F32, and which tensors a mix raises a type."""

from __future__ import annotations

import re

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import files_of
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
    assert types["single_transformer_blocks.10.attn.to_qkv_mlp_proj.weight"] == "Q4_K"  # linear1: no rule
    before = file_types(module, "Q4_K_M", "city96-before-ec7506d")  # the filter commit ec7506d added
    assert before["single_stream_modulation.linear.weight"] == "Q4_K" and before["x_embedder.weight"] == "F16"
    assert file_bytes(module, "Q4_K_M", "city96-before-ec7506d") < file_bytes(module, "Q4_K_M")


def test_flux2_raises_two_double_and_six_single_blocks_whole_in_the_readmes_k_mixes(built):
    module = built("flux2-dev")
    q3s = file_types(module, "Q3_K_S")  # Q3_K everywhere else: no name rule raises a FLUX.2 tensor in Q3_K_S
    blocks = {re.match(r"(single_)?transformer_blocks\.\d+", n).group(0) for n, t in q3s.items() if t == "Q4_K"}
    assert sum(b.startswith("transformer_blocks") for b in blocks) == 2 and len(blocks) == 8
    assert all(t == "Q4_K" for n, t in q3s.items() if n.startswith(tuple(f"{b}." for b in blocks)) and t != "F32")
    q3m = file_types(module, "Q3_K_M")
    assert q3m["transformer_blocks.0.ff.linear_out.weight"] == q3m["transformer_blocks.0.attn.to_v.weight"] == "Q4_K"
    assert (
        q3m["transformer_blocks.3.ff.linear_out.weight"] == "Q3_K"
        and q3m["transformer_blocks.3.attn.to_v.weight"] == "Q4_K"
    )
    assert file_types(module, "Q5_K_M")["single_transformer_blocks.47.attn.to_out.weight"] == "Q6_K"
    for kind in ("Q4_K_S", "Q5_K_S"):  # not in the README's list: no block raised
        assert file_types(module, kind)["transformer_blocks.0.ff.linear_out.weight"] == kind[:2] + "_K"
    assert file_types(module, "Q4_K_M", "city96-before-ec7506d")["transformer_blocks.0.ff.linear_out.weight"] == "Q4_K"


def header_bytes(arch: str, tensors: list[tuple[str, int]]) -> int:
    """A GGUF v3 file's header as llama-quantize (and fix_5d_tensors.py) write it: 24 bytes, the three keys
    general.architecture, general.quantization_version and general.file_type, then each tensor's name (as the
    reference checkpoint keys it), dims, type and offset; padded to 32 bytes."""
    keys = (8 + 20 + 4 + 8 + len(arch)) + (8 + 28 + 4 + 4) + (8 + 17 + 4 + 4)
    infos = sum(8 + len(name) + 4 + 8 * dims + 4 + 8 for name, dims in tensors)
    return -(-(24 + keys + infos) // 32) * 32


def flux2_reference_tensors() -> list[tuple[str, int]]:
    """FLUX.2-dev's 299 tensors under BFL's keys, with their dims."""
    names = ["img_in", "txt_in", "final_layer.linear", "final_layer.adaLN_modulation.1"]
    names += [f"{e}_in.{layer}" for e in ("time", "guidance") for layer in ("in_layer", "out_layer")]
    names += ["double_stream_modulation_img.lin", "double_stream_modulation_txt.lin", "single_stream_modulation.lin"]
    tensors = [(f"{name}.weight", 2) for name in names]
    for i, s in [(i, s) for i in range(8) for s in ("img", "txt")]:
        tensors += [(f"double_blocks.{i}.{s}_{part}.weight", 2) for part in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")]
        tensors += [(f"double_blocks.{i}.{s}_attn.norm.{n}_norm.scale", 1) for n in ("query", "key")]
    for i in range(48):
        tensors += [(f"single_blocks.{i}.linear{n}.weight", 2) for n in (1, 2)]
        tensors += [(f"single_blocks.{i}.norm.{n}_norm.scale", 1) for n in ("query", "key")]
    return tensors


def wan_reference_tensors(layers: int) -> list[tuple[str, int]]:
    """A Wan 14B transformer's tensors under Wan-AI's keys, with their dims in the file (the modulations 3, lcpp.patch's
    shape fix; patch_embedding's 5, added back by fix_5d_tensors.py)."""
    tensors = [("patch_embedding.weight", 5), ("patch_embedding.bias", 1), ("head.modulation", 3)]
    for name in ("text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2", "time_projection.1"):
        tensors += [(f"{name}.weight", 2), (f"{name}.bias", 1)]
    tensors += [("head.head.weight", 2), ("head.head.bias", 1)]
    for i in range(layers):
        for attn in ("self_attn", "cross_attn"):
            tensors += [
                (f"blocks.{i}.{attn}.{x}.{p}", 2 if p == "weight" else 1) for x in "qkvo" for p in ("weight", "bias")
            ]
            tensors += [(f"blocks.{i}.{attn}.norm_{x}.weight", 1) for x in "qk"]
        tensors += [(f"blocks.{i}.ffn.{x}.{p}", 2 if p == "weight" else 1) for x in (0, 2) for p in ("weight", "bias")]
        tensors += [(f"blocks.{i}.norm3.weight", 1), (f"blocks.{i}.norm3.bias", 1), (f"blocks.{i}.modulation", 3)]
    return tensors


def test_city96s_flux2_files_are_their_tensors_and_header_to_the_byte_but_q2_k(built):
    """Every listed city96 FLUX.2 file but Q2_K (whose edge blocks the sizes do not fix): the published bytes are the
    predicted tensor data plus the header; the K-mix files (Q3_K_S, Q3_K_M, Q4_K_M, Q5_K_M) only with edge blocks."""
    module = built("flux2-dev")
    files = [f for f in files_of("flux2-dev") if f.repo == "city96/FLUX.2-dev-gguf"]
    exact = [f for f in files if f.quant_type != "Q2_K"]
    assert {f.quant_type for f in exact} >= {"Q3_K_S", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q4_K_S", "Q4_0"}
    header = header_bytes("flux", flux2_reference_tensors())
    assert {f.quant_type: f.size.value - file_bytes(module, f.quant_type) for f in exact} == dict.fromkeys(
        (f.quant_type for f in exact), header
    )
    q2 = next(f for f in files if f.quant_type == "Q2_K")
    assert not q2.rules_modelled and file_bytes(module, "Q2_K") + header > q2.size.value


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


def test_wan_from_an_f16_checkpoint_keeps_its_norms_and_modulations_f16_and_the_published_file_is_that(built):
    """convert.py writes 1-D, small and keys_hiprec tensors F32 only from an F32 or BF16 source: UmeAiRT's re-upload
    of a Wan 2.2 Q3_K_S file is the F16-source layout plus its header, to the byte; the BF16 layout is 9.8 MB more."""
    module = meta_module(resolve("wan22-t2v-a14b").components["transformer_2"], torch.bfloat16)
    types = file_types(module, "Q3_K_S", "city96-f16-source")
    assert types["blocks.0.norm2.weight"] == types["blocks.0.scale_shift_table"] == types["proj_out.bias"] == "F16"
    assert types["patch_embedding.weight"] == "F32"  # 5-D: fix_5d_tensors.py adds it back F32
    assert types["blocks.0.ffn.net.2.weight"] == types["blocks.0.attn1.to_v.weight"] == "Q3_K"
    assert file_types(module, "Q3_K_S")["blocks.0.scale_shift_table"] == "F32"
    (file,) = [f for f in files_of("wan22-t2v-a14b") if f.format == "gguf" and f.quant_type == "Q3_K_S"]
    header = header_bytes("wan", wan_reference_tensors(40))
    assert file.rules == "city96-f16-source" and file_bytes(module, "Q3_K_S", file.rules) + header == file.size.value
    assert file_bytes(module, "Q3_K_S") + header > file.size.value


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
