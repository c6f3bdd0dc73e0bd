"""Closed-form MACs of one transformer denoiser call (batch 1), from the config alone.

An independent cross-check of the operator-level counter, written from the papers'
block diagrams rather than from diffusers' code. Small terms (timestep MLPs, norms)
are included where cheap to state; the tests require agreement within 1%.
"""

from __future__ import annotations

from collections.abc import Callable

#: family -> formula(config, image tokens, text tokens) -> MACs
FORMULAS: dict[str, Callable[[dict, int, int], int]] = {}


def formula(family: str):
    def register(function):
        FORMULAS[family] = function
        return function

    return register


def _attention(queries: int, keys: int, dim: int) -> int:
    """Q K^T and softmax(.) V."""
    return 2 * queries * keys * dim


@formula("flux")
@formula("flux_kontext")
def flux(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    s = image + text
    double = 12 * d * d * s + _attention(s, s, d) + 2 * 6 * d * d  # qkv, out, 4x MLP per stream; adaLN
    single = 12 * d * d * s + _attention(s, s, d) + 3 * d * d  # fused qkv+MLP in, (d+4d)->d out; adaLN
    embed = config["in_channels"] * d * image + config["joint_attention_dim"] * d * text
    conditioning = (256 * d + d * d) * (2 if config.get("guidance_embeds") else 1)
    conditioning += config["pooled_projection_dim"] * d + d * d
    out = 2 * d * d + d * config["in_channels"] * image
    return config["num_layers"] * double + config["num_single_layers"] * single + embed + conditioning + out


@formula("sd3")
def sd3(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    s = image + text
    block = 12 * d * d * s + _attention(s, s, d) + 2 * 6 * d * d
    last = 12 * d * d * image + 4 * d * d * text + _attention(s, s, d) + 6 * d * d + 2 * d * d  # context_pre_only
    dual = len(config.get("dual_attention_layers") or ())
    second_attention = dual * (4 * d * d * image + _attention(image, image, d) + 3 * d * d)
    patch = config["patch_size"] ** 2
    embed = config["in_channels"] * patch * d * image + config["joint_attention_dim"] * d * text
    conditioning = 256 * d + d * d + config["pooled_projection_dim"] * d + d * d
    out = 2 * d * d + d * patch * config["out_channels"] * image
    return (config["num_layers"] - 1) * block + last + second_attention + embed + conditioning + out


@formula("pixart")
def pixart(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    self_attention = 4 * d * d * image + _attention(image, image, d)
    cross_attention = 2 * d * d * image + 2 * d * d * text + _attention(image, text, d)
    block = self_attention + cross_attention + 8 * d * d * image
    patch = config["patch_size"] ** 2
    embed = config["in_channels"] * patch * d * image + config["caption_channels"] * d * text + d * d * text
    conditioning = 256 * d + d * d + 6 * d * d
    out = d * patch * config["out_channels"] * image
    return config["num_layers"] * block + embed + conditioning + out


@formula("dit")
def dit(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    block = 12 * d * d * image + _attention(image, image, d) + 256 * d + d * d + 6 * d * d
    patch = config["patch_size"] ** 2
    out = 256 * d + d * d + 2 * d * d + d * patch * config["out_channels"] * image
    return config["num_layers"] * block + config["in_channels"] * patch * d * image + out


@formula("wan")
def wan(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    self_attention = 4 * d * d * image + _attention(image, image, d)
    cross_attention = 2 * d * d * image + 2 * d * d * text + _attention(image, text, d)
    block = self_attention + cross_attention + 2 * d * config["ffn_dim"] * image
    patch = config["patch_size"][0] * config["patch_size"][1] * config["patch_size"][2]
    embed = config["in_channels"] * patch * d * image + config["text_dim"] * d * text + d * d * text
    conditioning = config["freq_dim"] * d + d * d + 6 * d * d
    out = d * patch * config["out_channels"] * image
    return config["num_layers"] * block + embed + conditioning + out


@formula("cogvideox")
def cogvideox(config: dict, image: int, text: int) -> int:
    d = config["num_attention_heads"] * config["attention_head_dim"]
    s = image + text
    time = config["time_embed_dim"]
    block = 12 * d * d * s + _attention(s, s, d) + 2 * time * 6 * d  # joint attention, 4x MLP; two adaLN
    patch = config["patch_size"] ** 2
    embed = config["in_channels"] * patch * d * image + config["text_embed_dim"] * d * text
    conditioning = d * time + time * time + time * 2 * d
    out = d * patch * config["out_channels"] * image
    return config["num_layers"] * block + embed + conditioning + out


@formula("hunyuandit")
def hunyuandit(config: dict, image: int, text: int) -> int:
    d, layers = config["hidden_size"], config["num_layers"]
    clip, t5 = config["text_len"], config["text_len_t5"]
    width, width_t5 = config["cross_attention_dim"], config["cross_attention_dim_t5"]
    tokens = clip + t5
    self_attention = 4 * d * d * image + _attention(image, image, d)
    cross_attention = 2 * d * d * image + 2 * width * d * tokens + _attention(image, tokens, d)
    mlp = 2 * d * int(d * config["mlp_ratio"]) * image
    blocks = layers * (self_attention + cross_attention + mlp + d * d) + (layers // 2) * 2 * d * d * image  # skips
    patch = config["patch_size"] ** 2
    text_projection = width_t5 * 4 * width * t5 + 4 * width * width * t5
    pooler = 2 * width * width * (t5 + 1) + 2 * width * width + width * config["pooled_projection_dim"]
    embed = config["in_channels"] * patch * d * image + text_projection + pooler
    out = 2 * d * d + d * patch * config["in_channels"] * (2 if config["learn_sigma"] else 1) * image
    return blocks + embed + out


@formula("lumina2")
def lumina2(config: dict, image: int, text: int, padded_text: int | None = None) -> int:
    """``text``: the caption's real tokens (the joint layers); ``padded_text``: the padded
    length the caption embedder and context refiner run over (default: ``text``)."""
    padded = padded_text or text
    d, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_kv_heads"]
    kv = kv_heads * d // heads  # grouped-query attention: fewer key/value heads
    inner = int(4 * d * (config.get("ffn_dim_multiplier") or 1))
    inner = config["multiple_of"] * -(-inner // config["multiple_of"])  # SwiGLU width, rounded up
    condition = min(d, 1024)

    def layer(tokens: int, modulated: bool) -> int:
        projections = (2 * d * d + 2 * d * kv) * tokens
        return projections + _attention(tokens, tokens, d) + 3 * d * inner * tokens + modulated * 4 * d * condition

    s = image + text
    refiners = config["num_refiner_layers"] * (layer(image, True) + layer(padded, False))
    patch = config["patch_size"] ** 2
    embed = patch * config["in_channels"] * d * image + config["cap_feat_dim"] * d * padded
    conditioning = 256 * condition + condition * condition
    out = condition * d + d * patch * (config["out_channels"] or config["in_channels"]) * image
    return config["num_layers"] * layer(s, True) + refiners + embed + conditioning + out


@formula("ltx")
def ltx(config: dict, image: int, text: int) -> int:
    """LTX-Video: self-attention over the video tokens, cross-attention to the T5 caption, a 4x GELU MLP;
    the caption is projected by a two-layer MLP and the timestep by adaLN-single (6 modulation vectors)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    cross = config["cross_attention_dim"]
    self_attention = 4 * d * d * image + _attention(image, image, d)
    cross_attention = 2 * d * d * image + 2 * cross * d * text + _attention(image, text, d)
    block = self_attention + cross_attention + 8 * d * d * image
    embed = config["in_channels"] * d * image + config["caption_channels"] * d * text + d * d * text
    conditioning = 256 * d + d * d + 6 * d * d
    out = d * config["out_channels"] * image
    return config["num_layers"] * block + embed + conditioning + out


@formula("cogview4")
def cogview4(config: dict, image: int, text: int) -> int:
    """CogView4: one set of block weights over the joint [text, image] sequence (full attention, 4x GELU
    MLP), adaLN-zero with 12 modulation vectors from the time embedding; the timestep and the three
    SDXL-style size conditions (sincos, 2 x condition_dim each) are embedded by two-layer MLPs."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    e = config["time_embed_dim"]
    s = image + text
    block = 12 * d * d * s + _attention(s, s, d) + e * 12 * d
    patch = config["patch_size"] ** 2
    embed = config["in_channels"] * patch * d * image + config["text_embed_dim"] * d * text
    conditioning = d * e + e * e + 6 * config["condition_dim"] * e + e * e
    out = e * 2 * d + d * patch * config["out_channels"] * image
    return config["num_layers"] * block + embed + conditioning + out


@formula("qwenimage")
def qwenimage(config: dict, image: int, text: int) -> int:
    """Qwen-Image's MMDiT: dual-stream blocks only (per stream qkv, out and a 4x MLP; joint attention),
    no pooled text; image tokens are 2x2-packed latents."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    s = image + text
    block = 12 * d * d * s + _attention(s, s, d) + 2 * 6 * d * d  # img_mod and txt_mod: d -> 6d each
    embed = config["in_channels"] * d * image + config["joint_attention_dim"] * d * text
    conditioning = 256 * d + d * d  # timestep MLP
    out = 2 * d * d + d * config["patch_size"] ** 2 * config["out_channels"] * image  # norm_out, proj_out
    return config["num_layers"] * block + embed + conditioning + out


@formula("z_image")
def z_image(config: dict, image: int, text: int) -> int:
    """Z-Image's single-stream S3-DiT: ``image`` and ``text`` are real token counts, each padded to a
    multiple of 32 as the model pads them; two refiner stacks (image tokens with adaLN, caption tokens
    without) run before the joint layers; SwiGLU FFN of width 8d/3; adaLN from a 256-wide timestep."""
    d = config["dim"]
    image, text = -(-image // 32) * 32, -(-text // 32) * 32
    hidden = int(d / 3 * 8)
    condition = min(d, 256)

    def layer(tokens: int, modulated: bool) -> int:
        projections = 4 * d * d * tokens + 3 * d * hidden * tokens  # q, k, v, out; SwiGLU w1, w3, w2
        return projections + _attention(tokens, tokens, d) + modulated * 4 * d * condition

    s = image + text
    patch = config["all_patch_size"][0] ** 2 * config["all_f_patch_size"][0]
    refiners = config["n_refiner_layers"] * (layer(image, True) + layer(text, False))
    embed = patch * config["in_channels"] * d * image + config["cap_feat_dim"] * d * text
    conditioning = 256 * 1024 + 1024 * condition  # timestep MLP: 256 -> 1024 -> min(d, 256)
    out = condition * d + d * patch * config["in_channels"] * s
    return config["n_layers"] * layer(s, True) + refiners + embed + conditioning + out


@formula("flux2")
@formula("flux2_klein")
def flux2(config: dict, image: int, text: int) -> int:
    """FLUX.2: bias-free MMDiT, SwiGLU MLPs (ratio 3), modulation shared by all blocks (computed once)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    m = int(d * config.get("mlp_ratio", 3.0))
    s = image + text
    double = (4 * d * d + 3 * d * m) * s + _attention(s, s, d)  # per stream: qkv + out, SwiGLU d->2m, m->d
    single = (3 * d * d + 2 * d * m + (d + m) * d) * s + _attention(s, s, d)  # fused qkv+MLP in; (d+m)->d out
    embed = config["in_channels"] * d * image + config["joint_attention_dim"] * d * text
    channels = config.get("timestep_guidance_channels", 256)
    conditioning = (channels * d + d * d) * (2 if config.get("guidance_embeds", True) else 1)
    modulation = (6 + 6 + 3) * d * d  # double img, double txt, single: 3 x (shift, scale, gate) sets
    out = 2 * d * d + d * (config.get("out_channels") or config["in_channels"]) * image
    return (
        config["num_layers"] * double + config["num_single_layers"] * single + embed + conditioning + modulation + out
    )


@formula("wan_expand_timesteps")
def wan_expand_timesteps(config: dict, image: int, text: int) -> int:
    """Wan 2.2 TI2V-5B (WanPipeline expand_timesteps): one timestep per video token, so the time
    embedding MLP (freq_dim -> d -> d) and its 6-way modulation projection run on every token."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    per_token = config["freq_dim"] * d + d * d + 6 * d * d
    return wan(config, image, text) + (image - 1) * per_token


@formula("chroma")
def chroma(config: dict, image: int, text: int) -> int:
    """Chroma: FLUX.1's double/single blocks without per-block AdaLN linears or pooled/guidance
    embedders; one approximator MLP makes every block's modulation vectors (3 per single block,
    12 per double block, 2 for the output norm), each from a ``approximator_num_channels`` input."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    s = image + text
    double = 12 * d * d * s + _attention(s, s, d)  # qkv + out per stream (4d^2), 4x MLP per stream (8d^2)
    single = 12 * d * d * s + _attention(s, s, d)  # fused qkv+MLP in (7d^2), (d+4d)->d out (5d^2)
    rows = 3 * config["num_single_layers"] + 12 * config["num_layers"] + 2
    hidden = config["approximator_hidden_dim"]
    approximator = rows * (
        config["approximator_num_channels"] * hidden + 2 * hidden * hidden * config["approximator_layers"] + hidden * d
    )
    embed = config["in_channels"] * d * image + config["joint_attention_dim"] * d * text
    out = d * (config.get("out_channels") or config["in_channels"]) * image
    return config["num_layers"] * double + config["num_single_layers"] * single + approximator + embed + out
