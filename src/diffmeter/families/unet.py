"""UNet2DConditionModel pipelines: Stable Diffusion 1.x/2.x and SDXL."""

import torch

from diffmeter.families import lora
from diffmeter.families.base import Family, Shapes, latents, register


@register
class StableDiffusion(Family):
    name = "sd"
    denoiser = "unet"
    text_encoders = ("text_encoder",)

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.SD_UNET

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        return {
            "sample": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": torch.zeros((), device=device),
            "encoder_hidden_states": torch.zeros(
                batch, shapes.text_tokens["text_encoder"], config["cross_attention_dim"]
            ),
            "return_dict": False,
        }


@register
class StableDiffusionXL(StableDiffusion):
    name = "sdxl"
    text_encoders = ("text_encoder", "text_encoder_2")

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.ATTENTION_PROJECTIONS  # train_dreambooth_lora_sdxl.py 1225-1232

    #: SDXL's force_zeros_for_empty_prompt: with no negative prompt, uncond embeddings are zeros
    encodes_negative = False

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        inputs = super().denoiser_inputs(shapes, batch, device)
        pooled = shapes.config("text_encoder_2")["projection_dim"]
        inputs["added_cond_kwargs"] = {"text_embeds": torch.zeros(batch, pooled), "time_ids": torch.zeros(batch, 6)}
        return inputs
