"""LTX-Video (LTXPipeline, LTXConditionPipeline): a DiT over 32x/8x video latents packed into tokens, one T5 prompt
padded to ``max_sequence_length``, batched CFG, and a VAE whose decoder may be conditioned on a decode timestep.
With ``--image-size`` the same checkpoint animates an image: LTXImageToVideoPipeline (for LTXPipeline's
checkpoints) or LTXConditionPipeline's ``image`` at frame 0."""

import math

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Call, Family, Shapes, register, timesteps
from diffmeter.families.frames import floored_frames, latent_count
from diffmeter.families.images import ImageConditioned, single_image, size_kept, vae_encode_calls
from diffmeter.spec import size_text

#: ``frame_rate`` default of both pipelines' ``__call__``; it scales RoPE coordinates, never a shape
FRAME_RATE = 25


def spatial_compression(vae: dict) -> int:
    """``AutoencoderKLLTXVideo.spatial_compression_ratio``: the config's value, else the patch times one
    2x per scaling block."""
    return vae.get("spatial_compression_ratio") or vae.get("patch_size", 4) * 2 ** sum(
        vae.get("spatio_temporal_scaling", (True, True, True, False))
    )


def temporal_compression(vae: dict) -> int:
    """``AutoencoderKLLTXVideo.temporal_compression_ratio``, computed the same way."""
    return vae.get("temporal_compression_ratio") or vae.get("patch_size_t", 1) * 2 ** sum(
        vae.get("spatio_temporal_scaling", (True, True, True, False))
    )


@register
class LTXVideo(ImageConditioned, Family):
    name = "ltx"
    #: the first frame (LTXImageToVideoPipeline; LTXConditionPipeline's ``image`` at ``frame_index`` 0)
    max_images = 1
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    is_video = True
    flow_matching = True
    #: the cross-attention gets the T5 padding mask as an additive bias
    masks_attention = True

    def vae_scale(self, entry) -> int:
        return spatial_compression(entry.components[self.decoder].config)

    def latent_channels(self, entry) -> int:
        return entry.components[self.decoder].config.get("latent_channels", 128)

    def size_multiple(self, entry) -> int:
        return math.lcm(32, self.pixel_multiple(entry))  # check_inputs: multiples of 32, whatever the VAE

    def default_size(self, entry) -> tuple[int, int]:
        return 512, 704  # LTXPipeline/LTXConditionPipeline.__call__ defaults

    def default_frames(self, entry) -> int:
        return 161  # both pipelines' __call__ default

    def latent_frames(self, entry, spec) -> int:
        return latent_count(spec.num_frames, temporal_compression(entry.components[self.decoder].config))

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        """The LTX pipelines take any frame count as ``(num_frames - 1) // 8 + 1`` latent frames."""
        return floored_frames(entry, num_frames, temporal_compression(entry.components[self.decoder].config))

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        if entry.pipeline_class == "LTXConditionPipeline" and not shapes.images:
            shapes.note(
                "LTXConditionPipeline counted as text-to-video: no image or video conditions (each would add a VAE "
                "encode and, past frame 0, conditioning tokens)"
            )
        return shapes

    # ---- image-to-video ------------------------------------------------------------------
    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        """Both pipelines resize the image to the video's size (``video_processor.preprocess(image, height, width)``,
        diffusers 0.42.1 pipeline_ltx_image2video.py:773, pipeline_ltx_condition.py:1086), VAE-encode it as a
        one-frame video and put its latent in the first latent frame; every token's timestep is then its own (0 for
        the image's), so the transformer embeds one timestep per token instead of one per video."""
        if not spec.image_sizes:
            if entry.pipeline_class == "LTXImageToVideoPipeline":  # a saved folder of it: its __call__ needs the image
                raise DiffmeterError(
                    f"{entry.name} ({entry.pipeline_class}) animates an image: add --image-size WxH (any size: the "
                    f"pipeline resizes it to the video's {spec.width}x{spec.height})"
                )
            return []
        given = single_image(entry, spec)
        if entry.pipeline_class == "LTXConditionPipeline":
            how = "LTXConditionPipeline's image condition at frame 0 (strength 1), VAE-encoded once per call"
        else:
            how = f"LTXImageToVideoPipeline runs {entry.name} on it, VAE-encoded once per output"
        notes.append(
            f"image-to-video: the {size_text(given)} image resized to the video's {spec.width}x{spec.height}; {how} "
            "as the first latent frame; the transformer embeds a timestep per token (the image's tokens at 0)"
        )
        return [(spec.height, spec.width)]

    def size_from_images(self, entry, spec) -> tuple[int, int, str]:
        """Called without a size, both pipelines generate at their ``__call__`` default (height 512, width 704)
        whatever the image, which they resize to it (diffusers 0.42.1 pipeline_ltx_image2video.py:603-604 and 773,
        pipeline_ltx_condition.py:860-861 and 1086): the default size, as without an image."""
        if entry.pipeline_class == "LTXConditionPipeline":
            return size_kept(entry, spec, entry.pipeline_class, "pipeline_ltx_condition.py:860-861, 1086")
        return size_kept(entry, spec, "LTXImageToVideoPipeline", "pipeline_ltx_image2video.py:603-604, 773")

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """LTXImageToVideoPipeline.prepare_latents encodes ``image[i]`` per generator (bench gives one per output,
        pipeline_ltx_image2video.py:541); LTXConditionPipeline.prepare_latents encodes each condition once for the
        whole batch (pipeline_ltx_condition.py:717)."""
        per_output = shapes.entry.pipeline_class != "LTXConditionPipeline"
        return vae_encode_calls(self, shapes, per_output=per_output, video=True)

    def image_arguments(self, entry, images: list[list]) -> dict:
        """LTXImageToVideoPipeline takes one image per output; LTXConditionPipeline's ``image`` list would be one
        condition per image, so it gets the first output's image alone (the condition is shared by the batch)."""
        if entry.pipeline_class == "LTXConditionPipeline":
            return {"image": images[0][0]}
        return super().image_arguments(entry, images)

    def conditioned_pipeline(self, pipe):
        """An LTXPipeline checkpoint animates an image through LTXImageToVideoPipeline, sharing its components;
        LTXConditionPipeline takes the image itself."""
        from diffusers import LTXImageToVideoPipeline, LTXPipeline

        if type(pipe) is not LTXPipeline:
            return pipe
        made = LTXImageToVideoPipeline.from_pipe(pipe)
        made.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))  # from_pipe starts a fresh one
        return made

    def tokens(self, shapes: Shapes) -> tuple[int, int, int]:
        """(frames, height, width) in tokens after the pipeline's patch packing."""
        config = shapes.config(self.denoiser)
        patch, patch_t = config.get("patch_size", 1), config.get("patch_size_t", 1)
        return shapes.latent_frames // patch_t, shapes.latent_height // patch, shapes.latent_width // patch

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        frames, height, width = self.tokens(shapes)
        text = shapes.text_tokens["text_encoder"]
        inputs = {
            "hidden_states": torch.zeros(batch, frames * height * width, config["in_channels"], device=device),
            "encoder_hidden_states": torch.zeros(batch, text, config["caption_channels"], device=device),
            "encoder_attention_mask": torch.ones(batch, text, device=device),
            "attention_kwargs": None,
            "return_dict": False,
        }
        vae = shapes.config(self.decoder)
        spatial, temporal = spatial_compression(vae), temporal_compression(vae)
        # with an image, each token its own timestep (pipeline_ltx_image2video.py:841, pipeline_ltx_condition.py:1199)
        step = timesteps(batch, device).unsqueeze(-1)
        if shapes.images:
            step = step.expand(batch, frames * height * width)
        if shapes.entry.pipeline_class == "LTXConditionPipeline":
            # a (batch, 1) timestep and the pixel coordinates of each token, as prepare_latents makes them
            from diffusers import LTXConditionPipeline

            coords = LTXConditionPipeline._prepare_video_ids(
                batch,
                shapes.latent_frames,
                shapes.latent_height,
                shapes.latent_width,
                patch_size=config.get("patch_size", 1),
                patch_size_t=config.get("patch_size_t", 1),
                device=device,
            )
            coords = LTXConditionPipeline._scale_video_ids(coords, spatial, temporal, 0, device).float()
            coords[:, 0] = coords[:, 0] * (1.0 / FRAME_RATE)
            inputs.update(timestep=step, video_coords=coords)
        else:
            inputs.update(
                timestep=step if shapes.images else step.squeeze(-1),
                num_frames=shapes.latent_frames,
                height=shapes.latent_height,
                width=shapes.latent_width,
                rope_interpolation_scale=(temporal / FRAME_RATE, spatial, spatial),
            )
        return inputs

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        return video_decoder_inputs(self, shapes, batch, device)


def video_decoder_inputs(family: Family, shapes: Shapes, batch: int, device) -> dict:
    """The LTX video VAE's decode inputs (LTX-Video and LTX-2): the whole latent video, and one decode
    timestep per video for a timestep-conditioned decoder (the 0.9.1+ VAEs, not LTX-2.0's), else None."""
    z = torch.zeros(
        batch,
        family.latent_channels(shapes.entry),
        shapes.latent_frames,
        shapes.latent_height,
        shapes.latent_width,
        device=device,
    )
    temb = timesteps(batch, device) if shapes.config(family.decoder).get("timestep_conditioning") else None
    return {"z": z, "temb": temb, "return_dict": False}
