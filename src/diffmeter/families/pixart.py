"""PixArt-alpha and PixArt-Sigma: DiT with T5 cross-attention."""

import torch

from diffmeter.families.base import Family, Shapes, latents, register, timesteps


@register
class PixArt(Family):
    name = "pixart"
    masks_attention = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    bin_tables = (
        "diffusers.pipelines.pixart_alpha.pipeline_pixart_sigma",
        {
            256: "ASPECT_RATIO_2048_BIN",
            128: "ASPECT_RATIO_1024_BIN",
            64: "ASPECT_RATIO_512_BIN",
            32: "ASPECT_RATIO_256_BIN",
        },
    )

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
