"""PixArt-alpha and PixArt-Sigma: DiT with T5 cross-attention."""

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Family, Shapes, aspect_ratio_bin, latents, register, timesteps

#: transformer sample_size -> the bin table PixArt pipelines use (name in diffusers)
_BINS = {
    256: "ASPECT_RATIO_2048_BIN",
    128: "ASPECT_RATIO_1024_BIN",
    64: "ASPECT_RATIO_512_BIN",
    32: "ASPECT_RATIO_256_BIN",
}


@register
class PixArt(Family):
    name = "pixart"
    text_encoders = ("text_encoder",)

    def binned_size(self, entry, height, width):
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_sigma

        sample_size = entry.components[self.denoiser].config["sample_size"]
        if sample_size not in _BINS:
            raise DiffmeterError(
                f"{entry.name}: no resolution bins for sample_size {sample_size}; pass --no-resolution-binning"
            )
        return aspect_ratio_bin(height, width, getattr(pipeline_pixart_sigma, _BINS[sample_size]))

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        tokens = shapes.text_tokens["text_encoder"]
        # PixArt-alpha 1024px (sample_size 128) takes resolution and aspect-ratio conditions
        extra = config.get("use_additional_conditions")
        if extra is None:
            extra = config["sample_size"] == 128
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "encoder_hidden_states": torch.zeros(batch, tokens, config["caption_channels"]),
            "encoder_attention_mask": torch.ones(batch, tokens),
            "timestep": timesteps(batch, device),
            "added_cond_kwargs": {
                "resolution": torch.zeros(batch, 2) if extra else None,
                "aspect_ratio": torch.zeros(batch, 1) if extra else None,
            },
            "return_dict": False,
        }
