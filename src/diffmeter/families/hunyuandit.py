"""HunyuanDiT: DiT over a bilingual CLIP (BERT) and mT5, with 2D RoPE."""

import math

import torch

from diffmeter.families.base import Family, Shapes, latents, register, timesteps


@register
class HunyuanDiT(Family):
    name = "hunyuandit"
    text_encoders = ("text_encoder", "text_encoder_2")
    #: HunyuanDiTPipeline first rounds each side down to a multiple of 16, then bins, and
    #: returns the image at the binned size
    size_rounding = "down"
    restores_binned_size = False

    def size_multiple(self, entry) -> int:
        return math.lcm(16, self.pixel_multiple(entry))

    def binned_size(self, entry, height, width):
        from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import SUPPORTED_SHAPE, map_to_standard_shapes

        height, width = height // 16 * 16, width // 16 * 16
        if (height, width) in SUPPORTED_SHAPE:
            return height, width
        width, height = map_to_standard_shapes(width, height)
        return int(height), int(width)

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        from diffusers.models.embeddings import get_2d_rotary_pos_embed
        from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

        config = shapes.config(self.denoiser)
        patch = config["patch_size"]
        grid = (shapes.latent_height // patch, shapes.latent_width // patch)
        crops = get_resize_crop_region_for_grid(grid, 512 // 8 // patch)
        rotary = get_2d_rotary_pos_embed(config["attention_head_dim"], crops, grid, device=device, output_type="pt")
        clip_tokens, t5_tokens = shapes.text_tokens["text_encoder"], shapes.text_tokens["text_encoder_2"]
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, clip_tokens, config["cross_attention_dim"]),
            "text_embedding_mask": torch.ones(batch, clip_tokens),
            "encoder_hidden_states_t5": torch.zeros(batch, t5_tokens, config["cross_attention_dim_t5"]),
            "text_embedding_mask_t5": torch.ones(batch, t5_tokens),
            "image_meta_size": torch.zeros(batch, 6),
            "style": torch.zeros(batch, dtype=torch.long),
            "image_rotary_emb": rotary,
            "return_dict": False,
        }
