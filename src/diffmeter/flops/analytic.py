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


@formula("hidream")
def hidream(config: dict, image: int, text: int) -> int:
    """HiDream-I1: dual-stream then single-stream blocks whose image (and, in single blocks, joint) FFN
    is a mixture of experts: a shared SwiGLU expert plus ``num_activated_experts`` routed SwiGLU experts
    per token (the unrouted ones cost nothing) and a linear gate. ``text`` is the T5 and the Llama
    length (each padded to max_sequence_length): the text stream carries T5 + the last Llama layer, and
    each block adds its own Llama layer, so it is 3 x ``text`` tokens long."""
    d = config["num_attention_heads"] * config["attention_head_dim"]

    def swiglu(hidden: int) -> int:  # HiDreamImageFeedForwardSwiGLU's hidden width (multiple_of 256)
        return 256 * -(-int(2 * hidden / 3) // 256)

    expert, shared = 3 * d * swiglu(4 * d), 3 * d * swiglu(2 * d)
    moe = config["num_routed_experts"] * d + shared + config["num_activated_experts"] * expert  # per token
    stream = 3 * text
    s = image + stream
    double = 4 * d * d * s + _attention(s, s, d) + moe * image + expert * stream + 12 * d * d
    single = 4 * d * d * s + _attention(s, s, d) + moe * s + 6 * d * d
    patch = config["patch_size"] ** 2
    t5_channels, llama_channels = config["caption_channels"]
    captions = len(config["llama_layers"]) * llama_channels * d * text + t5_channels * d * text
    embed = patch * config["in_channels"] * d * image
    conditioning = 256 * d + d * d + config["text_emb_dim"] * d + d * d
    out = 2 * d * d + d * patch * (config.get("out_channels") or config["in_channels"]) * image
    return config["num_layers"] * double + config["num_single_layers"] * single + captions + embed + conditioning + out


@formula("qwenimage21")
def qwenimage21(config: dict, image: int, text: int, cached: bool = False) -> int:
    """Qwen-Image 2.1's single-stream block-causal DiT: bias-free q/k/v/out and a SwiGLU MLP of width
    mlp_ratio * d per block; one modulation MLP shared by all blocks, evaluated for the sampled and the
    t = 0 rows (causal_condition). The prefill attends text causally (text x text) and image tokens to
    everything (image x (text + image)); a ``cached`` call (prefix KV cache) runs only the image tokens
    through the blocks and the output head, attending to the cached text, while txt_in still runs."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    hidden = config["mlp_ratio"] * d
    s = image + text
    run = image if cached else s
    blocks = config["num_layers"] * (
        (4 * d * d + 3 * d * hidden) * run + _attention(image, s, d) + (0 if cached else _attention(text, text, d))
    )
    embed = config["in_channels"] * d * image + (config["context_in_dim"] + d) * d * text  # img_in, txt_in
    rows = 2 if config.get("causal_condition", True) else 1
    conditioning = rows * (256 * d + d * d + 4 * d * d + d * d)  # timestep MLP, shared modulation, norm_out scale
    out = d * config["patch_size"] ** 2 * config["out_channels"] * run
    return blocks + embed + conditioning + out


@formula("hunyuanimage")
def hunyuanimage(config: dict, image: int, text: int, glyph: int = 128) -> int:
    """HunyuanImage 2.1: ``text`` Qwen tokens through a token refiner (self-attention blocks over the text,
    conditioned on the timestep and the mean text embedding), ``glyph`` ByT5 positions through a 3-layer
    projection (hidden 2048), then FLUX-style dual-stream and single-stream blocks over image + text + glyph
    tokens; 1x1 patches; a second timestep MLP for the guidance (guidance_embeds) and the meanflow r."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    hidden = int(d * config["mlp_ratio"])
    s = image + text + glyph
    double = (4 * d * d + 2 * d * hidden) * s + _attention(s, s, d) + 2 * 6 * d * d
    single = (4 * d * d + 2 * d * hidden) * s + _attention(s, s, d) + 3 * d * d
    refiner = (4 * d * d + 2 * d * hidden) * text + _attention(text, text, d) + 2 * d * d
    context = config["text_embed_dim"] * d * text + (256 * d + d * d) + (config["text_embed_dim"] * d + d * d)
    context += config["num_refiner_layers"] * refiner
    glyph_embed = (config["text_embed_2_dim"] * 2048 + 2048 * 2048 + 2048 * d) * glyph
    times = 1 + bool(config.get("guidance_embeds")) + bool(config.get("use_meanflow"))
    patch = config["patch_size"][0] * config["patch_size"][1]
    embed = config["in_channels"] * patch * d * image
    out = 2 * d * d + d * patch * config["out_channels"] * image
    return (
        config["num_layers"] * double
        + config["num_single_layers"] * single
        + context
        + glyph_embed
        + times * (256 * d + d * d)
        + embed
        + out
    )


@formula("ltx2")
def ltx2(config: dict, image: int, text: int, audio: int = 0, isolate_modalities: bool = False) -> int:
    """LTX-2's joint audio-video DiT (one call, batch 1): ``image`` video tokens of width d and ``audio``
    audio tokens of width a, each stream with self-attention, cross-attention to its ``text`` connector
    tokens and a 4x GELU MLP; between them audio-to-video and video-to-audio cross-attention at the audio
    width (left out when ``isolate_modalities``). Captions are projected by two-layer MLPs; six adaLN-single
    embedders (6, 4 and 1 modulation vectors per stream) map the timestep."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    a = config["audio_num_attention_heads"] * config["audio_attention_head_dim"]
    v, s = image, audio
    video = 4 * d * d * v + _attention(v, v, d) + 8 * d * d * v
    video += 2 * d * d * v + 2 * config["cross_attention_dim"] * d * text + _attention(v, text, d)
    sound = 4 * a * a * s + _attention(s, s, a) + 8 * a * a * s
    sound += 2 * a * a * s + 2 * config["audio_cross_attention_dim"] * a * text + _attention(s, text, a)
    a2v = 2 * d * a * v + 2 * a * a * s + _attention(v, s, a)  # Q video -> a, K/V audio, out a -> d
    v2a = 2 * a * a * s + 2 * d * a * v + _attention(s, v, a)  # Q audio, K/V video d -> a, out a
    block = video + sound + (0 if isolate_modalities else a2v + v2a)
    caption = config["caption_channels"]
    embed = config["in_channels"] * d * v + config["audio_in_channels"] * a * s
    embed += (caption * d + d * d) * text + (caption * a + a * a) * text
    conditioning = sum(256 * w + w * w + k * w * w for w in (d, a) for k in (6, 4, 1))
    out = d * config["out_channels"] * v + a * config["audio_out_channels"] * s
    return config["num_layers"] * block + embed + conditioning + out


@formula("hunyuanvideo15")
def hunyuanvideo15(config: dict, image: int, text: int = 1000, glyph: int = 256, vision: int = 729) -> int:
    """HunyuanVideo 1.5 (one call, batch 1): ``text`` Qwen tokens through a token refiner (self-attention
    blocks conditioned on the timestep and the mean text embedding), ``glyph`` ByT5 positions through a
    3-layer projection (hidden 2048), ``vision`` image-embedding positions (zeros for text-to-video, still
    projected), then dual-stream MMDiT blocks with joint attention over ``image`` video tokens (1x1x1
    patches) and all text tokens; no single-stream blocks, no guidance embedding."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    hidden = int(d * config["mlp_ratio"])
    s = image + text + glyph + vision
    block = (4 * d * d + 2 * d * hidden) * s + _attention(s, s, d) + 2 * 6 * d * d  # both streams; two adaLNs
    refiner = (4 * d * d + 2 * d * hidden) * text + _attention(text, text, d) + 2 * d * d
    context = config["text_embed_dim"] * d * text + (256 * d + d * d) + (config["text_embed_dim"] * d + d * d)
    context += config["num_refiner_layers"] * refiner
    glyph_embed = (config["text_embed_2_dim"] * 2048 + 2048 * 2048 + 2048 * d) * glyph
    e = config["image_embed_dim"]
    vision_embed = (e * e + e * d) * vision
    times = 256 * d + d * d
    patch = config["patch_size_t"] * config["patch_size"] ** 2
    embed = config["in_channels"] * patch * d * image
    out = 2 * d * d + d * patch * config["out_channels"] * image
    return config["num_layers"] * block + context + glyph_embed + vision_embed + times + embed + out
