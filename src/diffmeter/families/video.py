"""Text-to-video families: Wan 2.1 and CogVideoX."""

import math
from types import SimpleNamespace

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Family, Shapes, register, timesteps


def _latent_frames(entry, num_frames: int, temporal: int) -> int:
    """Causal video VAEs keep the first frame and compress the rest ``temporal`` times."""
    if (num_frames - 1) % temporal:
        fit = (num_frames - 1) // temporal * temporal + 1
        raise DiffmeterError(
            f"--num-frames {num_frames} does not fit {entry.name}'s {temporal}x temporal compression: "
            f"use {temporal}k+1 frames, e.g. {fit} or {fit + temporal}"
        )
    return (num_frames - 1) // temporal + 1


@register
class Wan(Family):
    name = "wan"
    flow_matching = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    cfg_mode = "separate"
    is_video = True

    def size_multiple(self, entry) -> int:
        return math.lcm(16, self.pixel_multiple(entry))  # WanPipeline.check_inputs: multiples of 16

    def vae_scale(self, entry) -> int:
        return 2 ** len(entry.components[self.decoder].config["temperal_downsample"])

    def latent_channels(self, entry) -> int:
        return entry.components[self.decoder].config["z_dim"]

    def patch(self, entry) -> int:
        return entry.components[self.denoiser].config["patch_size"][1]

    def latent_frames(self, entry, spec) -> int:
        temporal = 2 ** sum(entry.components[self.decoder].config["temperal_downsample"])
        return _latent_frames(entry, spec.num_frames, temporal)

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        return {
            "hidden_states": self._latents(shapes, batch, config["in_channels"]),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, shapes.text_tokens["text_encoder"], config["text_dim"]),
            "return_dict": False,
        }

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        return {"z": self._latents(shapes, batch, self.latent_channels(shapes.entry))}

    def _latents(self, shapes: Shapes, batch: int, channels: int) -> torch.Tensor:
        return torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)


@register
class CogVideoX(Family):
    name = "cogvideox"
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    is_video = True

    def latent_frames(self, entry, spec) -> int:
        temporal = entry.components[self.decoder].config["temporal_compression_ratio"]
        return _latent_frames(entry, spec.num_frames, temporal)

    def default_size(self, entry) -> tuple[int, int]:
        config, scale = entry.components[self.denoiser].config, self.vae_scale(entry)
        return config["sample_height"] * scale, config["sample_width"] * scale

    def default_frames(self, entry) -> int:
        return entry.components[self.denoiser].config["sample_frames"]  # CogVideoXPipeline's num_frames default

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        hidden = torch.zeros(
            batch, shapes.latent_frames, config["in_channels"], shapes.latent_height, shapes.latent_width
        )
        rotary = None
        if config.get("use_rotary_positional_embeddings"):
            # the pipeline's own RoPE helper, given just the attributes it reads
            from diffusers import CogVideoXPipeline

            pipeline = SimpleNamespace(
                vae_scale_factor_spatial=self.vae_scale(shapes.entry),
                transformer=SimpleNamespace(config=SimpleNamespace(**{"patch_size_t": None, **config})),
            )
            rotary = CogVideoXPipeline._prepare_rotary_positional_embeddings(
                pipeline, shapes.spec.height, shapes.spec.width, shapes.latent_frames, device
            )
        return {
            "hidden_states": hidden,
            "encoder_hidden_states": torch.zeros(batch, shapes.text_tokens["text_encoder"], config["text_embed_dim"]),
            "timestep": timesteps(batch, device),
            "image_rotary_emb": rotary,
            "return_dict": False,
        }

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        channels = self.latent_channels(shapes.entry)
        return {"z": torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)}
