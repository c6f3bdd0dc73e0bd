"""HunyuanVideo 1.5 (HunyuanVideo15Pipeline, and HunyuanVideo15ImageToVideoPipeline for its i2v checkpoints): an
MMDiT over 16x/4x VAE latents, guided by a Qwen2.5-VL chat-templated prompt and a ByT5 glyph encoder for quoted text,
with CFG set by the pipeline's ``guider`` component rather than a ``__call__`` argument. An i2v checkpoint's image sets
the video's size, is VAE-encoded as its first latent frame and read by a SigLIP encoder whose 729 tokens fill the slot
t2v leaves masked: the transformer's calls are t2v's."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch._guards import active_fake_mode
from torch.overrides import TorchFunctionMode

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import (
    DENOISER,
    IMAGE_ENCODER,
    TEXT_ENCODER,
    VAE_DECODER,
    Call,
    Family,
    Shapes,
    register,
    timesteps,
)
from diffmeter.families.frames import floored_frames, latent_count
from diffmeter.families.host_masks import is_placeholder
from diffmeter.families.images import ImageConditioned, single_image, vae_encode_calls
from diffmeter.spec import size_text

#: HunyuanVideo15Pipeline.__init__ constants: the chat template's first 108 tokens are cropped off
#: the Qwen hidden states (prompt_template_encode_start_idx), and T2V passes 729 zero image tokens
#: (vision_num_semantic_tokens) that the transformer embeds and masks
CROP_START = 108
IMAGE_TOKENS = 729


@register
class HunyuanVideo15(ImageConditioned, Family):
    name = "hunyuanvideo15"
    #: the first frame of an i2v checkpoint's video
    max_images = 1
    flow_matching = True
    masks_attention = True  # the joint attention gets a boolean text-padding mask
    is_video = True
    text_encoders = ("text_encoder", "text_encoder_2")
    cfg_mode = "separate"  # the guider yields cond and uncond batches, one transformer call each
    size_rounding = "down"  # no size check: prepare_latents floors each side to the VAE's 16 pixels

    # ---- guidance: the guider component -------------------------------------------------
    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """HunyuanVideo15Pipeline.__call__ takes no guidance argument: its ``guider`` decides
        (see ``prepare_pipeline``)."""
        return {}

    def prepare_pipeline(self, pipe, guidance_scale: float, batch_size: int) -> None:
        """A guider of the run's guidance scale, which the pipeline reads instead of a ``__call__``
        argument: ClassifierFreeGuidance runs the uncond branch unless the scale is 1 (``_is_cfg_enabled``).
        Several videos are decoded one at a time: diffusers 0.42.1's VAE fails on more than one per
        call (diffusers PR #13133), and the count assumes it."""
        pipe.guider = pipe.guider.new(guidance_scale=guidance_scale)
        if batch_size > 1:
            pipe.vae.enable_slicing()

    def called_guidance(self, entry, call_defaults: dict) -> float | None:
        guider = _guider(entry)
        if guider is None:
            return None
        from diffusers import ClassifierFreeGuidance

        return ClassifierFreeGuidance.from_config(guider["config"]).guidance_scale

    def cfg_steps(self, shapes: Shapes) -> int:
        """Steps on which the guider runs the uncond branch: all of them unless its config
        narrows ``start``/``stop`` (ClassifierFreeGuidance._is_cfg_enabled)."""
        if not shapes.cfg:
            return 0
        guider = _guider(shapes.entry)
        config = (guider or {}).get("config", {})
        if not config.get("enabled", True):
            return 0
        steps = shapes.spec.steps
        start, stop = int(config.get("start", 0.0) * steps), int(config.get("stop", 1.0) * steps)
        return sum(start <= step < stop for step in range(steps))

    # ---- sizes ---------------------------------------------------------------------------
    def vae_scale(self, entry) -> int:
        return entry.components[self.decoder].config.get("spatial_compression_ratio", 16)

    def size_multiple(self, entry) -> int:
        return self.vae_scale(entry)

    def latent_frames(self, entry, spec) -> int:
        # prepare_latents: (num_frames - 1) // temporal + 1, whatever num_frames is
        temporal = entry.components[self.decoder].config.get("temporal_compression_ratio", 4)
        return latent_count(spec.num_frames, temporal)

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        temporal = entry.components[self.decoder].config.get("temporal_compression_ratio", 4)
        return floored_frames(entry, num_frames, temporal)

    def default_size(self, entry) -> tuple[int, int]:
        """__call__ without a size: the 16:9 bucket of the transformer's ``target_size``."""
        return self.bucket(entry, 9, 16)

    def bucket(self, entry, height: int, width: int) -> tuple[int, int]:
        """The transformer's ``target_size`` bucket nearest an image's aspect ratio, with diffusers' own code."""
        from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

        processor = HunyuanVideo15ImageProcessor(vae_scale_factor=self.vae_scale(entry))
        target = entry.components[self.denoiser].config.get("target_size", 640)
        return processor.calculate_default_height_width(height, width, target)

    # ---- image-to-video ------------------------------------------------------------------
    def takes_images(self, entry) -> bool:
        return entry.pipeline_class == "HunyuanVideo15ImageToVideoPipeline"

    def takes_no_size(self, entry) -> str | None:
        if not self.takes_images(entry):
            return None
        return (
            f"{entry.pipeline_class}.__call__ takes no size (diffusers 0.42.1, pipeline_hunyuan_video1_5_image2video.py"
            ":652-674): the video is the target_size bucket nearest the input image's aspect ratio"
        )

    def shapes(self, entry, spec) -> Shapes:
        """HunyuanVideo15ImageToVideoPipeline.__call__ (diffusers 0.42.1, pipeline_hunyuan_video1_5_image2video.py
        756-759) takes no height or width: the video has the size of the ``target_size`` bucket nearest the image's
        aspect ratio, and the image is resized and center-cropped to it."""
        if not self.takes_images(entry):
            return super().shapes(entry, spec)
        if not spec.image_sizes:
            raise DiffmeterError(
                f"{entry.name} ({entry.pipeline_class}) animates an image, whose aspect ratio sets the video's size: "
                "add --image-size WxH"
            )
        given = single_image(entry, spec)
        height, width = self.bucket(entry, *given)
        shapes = super().shapes(entry, replace(spec, height=height, width=width))
        target = entry.components[self.denoiser].config.get("target_size", 640)
        shapes.notes.insert(
            0,
            f"output {width}x{height} (WxH): {entry.pipeline_class}.__call__ takes no size (diffusers 0.42.1, "
            f"pipeline_hunyuan_video1_5_image2video.py:652-674): the video is the target_size {target} bucket nearest "
            f"the {size_text(given)} image's aspect ratio, the image resized and cropped to it (756-759), whatever "
            "--height/--width say",
        )
        shapes.note(
            "image-to-video: the image VAE-encoded once per call as the first latent frame and read once by the "
            "SigLIP image encoder; its tokens fill the 729 image slots t2v masks, so the transformer's calls cost what "
            "t2v's do"
        )
        return shapes

    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        if not self.takes_images(entry):
            return super().input_images(entry, spec, notes)
        return [(spec.height, spec.width)]

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """_get_image_embeds reads the image once per call at the feature extractor's size and keeps the last hidden
        state (repeated to the batch); _get_image_latents VAE-encodes it once per call as a one-frame video, a local
        the latents are made from (pipeline_hunyuan_video1_5_image2video.py 375-420, 594-630)."""
        if not shapes.images:
            return []
        size = shapes.entry.extra["pipeline_init"]["feature_extractor"]["config"]["size"]

        def pixels(device):
            return {"pixel_values": torch.zeros(1, 3, size["height"], size["width"], device=device)}

        seen = Call(
            "image_encoder",
            IMAGE_ENCODER,
            1,
            1,
            pixels,
            note=f"the image at {size['width']}x{size['height']}, once per call",
            keeps_input=False,
            kept=lambda output: output.last_hidden_state,
        )
        encoded = vae_encode_calls(self, shapes, per_output=False, video=True, keeps_input=False)
        return [seen, *encoded]

    def image_tokens(self, shapes: Shapes) -> int:
        """The image tokens in every transformer call: t2v's 729 zeros (``vision_num_semantic_tokens``), or the SigLIP
        encoder's patches of the image (27 x 27 = 729 for so400m at 384 px)."""
        if not shapes.images:
            return IMAGE_TOKENS
        config = shapes.config("image_encoder")
        return (config["image_size"] // config["patch_size"]) ** 2

    def image_arguments(self, entry, images: list[list]) -> dict:
        """One image for the whole call: the pipeline encodes it once and repeats it to the batch."""
        return {"image": images[0][0]}

    # ---- prompts -------------------------------------------------------------------------
    def prompt_settings(self, pipe, prompts: list[str]) -> dict:
        """ByT5 runs only on prompts holding quoted text; Qwen is always padded to 1108 tokens."""
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import extract_glyph_texts

        return {"glyph_text": any(extract_glyph_texts(prompt) is not None for prompt in prompts)}

    def text_calls(self, shapes: Shapes) -> list[Call]:
        """Qwen: the prompts in one batch, then the negative prompts ('' by default) when CFG is on.
        ByT5: one batch-1 call per prompt whose quoted text it reads (_get_byt5_prompt_embeds loops
        over prompts), none for the default empty negative prompt."""
        batch, entry = shapes.spec.batch_size, shapes.entry
        negative = self.cfg_steps(shapes) > 0  # encode_prompt(negative_prompt) when guider.num_conditions > 1
        qwen = shapes.text_tokens["text_encoder"]
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                2 if negative else 1,
                self._token_builder(batch, qwen),
                note=f"{qwen} tokens (chat template, padded)" + (", prompt + negative prompt" if negative else ""),
            )
        ]
        if "text_encoder_2" in entry.components:
            byt5 = shapes.text_tokens["text_encoder_2"]
            glyph = shapes.spec.glyph_text
            if glyph is None:
                shapes.note(
                    "ByT5 (text_encoder_2) reads only a prompt's quoted text: assumed every prompt holds some "
                    "(an upper bound); --no-glyph-text counts prompts without quoted text"
                )
            count = 0 if glyph is False else batch
            calls.append(
                Call(
                    "text_encoder_2",
                    TEXT_ENCODER,
                    1,
                    count,
                    self._token_builder(1, byt5),
                    note=f"{byt5} tokens, one call per prompt with quoted text" if count else "no quoted text",
                )
            )
        return calls

    # ---- the denoiser --------------------------------------------------------------------
    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        uncond = self.cfg_steps(shapes)
        byt5, qwen = shapes.text_tokens["text_encoder_2"], shapes.text_tokens["text_encoder"] - CROP_START
        image = self.image_tokens(shapes)
        note = f"{image + byt5 + qwen} text tokens ({image} image + {byt5} ByT5 + {qwen} Qwen)"
        shapes.note(
            "the transformer runs dense full attention over video and text tokens, as diffusers does "
            "(no sparse or sliding-tile attention)"
        )
        return [
            Call(
                self.denoiser,
                DENOISER,
                batch,
                steps + uncond,
                lambda device: self.denoiser_inputs(shapes, batch, device),
                note=(f"CFG: separate uncond and cond calls; {note}" if uncond else f"no CFG; {note}"),
                prepare=_meta_text_reorder,
            )
        ]

    def denoiser_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        config = shapes.config(self.denoiser)
        entry = shapes.entry
        qwen = shapes.text_tokens["text_encoder"] - CROP_START
        byt5 = shapes.text_tokens["text_encoder_2"]
        frames, height, width = shapes.latent_frames, shapes.latent_height, shapes.latent_width
        return {
            "hidden_states": torch.zeros(batch, config["in_channels"], frames, height, width),
            "image_embeds": torch.zeros(batch, self.image_tokens(shapes), config["image_embed_dim"]),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, qwen, config["text_embed_dim"]),
            "encoder_attention_mask": torch.ones(batch, qwen),
            "encoder_hidden_states_2": torch.zeros(batch, byt5, entry.components["text_encoder_2"].config["d_model"]),
            "encoder_attention_mask_2": torch.ones(batch, byt5),
            "return_dict": False,
        }

    # ---- the decoder ---------------------------------------------------------------------
    def decoder_calls(self, shapes: Shapes) -> list[Call]:
        """AutoencoderKLHunyuanVideo15.decode runs the whole latent video at once (no tiling unless
        ``enable_tiling()`` is called, which the pipeline does not do). In diffusers 0.42.1 it cannot
        decode more than one video in a call: its mid-block attention broadcasts a (batch, L, L) mask
        against (batch, 1, L, L) scores and fails (diffusers PR #13133); a batch runs only with
        ``vae.enable_slicing()``, one video per decoder call, which is what is counted."""
        shapes.note("VAE decode counted untiled, as the pipeline calls it (vae.enable_tiling() changes it)")
        batch = shapes.spec.batch_size
        if batch > 1:
            shapes.note(
                "AutoencoderKLHunyuanVideo15 (diffusers 0.42.1) fails to decode several videos in one call "
                "(diffusers PR #13133): counted as decoded one at a time, as vae.enable_slicing() runs it"
            )
        return [
            Call(
                self.decoder,
                VAE_DECODER,
                1,
                batch,
                lambda device: self.decoder_inputs(shapes, 1, device),
                method="decode",
                note="one video per call" if batch > 1 else "",
                prepare=_meta_causal_mask,
            )
        ]

    def decoder_inputs(self, shapes: Shapes, batch: int, device) -> dict:
        channels = self.latent_channels(shapes.entry)
        return {"z": torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)}


def _guider(entry) -> dict | None:
    return entry.extra.get("pipeline_init", {}).get("guider")


# ---- meta-device hooks ------------------------------------------------------------------------
class _TextReorderOnMeta(TorchFunctionMode):  # and on fake tensors (the memory prediction), likewise
    """HunyuanVideo15Transformer3DModel.forward asks ``torch.all(image_embeds == 0)`` (T2V: True) and
    reorders each sample's text tokens valid-first with boolean masks: ``x[mask]`` then ``x[~mask]``,
    concatenated back to the full length. The meta device can do neither; here the T2V test answers
    True and a masked selection keeps no rows, its complement all of them: the same concatenated
    length, and no matmul in between."""

    def __init__(self) -> None:
        super().__init__()
        self.inverted: dict[int, torch.Tensor] = {}  # by id, holding them so no id is reused

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.all and args and is_placeholder(args[0]):
            return True
        if func is torch.Tensor.__invert__ and is_placeholder(args[0]) and args[0].dtype == torch.bool:
            out = func(*args, **kwargs)
            self.inverted[id(out)] = out
            return out
        if func is torch.Tensor.__getitem__ and is_placeholder(args[0]):
            index = args[1]
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
                source = args[0]  # a selection copies what it keeps
                return source[:].clone() if id(index) in self.inverted else source[:0].clone()
        return func(*args, **kwargs)


class _ModeHandle:
    def __init__(self, mode: TorchFunctionMode) -> None:
        self.mode = mode
        mode.__enter__()

    def remove(self) -> None:
        self.mode.__exit__(None, None, None)


def _meta_text_reorder(transformer):
    return _ModeHandle(_TextReorderOnMeta())


class _PatchedMask:
    """AutoencoderKLHunyuanVideo15's mid-block attention builds its frame-causal mask with one Python
    assignment per token (49,290 at 480p): no compute, so on meta and on fake tensors an empty mask of its shape
    stands in (the same storage: the real one is filled in place)."""

    def __init__(self) -> None:
        from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

        self.cls = HunyuanVideo15AttnBlock
        self.original = HunyuanVideo15AttnBlock.__dict__["prepare_causal_attention_mask"]

        def empty_mask(n_frame, n_hw, dtype, device, batch_size=None):
            if torch.device(device).type != "meta" and active_fake_mode() is None:  # a real run
                return self.original.__func__(n_frame, n_hw, dtype, device, batch_size)
            mask = torch.empty(n_frame * n_hw, n_frame * n_hw, dtype=dtype, device=device)
            return mask if batch_size is None else mask.unsqueeze(0).expand(batch_size, -1, -1)

        self.cls.prepare_causal_attention_mask = staticmethod(empty_mask)

    def remove(self) -> None:
        self.cls.prepare_causal_attention_mask = self.original


def _meta_causal_mask(vae):
    return _PatchedMask()
