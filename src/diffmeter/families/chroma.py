"""Chroma: a pruned FLUX.1-schnell MMDiT over 2x2-packed latents, T5 only, real CFG.

ChromaPipeline pads the prompt to ``max_sequence_length`` T5 tokens (512) and runs T5 with the
tokenizer's attention mask; the transformer gets a text+image attention mask that keeps the prompt
and its first padding token. Padding masks change no matmul shape, so every call runs over the full
padded length. With ``guidance_scale > 1`` the negative prompt (default "") is encoded by a second
T5 pass and the transformer runs twice per step, cond then uncond, at the prompt batch. Per-block
modulations come from one small MLP (``distilled_guidance_layer``) run over 344 "modulation index"
vectors per sample, instead of FLUX's per-block AdaLN linears.
"""

import torch

from diffmeter.families.base import Family, Shapes, register, timesteps


@register
class Chroma(Family):
    name = "chroma"
    flow_matching = True
    masks_attention = True
    #: ChromaPipeline warns and generates at the multiple of 16 just below a size it cannot take
    size_rounding = "down"
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    max_sequence_limit = 512  # ChromaPipeline.check_inputs refuses longer prompts
    default_sample_size = 128  # ChromaPipeline.default_sample_size
    cfg_mode = "separate"  # noise_pred then neg_noise_pred: two transformer calls per step

    def patch(self, entry) -> int:
        return 2  # the pipeline packs latents in 2x2 patches (the transformer's patch_size is 1)

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # ChromaPipeline: vae_scale_factor * 2

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        image_tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        text_tokens = shapes.text_tokens["text_encoder"]
        return {
            "hidden_states": torch.zeros(batch, image_tokens, config["in_channels"]),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "timestep": timesteps(batch, device),
            "img_ids": torch.zeros(image_tokens, 3),
            "txt_ids": torch.zeros(text_tokens, 3),
            # the pipeline's text mask extended with ones over the image tokens
            "attention_mask": torch.ones(batch, text_tokens + image_tokens),
            "return_dict": False,
        }
