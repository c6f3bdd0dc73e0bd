"""LTX-2 (LTX2Pipeline): a joint audio-video DiT. A Gemma 3 encoder runs over ``max_sequence_length``
left-padded tokens and all its hidden states go through the text connectors (once, on the
[negative, positive] batch); each step makes a batched CFG call, a spatio-temporal-guidance (STG) call
and a modality-isolation call; the video VAE, the audio VAE and the vocoder decode. With ``--image-size`` the same
checkpoint animates an image through LTX2ImageToVideoPipeline: the image's latent as the first frame, a timestep per
video token."""

from __future__ import annotations

import math

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import DENOISER, TEXT_ENCODER, VAE_DECODER, Call, Family, Shapes, register, timesteps
from diffmeter.families.frames import floored_frames, latent_count
from diffmeter.families.images import ImageConditioned, single_image, size_kept, vae_encode_calls
from diffmeter.families.ltx import spatial_compression, temporal_compression, video_decoder_inputs
from diffmeter.spec import size_text

#: LTX2Pipeline.__call__ defaults (diffusers 0.42.1); none of them is a shape but the frame rate (audio length)
FRAME_RATE = 24.0
STG_BLOCKS = [28]
#: AutoencoderKLLTX2Audio's LATENT_DOWNSAMPLE_FACTOR: latent frames and mel bins per audio latent
AUDIO_DOWNSAMPLE = 4
#: the guidance arguments that switch every guided pass off (the pipeline reads ``audio_x or x``, so both)
UNGUIDED = {
    "guidance_scale": 1.0,
    "audio_guidance_scale": 1.0,
    "stg_scale": 0.0,
    "audio_stg_scale": 0.0,
    "modality_scale": 1.0,
    "audio_modality_scale": 1.0,
}


def audio_frames(entry, num_frames: int, frame_rate: float = FRAME_RATE) -> int:
    """``audio_num_frames`` of ``__call__``: the video's duration in audio latents."""
    audio = entry.components["audio_vae"].config
    per_second = audio.get("sample_rate", 16000) / audio.get("mel_hop_length", 160) / float(AUDIO_DOWNSAMPLE)
    return round(num_frames / frame_rate * per_second)


@register
class LTX2(ImageConditioned, Family):
    name = "ltx2"
    #: the first frame (LTX2ImageToVideoPipeline)
    max_images = 1
    #: Gemma, then the connectors over its hidden states (so stage timing counts both as text encoding)
    text_encoders = ("text_encoder", "connectors")
    sequence_encoder = "text_encoder"
    is_video = True
    flow_matching = True
    #: the text cross-attentions get the connectors' mask as an additive bias
    masks_attention = True

    def vae_scale(self, entry) -> int:
        return spatial_compression(entry.components[self.decoder].config)

    def latent_channels(self, entry) -> int:
        return entry.components[self.denoiser].config["in_channels"]  # prepare_latents: transformer.config.in_channels

    def size_multiple(self, entry) -> int:
        return math.lcm(32, self.pixel_multiple(entry))  # check_inputs: multiples of 32

    def default_size(self, entry) -> tuple[int, int]:
        return 512, 768  # LTX2Pipeline.__call__ defaults

    def default_frames(self, entry) -> int:
        return 121  # __call__: num_frames None -> 121 when the pipeline has no duration_head (LTX-2.0)

    def latent_frames(self, entry, spec) -> int:
        return latent_count(spec.num_frames, temporal_compression(entry.components[self.decoder].config))

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        """LTX2Pipeline takes any frame count as ``(num_frames - 1) // 8 + 1`` latent frames; its audio lasts as
        long as the frames asked (``audio_frames``)."""
        return floored_frames(entry, num_frames, temporal_compression(entry.components[self.decoder].config))

    # ---- guidance -------------------------------------------------------------------------
    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """Above 1: CFG at that scale with the other guidance terms at the pipeline's defaults (audio CFG 7,
        STG 1, modality 3); at most 1: every guided pass off (audio CFG, STG and modality isolation too, which
        the pipeline would otherwise still run)."""
        if guidance_scale > 1.0:
            return {"guidance_scale": guidance_scale}
        return {**UNGUIDED, "guidance_scale": guidance_scale}

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        length = shapes.text_tokens["text_encoder"]
        connectors = entry.components["connectors"].config
        for stream in ("video", "audio"):
            registers = connectors.get(f"{stream}_connector_num_learnable_registers", 128)
            if registers and length % registers:
                raise DiffmeterError(
                    f"--max-sequence-length {length}: {entry.pipeline_class}'s text connectors need a multiple of "
                    f"their {registers} learnable registers; try {length // registers * registers or registers} "
                    f"or {-(-length // registers) * registers}"
                )
        asked = f"{spec.num_frames} frames" + (" asked" if shapes.asked_frames else "")
        shapes.note(
            f"audio: {audio_frames(entry, spec.num_frames)} audio latent frames ({asked} at {FRAME_RATE:g} fps) "
            "generated jointly, decoded by the audio VAE and the vocoder"
        )
        if shapes.cfg:
            blocks = ", ".join(str(block) for block in self.stg_blocks(shapes))
            perturbed = entry.components[self.denoiser].config.get("perturbed_attn")
            stg = f"perturbing block {blocks}" if perturbed else f"block {blocks}, a full pass: no perturbed_attn"
            shapes.note(
                f"each step: a CFG call on twice the batch, an STG call (stg_scale 1, {stg}) and a "
                "modality-isolation call (modality_scale 3), as LTX2Pipeline's defaults run them"
            )
        else:
            shapes.note("guidance scale <= 1 counted with every guided pass off (CFG, audio CFG, STG, modality)")
        return shapes

    # ---- image-to-video ------------------------------------------------------------------
    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        """LTX2ImageToVideoPipeline (diffusers 0.42.1) resizes the image to the video's size
        (pipeline_ltx2_image2video.py 1364), VAE-encodes it once per generator as a one-frame video (prepare_latents,
        836-843) and gives every video token its own timestep, the image's 0 (1487): the transformer's time embedding
        runs per token."""
        if not spec.image_sizes:
            if entry.pipeline_class == "LTX2ImageToVideoPipeline":  # a saved folder of it: its __call__ needs the image
                raise DiffmeterError(
                    f"{entry.name} ({entry.pipeline_class}) animates an image: add --image-size WxH (any size: the "
                    f"pipeline resizes it to the video's {spec.width}x{spec.height})"
                )
            return []
        given = single_image(entry, spec)
        notes.append(
            f"image-to-video: LTX2ImageToVideoPipeline runs {entry.name} on the {size_text(given)} image "
            f"resized to the video's {spec.width}x{spec.height}, VAE-encoded once per output as the first latent "
            "frame; "
            "the transformer embeds a timestep per video token (the image's at 0). bench passes image_crf=0: the "
            "pipeline's H.264 re-compression of the image (PyAV, CPU preprocessing, no model compute) takes one PIL "
            "image, not one per output"
        )
        return [(spec.height, spec.width)]

    def size_from_images(self, entry, spec) -> tuple[int, int, str]:
        """Called without a size, LTX2ImageToVideoPipeline generates at its ``__call__`` default (height 512, width
        768) whatever the image, which it resizes to it (diffusers 0.42.1 pipeline_ltx2_image2video.py:990-991 and
        1364): the default size, as without an image."""
        return size_kept(entry, spec, "LTX2ImageToVideoPipeline", "pipeline_ltx2_image2video.py:990-991, 1364")

    def image_calls(self, shapes: Shapes) -> list[Call]:
        return vae_encode_calls(self, shapes, per_output=True, video=True)

    def image_arguments(self, entry, images: list[list]) -> dict:
        """One image per output (the pipeline encodes ``image[i]`` per generator), without the re-compression, which
        reads a single PIL image alone."""
        return {"image": [own[0] for own in images], "image_crf": 0}

    def conditioned_pipeline(self, pipe):
        """The loaded LTX2Pipeline as LTX2ImageToVideoPipeline, sharing its components."""
        from diffusers import LTX2ImageToVideoPipeline

        if isinstance(pipe, LTX2ImageToVideoPipeline):
            return pipe
        made = LTX2ImageToVideoPipeline.from_pipe(pipe)
        made.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))  # from_pipe starts a fresh one
        return made

    # ---- the call plan ----------------------------------------------------------------------
    def text_calls(self, shapes: Shapes) -> list[Call]:
        """Gemma on the prompt, and on the negative prompt with CFG, each at batch B and the padded length;
        then the connectors once."""
        length, batch = shapes.text_tokens["text_encoder"], shapes.spec.batch_size
        note = f"{length} tokens" + (", prompt + negative prompt" if shapes.cfg else "")
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                2 if shapes.cfg else 1,
                self._token_builder(batch, length),
                note=note,
            )
        ]
        batch = shapes.spec.batch_size * (2 if shapes.cfg else 1)
        calls.append(
            Call(
                "connectors",
                TEXT_ENCODER,
                batch,
                1,
                lambda device: self.connector_inputs(shapes, batch, device),
                note="once, on the [negative, positive] batch" if shapes.cfg else "once",
            )
        )
        return calls

    def connector_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        config = shapes.config("connectors")
        length = shapes.text_tokens["text_encoder"]
        features = config.get("caption_channels", 3840) * config.get("text_proj_in_factor", 49)
        return {
            "text_encoder_hidden_states": torch.zeros(batch, length, features, device=device),
            "attention_mask": torch.ones(batch, length, dtype=torch.long, device=device),
            "padding_side": "left",
        }

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        if not shapes.cfg:
            return [
                Call(self.denoiser, DENOISER, batch, steps, self._denoiser_builder(shapes, batch), note="no guidance")
            ]
        return [
            Call(
                self.denoiser,
                DENOISER,
                2 * batch,
                steps,
                self._denoiser_builder(shapes, 2 * batch),
                note="CFG batched: uncond + cond in one call",
            ),
            Call(
                self.denoiser,
                DENOISER,
                batch,
                steps,
                self._denoiser_builder(shapes, batch, spatio_temporal_guidance_blocks=self.stg_blocks(shapes)),
                note="STG: perturbed blocks",
            ),
            Call(
                self.denoiser,
                DENOISER,
                batch,
                steps,
                self._denoiser_builder(shapes, batch, isolate_modalities=True),
                note="modality isolation: no audio-video cross-attention",
            ),
        ]

    def stg_blocks(self, shapes: Shapes) -> list[int]:
        """The blocks STG perturbs: the pipeline's default, or what a tiny entry's runtime calls with."""
        call = shapes.entry.extra.get("runtime", {}).get("call", {})
        return list(call.get("spatio_temporal_guidance_blocks", STG_BLOCKS))

    def _denoiser_builder(self, shapes: Shapes, batch: int, **options):
        def build(device):
            return {**self.denoiser_inputs(shapes, batch, device), **options}

        return build

    def denoiser_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        config = shapes.config(self.denoiser)
        patch, patch_t = config.get("patch_size", 1), config.get("patch_size_t", 1)
        frames, height, width = (
            shapes.latent_frames // patch_t,
            shapes.latent_height // patch,
            shapes.latent_width // patch,
        )
        audio = audio_frames(shapes.entry, shapes.asked_frames or shapes.spec.num_frames)
        text = shapes.text_tokens["text_encoder"]
        caption = config["caption_channels"]
        t = timesteps(batch, device)
        return {
            "hidden_states": torch.zeros(batch, frames * height * width, config["in_channels"], device=device),
            "audio_hidden_states": torch.zeros(batch, audio, config["audio_in_channels"], device=device),
            "encoder_hidden_states": torch.zeros(batch, text, caption, device=device),
            "audio_encoder_hidden_states": torch.zeros(batch, text, caption, device=device),
            # with an image, a timestep per video token; audio and sigma keep the step's (image2video.py 1487-1497)
            "timestep": t.unsqueeze(-1).expand(batch, frames * height * width) if shapes.images else t,
            "audio_timestep": t,
            "sigma": t,
            "encoder_attention_mask": torch.ones(batch, text, dtype=torch.long, device=device),
            "audio_encoder_attention_mask": torch.ones(batch, text, dtype=torch.long, device=device),
            "num_frames": shapes.latent_frames,
            "height": shapes.latent_height,
            "width": shapes.latent_width,
            "fps": FRAME_RATE,
            "audio_num_frames": audio,
            "isolate_modalities": False,
            "spatio_temporal_guidance_blocks": None,
            "use_cross_timestep": True,
            "return_dict": False,
        }

    def decoder_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        return [
            *super().decoder_calls(shapes),
            Call(
                "audio_vae",
                VAE_DECODER,
                batch,
                1,
                lambda device: self.audio_decoder_inputs(shapes, batch, device),
                method="decode",
            ),
            Call("vocoder", VAE_DECODER, batch, 1, lambda device: self.vocoder_inputs(shapes, batch, device)),
        ]

    def decoder_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        return video_decoder_inputs(self, shapes, batch, device)

    def audio_decoder_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        config = shapes.config("audio_vae")
        frames = audio_frames(shapes.entry, shapes.asked_frames or shapes.spec.num_frames)
        z = torch.zeros(
            batch,
            config.get("latent_channels", 8),
            frames,
            config.get("mel_bins", 64) // AUDIO_DOWNSAMPLE,
            device=device,
        )
        return {"z": z, "return_dict": False}

    def vocoder_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        """The mel spectrogram the audio VAE decodes: 4x its latent frames (less 3 for a causal decoder), all
        mel bins, ``output_channels`` channels."""
        config = shapes.config("audio_vae")
        frames = audio_frames(shapes.entry, shapes.asked_frames or shapes.spec.num_frames) * AUDIO_DOWNSAMPLE
        if config.get("causality_axis", "height") is not None:
            frames = max(frames - (AUDIO_DOWNSAMPLE - 1), 1)
        mel = torch.zeros(batch, config.get("output_channels", 2), frames, config.get("mel_bins", 64), device=device)
        return {"hidden_states": mel}
