"""UNet2DConditionModel pipelines: Stable Diffusion 1.x/2.x and SDXL."""

from dataclasses import replace

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.catalog.entry import PipelineEntry
from diffmeter.families import binning, controlnet, lora
from diffmeter.families.base import Call, Family, Shapes, latents, register
from diffmeter.families.control_image import ControlImage
from diffmeter.pipelines import config_value


@register
class StableDiffusion(ControlImage, Family):
    name = "sd"
    denoiser = "unet"
    text_encoders = ("text_encoder",)

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.SD_UNET

    def pipeline_size(self, entry: PipelineEntry, height: int, width: int) -> tuple[int, int, str | None]:
        """The ControlNet pipelines check no multiple: ``prepare_image`` floors a size to the VAE's scale and the
        output takes the image's (pipeline_controlnet.py 1149-1160, pipeline_controlnet_sd_xl.py 1311-1322), where
        the others refuse a size off a multiple of 8."""
        if CONTROLNET in entry.components:
            return binning.rounded_size(entry, height, width, self.vae_scale(entry), "down")
        return super().pipeline_size(entry, height, width)

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

    def decoder_calls(self, shapes: Shapes) -> list[Call]:
        """SDXL's pipelines decode in float32 when the VAE is float16 and its config sets ``force_upcast``:
        ``upcast_vae`` casts the VAE and the latents to float32 for the decode, and the VAE back after it
        (diffusers 0.42.1 pipeline_stable_diffusion_xl.py:1264-1267 and 1293-1294; pipeline_controlnet_sd_xl.py:
        1565-1568 and 1589-1590)."""
        calls = super().decoder_calls(shapes)
        if shapes.spec.dtype_of(self.decoder) == "float16" and force_upcast(shapes.entry, self.decoder):
            return [replace(call, dtype="float32") for call in calls]
        return calls


def force_upcast(entry: PipelineEntry, component: str) -> bool:
    """The VAE config's ``force_upcast``, or its class's default where the config leaves it out (AutoencoderKL's:
    True)."""
    return bool(config_value(entry.components[component], "force_upcast"))
