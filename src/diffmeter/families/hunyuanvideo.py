"""HunyuanVideo text-to-video (HunyuanVideoPipeline, the 13B model of December 2024): a dual-stream then
single-stream DiT over 8x/4x VAE latents, guided by a Llama-3 (LLaVA) prompt in a chat template and a CLIP
pooled embedding, guidance-distilled (the scale is embedded; true CFG only with a negative prompt)."""

from __future__ import annotations

import torch

from diffmeter.families.base import TEXT_ENCODER, Call, Family, Shapes, register, timesteps
from diffmeter.families.frames import floored_frames, latent_count

#: HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE["crop_start"]: the template's tokens before the prompt, which
#: the Llama encoder reads (``max_length = max_sequence_length + crop_start``) and the pipeline then crops off
CROP_START = 95


@register
class HunyuanVideo(Family):
    name = "hunyuanvideo"
    is_video = True
    flow_matching = True
    masks_attention = True  # the joint attention gets a boolean mask past the prompt's real tokens
    text_encoders = ("text_encoder", "text_encoder_2")
    #: ``max_sequence_length`` (256) sets the Llama prompt's padded length after the crop
    sequence_encoder = "text_encoder"
    cfg_mode = "never"  # embedded guidance; true CFG only with true_cfg_scale and a negative prompt
    true_cfg = True

    def vae_scale(self, entry) -> int:
        return entry.components[self.decoder].config.get("spatial_compression_ratio", 8)

    def size_multiple(self, entry) -> int:
        return 16  # check_inputs: "`height` and `width` have to be divisible by 16"

    def default_size(self, entry) -> tuple[int, int]:
        return 720, 1280  # HunyuanVideoPipeline.__call__ defaults

    def default_frames(self, entry) -> int:
        return 129  # HunyuanVideoPipeline.__call__ default

    def latent_frames(self, entry, spec) -> int:
        # prepare_latents: (num_frames - 1) // vae_scale_factor_temporal + 1
        temporal = entry.components[self.decoder].config.get("temporal_compression_ratio", 4)
        return latent_count(spec.num_frames, temporal)

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        """Any frame count is taken, floored to the VAE's 4k+1 (``latent_frames``), without a word."""
        temporal = entry.components[self.decoder].config.get("temporal_compression_ratio", 4)
        return floored_frames(entry, num_frames, temporal)

    def text_calls(self, shapes: Shapes) -> list[Call]:
        """Llama reads the template and the prompt padded to ``max_sequence_length + crop_start`` tokens (all its
        layers run: the pipeline asks for every hidden state and keeps the third from last); CLIP reads 77."""
        calls = super().text_calls(shapes)
        prompt = shapes.text_tokens["text_encoder"]
        for index, call in enumerate(calls):
            if call.component == "text_encoder":
                length = prompt + CROP_START
                calls[index] = Call(
                    call.component,
                    TEXT_ENCODER,
                    call.batch,
                    call.count,
                    self._token_builder(call.batch, length),
                    note=f"{length} tokens ({CROP_START} template + {prompt} prompt, padded)"
                    + (", prompt + negative prompt" if call.count > 1 else ""),
                )
        return calls

    def denoiser_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        config = shapes.config(self.denoiser)
        text = shapes.text_tokens["text_encoder"]
        latents = torch.zeros(
            batch, config["in_channels"], shapes.latent_frames, shapes.latent_height, shapes.latent_width
        )
        return {
            "hidden_states": latents,
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, text, config["text_embed_dim"]),
            "encoder_attention_mask": torch.ones(batch, text),
            "pooled_projections": torch.zeros(batch, config["pooled_projection_dim"]),
            "guidance": torch.zeros(batch) if config.get("guidance_embeds", True) else None,
            "return_dict": False,
        }

    def decoder_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        """The whole latent video: AutoencoderKLHunyuanVideo decodes it frame-window by frame-window itself
        (``use_framewise_decoding``), with spatial tiles only after ``enable_tiling()``."""
        channels = self.latent_channels(shapes.entry)
        return {"z": torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)}
