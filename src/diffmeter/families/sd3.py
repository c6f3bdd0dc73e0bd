"""Stable Diffusion 3 / 3.5: MMDiT over CLIP-L + CLIP-G (77 tokens each) and T5 tokens."""

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.families import controlnet, lora
from diffmeter.families.base import Call, Family, Shapes, latents, register, timesteps
from diffmeter.families.control_image import ControlImage


@register
class StableDiffusion3(ControlImage, Family):
    name = "sd3"
    max_sequence_limit = 512  # the pipeline's check_inputs refuses longer prompts
    flow_matching = True
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3")
    sequence_encoder = "text_encoder_3"

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.SD3

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # StableDiffusion3Pipeline: vae_scale_factor * patch_size

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        # the pipeline concatenates the 77 CLIP tokens with the T5 tokens (zeros if T5 is absent)
        text_tokens = shapes.text_tokens["text_encoder"] + shapes.text_tokens["text_encoder_3"]
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "pooled_projections": torch.zeros(batch, config["pooled_projection_dim"]),
            "return_dict": False,
        }

    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """StableDiffusion3ControlNetPipeline (diffusers 0.42.1, pipeline_stable_diffusion_3_controlnet.py 1063-1077
        and 1139-1196): the control image, doubled with the CFG batch (``prepare_image``), VAE-encoded once per call;
        the ControlNet takes the transformer's inputs (no text where it has no ``joint_attention_dim``: SD3.5's own)
        and the control latents, and hands the transformer one sample per ControlNet block."""
        config, denoiser = shapes.config(CONTROLNET), controlnet.denoiser_call(calls)
        size, channels = (shapes.spec.height, shapes.spec.width), self.latent_channels(shapes.entry)
        tokens = (shapes.latent_height // self.patch(shapes.entry)) * (shapes.latent_width // self.patch(shapes.entry))

        def build(device):
            inputs = self.denoiser_inputs(shapes, denoiser.batch, device)
            if config.get("joint_attention_dim") is None:  # pipeline: controlnet_encoder_hidden_states = None
                inputs["encoder_hidden_states"] = None
            latent = (shapes.latent_height, shapes.latent_width)
            return {**inputs, "controlnet_cond": latents(denoiser.batch, channels, *latent, device)}

        width = config["num_attention_heads"] * config["attention_head_dim"]

        def residuals(batch, device):
            return {"block_controlnet_hidden_states": [torch.zeros(batch, tokens, width)] * config["num_layers"]}

        encode = controlnet.control_image_encoding(self.decoder, denoiser.batch, size, "once per output and CFG half")
        detail = f"runs every step at the transformer's batch ({denoiser.batch})"
        return controlnet.steered(shapes, calls, self.denoiser, build, residuals, detail, encode=encode)
