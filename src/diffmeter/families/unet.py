"""UNet2DConditionModel pipelines: Stable Diffusion 1.x/2.x and SDXL."""

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.families import controlnet, lora
from diffmeter.families.base import Call, Family, Shapes, latents, register


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

    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """StableDiffusion(XL)ControlNetPipeline (diffusers 0.42.1): the ControlNet takes the denoiser's inputs (the
        CFG-doubled latents and embeddings) plus the control image at the output size, doubled with them
        (``prepare_image``), and hands the UNet one residual per down-block output and one for the mid block."""
        denoiser, unet = controlnet.denoiser_call(calls), shapes.config(self.denoiser)
        channels = shapes.config(CONTROLNET).get("conditioning_channels", 3)

        def build(device):
            inputs = self.denoiser_inputs(shapes, denoiser.batch, device)
            size = (shapes.spec.height, shapes.spec.width)
            return {**inputs, "controlnet_cond": torch.zeros(denoiser.batch, channels, *size), "guess_mode": False}

        def residuals(batch, device):
            return controlnet.unet_residuals(unet, batch, shapes.latent_height, shapes.latent_width)

        detail = f"runs every step at the UNet's batch ({denoiser.batch}), on the control image"
        return controlnet.steered(shapes, calls, self.denoiser, build, residuals, detail)


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
