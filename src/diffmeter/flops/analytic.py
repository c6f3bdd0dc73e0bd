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
