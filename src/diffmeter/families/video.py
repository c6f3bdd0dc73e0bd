"""Text-to-video families: Wan 2.1 and 2.2, and CogVideoX."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import DENOISER, IMAGE_ENCODER, Call, Family, Shapes, register, timesteps
from diffmeter.families.frames import floored_frames, latent_count, rounded_frames, wan_rounded
from diffmeter.families.images import ImageConditioned, single_image, vae_encode_calls
from diffmeter.families.wan_images import first_last, image_to_video, image_tokens, reads_image
from diffmeter.pipelines import config_value
from diffmeter.spec import size_text


@register
class Wan(ImageConditioned, Family):
    """WanPipeline: Wan 2.1, Wan 2.2's two experts (``boundary_ratio``) and its TI2V-5B model
    (``expand_timesteps``, the 16x-compressing Wan 2.2 VAE), which also animates an image: the same checkpoint
    run by WanImageToVideoPipeline (``--image-size``)."""

    name = "wan"
    #: the first frame of a TI2V-5B video (other Wan checkpoints take no image)
    max_images = 1
    flow_matching = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    cfg_mode = "separate"
    is_video = True
    #: the low-noise expert of Wan 2.2, run on the steps whose timestep falls below the boundary
    low_noise = "transformer_2"

    def size_multiple(self, entry) -> int:
        return 16  # WanPipeline.check_inputs refuses sides that are not multiples of 16

    def pipeline_size(self, entry, height: int, width: int) -> tuple[int, int, str | None]:
        """check_inputs refuses sides off a multiple of 16; __call__ then floors each side to a multiple
        of the VAE's spatial factor times the patch (32 pixels for the Wan 2.2 VAE)."""
        step = self.pixel_multiple(entry)
        made = []
        for side, value in (("height", height), ("width", width)):
            if value % 16:
                down, up = value // 16 * 16, -(-value // 16) * 16
                options = " or ".join(str(size) for size in dict.fromkeys((down, up)) if size > 0)
                raise DiffmeterError(
                    f"--{side} {value} is not a multiple of 16, which {entry.pipeline_class} requires for "
                    f"{entry.name}; try {options}"
                )
            if value < step:
                raise DiffmeterError(
                    f"--{side} {value} is below {entry.name}'s {step}-pixel latent token: "
                    f"{entry.pipeline_class} would floor it to 0; try {step}"
                )
            made.append(value // step * step)
        if (made[0], made[1]) == (height, width):
            return height, width, None
        return (
            made[0],
            made[1],
            (
                f"{entry.pipeline_class} generates {width}x{height} (WxH) at {made[1]}x{made[0]}: it floors each side "
                f"to a multiple of {step} pixels (VAE {self.vae_scale(entry)}x, patch {self.patch(entry)})"
            ),
        )

    def vae_scale(self, entry) -> int:
        return _vae_setting(entry, self.decoder, "scale_factor_spatial")  # what WanPipeline reads

    def latent_channels(self, entry) -> int:
        return entry.components[self.decoder].config["z_dim"]

    def patch(self, entry) -> int:
        return entry.components[self.denoiser].config["patch_size"][1]

    def latent_frames(self, entry, spec) -> int:
        return latent_count(spec.num_frames, _vae_setting(entry, self.decoder, "scale_factor_temporal"))

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        return rounded_frames(entry, num_frames, _vae_setting(entry, self.decoder, "scale_factor_temporal"))

    # ---- image-to-video (TI2V-5B) --------------------------------------------------------
    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        """WanImageToVideoPipeline.__call__ (diffusers 0.42.1) resizes the image to the video's size
        (``video_processor.preprocess(image, height, width)``) and, with ``expand_timesteps``, VAE-encodes it as a
        one-frame video whose latent replaces the first latent frame in every step (``first_frame_mask``): the
        transformer's calls are text-to-video's."""
        if not spec.image_sizes:
            if image_to_video(entry):
                raise DiffmeterError(
                    f"{entry.name} ({entry.pipeline_class}) animates an image: add --image-size WxH (any size: the "
                    f"pipeline resizes it to the video's {spec.width}x{spec.height})"
                )
            return []
        if not self.takes_images(entry):
            raise DiffmeterError(
                f"{entry.name} generates from text alone (Wan's image-to-video models are checkpoints of their own, "
                "with an image encoder or extra input channels): drop --image or --image-size"
            )
        given = first_last(entry, spec) or single_image(entry, spec)
        if image_to_video(entry):
            clip = (
                ", and read by the CLIP vision encoder once per call; its tokens join the text's in every transformer "
                "call"
                if reads_image(entry)
                else ""
            )
            notes.append(
                f"image-to-video: the {size_text(given)} image resized to the video's {spec.width}x{spec.height}, "
                f"VAE-encoded as a video of {spec.num_frames} frames (the image, then zeros; FLF2V: the last frame "
                f"last) once per call{clip}; "
                "the transformer takes the image's latents and mask as extra channels"
            )
        else:
            notes.append(
                f"image-to-video: WanImageToVideoPipeline runs {entry.name} on the {size_text(given)} image resized to "
                f"the video's {spec.width}x{spec.height}, VAE-encoded once per call as the first latent frame; the "
                "transformer's calls are those of text-to-video"
            )
        return [(spec.height, spec.width)] * len(spec.image_sizes)

    def takes_images(self, entry) -> bool:
        return image_to_video(entry) or bool(_init(entry, "expand_timesteps"))

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """TI2V-5B: the image as a one-frame video. Wan 2.1 I2V (WanImageToVideoPipeline.encode_image and
        prepare_latents, diffusers 0.42.1): the CLIP vision encoder reads it once per call at its own image size
        (all its layers run; the pipeline keeps the penultimate's 257 tokens), and the VAE encodes a whole
        ``num_frames`` video, the image then zeros, once per call: pipeline_wan_i2v.py:457-459 (diffusers 0.42.1)
        encodes it once and repeats its latents for the batch (bench's generators per output: ``seeded_call``)."""
        if not shapes.images or _init(shapes.entry, "expand_timesteps"):
            return vae_encode_calls(self, shapes, per_output=False, video=True)
        # prepare_latents keeps the latents, not the video it encodes: one video, a last frame its own last (FLF2V)
        frames, first = shapes.spec.num_frames, dataclasses.replace(shapes, images=shapes.images[:1])
        encoded = vae_encode_calls(self, first, per_output=False, video=True, frames=frames, keeps_input=False)
        if not reads_image(shapes.entry):  # Wan 2.2 I2V A14B: the image's latents alone
            return encoded
        side = shapes.config("image_encoder")["image_size"]  # its processor crops to it (preprocessor_config.json)

        def pixels(device):  # FLF2V: encode_image([image, last_image]) at batch 2 (pipeline_wan_i2v.py:703)
            images = torch.zeros(len(shapes.images), 3, side, side, device=device)
            return {"pixel_values": images, "output_hidden_states": True}

        seen = Call(
            "image_encoder",
            IMAGE_ENCODER,
            len(shapes.images),
            1,
            pixels,
            note=f"the image{'s' if len(shapes.images) > 1 else ''} at {side}x{side}, once per call",
            keeps_input=False,
            kept=lambda output: output.hidden_states[-2],  # encode_image returns the penultimate layer alone
        )
        return [seen, *encoded]

    def image_arguments(self, entry, images: list[list]) -> dict:
        """One image for the whole call (FLF2V: and its last frame)."""
        return {"image": images[0][0], **({"last_image": images[0][1]} if len(images[0]) > 1 else {})}

    def seeded_call(self, pipe, arguments: dict) -> dict:
        """A list of generators makes WanImageToVideoPipeline encode the image once per generator
        (pipeline_wan_i2v.py:452-456, diffusers 0.42.1), which a user's call with one does not: the noise is drawn
        from bench's generators as prepare_latents would (its ``randn_tensor``, 414-422, float32 at 712-728) and
        handed over as ``latents``, so the image is encoded once and every output keeps its own seed's noise."""
        generators = arguments.get("generator")
        if "image" not in arguments or not isinstance(generators, list) or arguments.get("latents") is not None:
            return arguments
        from diffusers.utils.torch_utils import randn_tensor

        temporal, spatial = pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial
        # __call__'s own rounding first (636-658): frames to temporal k + 1, sides floored to spatial x patch
        frames = wan_rounded(arguments["num_frames"], temporal)
        patch = (pipe.transformer or pipe.transformer_2).config.patch_size
        shape = (
            len(generators),
            pipe.vae.config.z_dim,
            latent_count(frames, temporal),
            arguments["height"] // (spatial * patch[1]) * patch[1],
            arguments["width"] // (spatial * patch[2]) * patch[2],
        )
        noise = randn_tensor(shape, generator=generators, device=pipe._execution_device, dtype=torch.float32)
        return {**arguments, "latents": noise, "generator": None}

    def conditioned_pipeline(self, pipe):
        """The loaded WanPipeline as WanImageToVideoPipeline, sharing its components and ``expand_timesteps`` (an
        I2V checkpoint's own pipeline is one already)."""
        from diffusers import WanImageToVideoPipeline

        if isinstance(pipe, WanImageToVideoPipeline):
            return pipe
        made = WanImageToVideoPipeline.from_pipe(pipe)
        made.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))  # from_pipe starts a fresh one
        return made

    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """Wan 2.2 A14B's model card guides the low-noise expert with its own ``guidance_scale_2``;
        whether the uncond branch runs at all is still decided by ``guidance_scale`` alone."""
        arguments = {"guidance_scale": guidance_scale}
        if _init(entry, "boundary_ratio") is not None and entry.extra.get("guidance_scale_2") is not None:
            arguments["guidance_scale_2"] = entry.extra["guidance_scale_2"]
        return arguments

    # ---- the expert switch ----------------------------------------------------------------
    def denoisers(self, entry) -> tuple[str, ...]:
        """Wan 2.2 A14B ships a low-noise expert (``transformer_2``) next to the high-noise one."""
        return (self.denoiser, self.low_noise) if self.low_noise in entry.components else (self.denoiser,)

    def expert_steps(self, entry, steps: int) -> dict[str, int]:
        """Steps per expert, from the timesteps the pipeline's own scheduler gives: WanPipeline runs
        ``transformer`` where ``t >= boundary_ratio * num_train_timesteps``, ``transformer_2`` below."""
        ratio = _init(entry, "boundary_ratio")
        if ratio is None:
            return {self.denoiser: steps}
        scheduler = _scheduler(entry)
        scheduler.set_timesteps(steps, device="cpu")
        boundary = ratio * scheduler.config.num_train_timesteps
        high = sum(bool(t >= boundary) for t in scheduler.timesteps)
        return {self.denoiser: high, self.low_noise: len(scheduler.timesteps) - high}

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        split = self.expert_steps(shapes.entry, shapes.spec.steps)
        cfg = shapes.cfg  # WanPipeline: guidance_scale > 1, for both experts (guidance_scale_2 only weighs)
        if len(split) > 1:
            scheduler = _scheduler_spec(shapes.entry)
            shift = scheduler["config"].get("flow_shift", scheduler["config"].get("shift"))
            shapes.note(
                f"Wan 2.2 experts: {split[self.denoiser]} of {shapes.spec.steps} steps on the high-noise transformer, "
                f"{split[self.low_noise]} on the low-noise transformer_2 (timesteps of {scheduler['class']}"
                + (f" with shift {shift}" if shift is not None else "")
                + f" against the boundary {_init(shapes.entry, 'boundary_ratio')} x num_train_timesteps)"
            )
        calls = []
        for expert, steps in split.items():  # an expert given no step is still loaded: 0 calls, its parameters
            note = "CFG: separate uncond and cond calls" if cfg else "no CFG"
            if len(split) > 1:
                label = "high-noise expert" if expert == self.denoiser else "low-noise expert"
                note = f"{label}, {steps} step{'' if steps == 1 else 's'}; {note}"
            calls.append(
                Call(
                    expert,
                    DENOISER,
                    batch,
                    2 * steps if cfg else steps,
                    lambda device, expert=expert: self.denoiser_inputs(shapes, batch, device, expert),
                    note=note,
                )
            )
        return calls

    def denoiser_inputs(self, shapes: Shapes, batch: int, device, component: str | None = None):
        config = shapes.config(component or self.denoiser)
        if _init(shapes.entry, "expand_timesteps"):
            # Wan 2.2 TI2V: one timestep per latent token, (mask[0][0][:, ::2, ::2] * t).flatten()
            tokens = shapes.latent_frames * -(-shapes.latent_height // 2) * -(-shapes.latent_width // 2)
            timestep = torch.zeros(batch, tokens, device=device)
        else:
            timestep = timesteps(batch, device)
        inputs = {
            "hidden_states": self._latents(shapes, batch, config["in_channels"]),
            "timestep": timestep,
            "encoder_hidden_states": torch.zeros(batch, shapes.text_tokens["text_encoder"], config["text_dim"]),
            "return_dict": False,
        }
        if config.get("image_dim") is not None:  # Wan 2.1 I2V: the CLIP image tokens, beside the text's; FLF2V's
            # two images' per output, joined by the transformer's image embedder (transformer_wan.py:296-300)
            images = batch * len(shapes.images)
            inputs["encoder_hidden_states_image"] = torch.zeros(images, image_tokens(shapes.entry), config["image_dim"])
        return inputs

    def decoder_calls(self, shapes: Shapes) -> list[Call]:
        """AutoencoderKLWan decodes one latent frame per ``decoder`` call, its causal caches passed in
        the call (``feat_cache``; ``feat_idx`` reset to [0] before each frame): once the caches are full,
        a frame's call has the same inputs as the one before, and is replayed rather than run again."""
        return [dataclasses.replace(call, replayed=("decoder",)) for call in super().decoder_calls(shapes)]

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        return {"z": self._latents(shapes, batch, self.latent_channels(shapes.entry))}

    def _latents(self, shapes: Shapes, batch: int, channels: int) -> torch.Tensor:
        return torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)


def _vae_setting(entry, decoder: str, key: str) -> int:
    """A Wan VAE setting as the loaded model's config holds it: the file's value, else the AutoencoderKLWan default
    (8x spatial, 4x temporal: the Wan 2.1 VAE's files leave both out)."""
    return config_value(entry.components[decoder], key)


def _init(entry, name: str):
    """A WanPipeline __init__ argument as model_index.json holds it (``extra.pipeline_init``)."""
    return entry.extra.get("pipeline_init", {}).get(name)


def _scheduler_spec(entry) -> dict:
    """The scheduler the pipeline ships: a catalog entry's ``extra.scheduler``, a tiny entry's runtime
    scheduler, or a local folder's own scheduler/scheduler_config.json."""
    if entry.origin == "local":  # catalog/local.py reads the folder's scheduler/scheduler_config.json
        if "scheduler" not in entry.extra:
            path = Path(entry.sources.get("configs", "")) / "scheduler" / "scheduler_config.json"
            raise DiffmeterError(
                f"{entry.name} switches experts at a timestep boundary, which depends on its scheduler: "
                f"{path} is missing"
            )
        return entry.extra["scheduler"]
    spec = entry.extra.get("scheduler") or entry.extra.get("runtime", {}).get("scheduler")
    if spec is None:
        raise DiffmeterError(f"{entry.name} switches experts but its catalog entry names no scheduler")
    return spec


def _scheduler(entry):
    import diffusers

    spec = _scheduler_spec(entry)
    config = {k: v for k, v in spec["config"].items() if not k.startswith("_")}
    return getattr(diffusers, spec["class"]).from_config(config)


@register
class CogVideoX(Family):
    name = "cogvideox"
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    is_video = True

    def latent_frames(self, entry, spec) -> int:
        return latent_count(spec.num_frames, entry.components[self.decoder].config["temporal_compression_ratio"])

    def pipeline_frames(self, entry, num_frames: int) -> tuple[int, str | None]:
        """pipeline_cogvideox.py:680 (diffusers 0.42.1): ``(num_frames - 1) // t + 1`` latent frames, which the VAE
        decodes to ``tk+1`` frames."""
        return floored_frames(entry, num_frames, entry.components[self.decoder].config["temporal_compression_ratio"])

    def default_size(self, entry) -> tuple[int, int]:
        config, scale = entry.components[self.denoiser].config, self.vae_scale(entry)
        return config["sample_height"] * scale, config["sample_width"] * scale

    def default_frames(self, entry) -> int:
        return entry.components[self.denoiser].config["sample_frames"]  # CogVideoXPipeline's num_frames default

    @staticmethod
    def denoised_frames(config: dict, latent_frames: int) -> int:
        """The latent frames the transformer runs on: CogVideoX 1.5 (``patch_size_t``) pads them to a multiple of
        it, and the pipeline drops the padding before the decode (diffusers pipeline_cogvideox.py ``__call__``:
        ``additional_frames``, ``latents[:, additional_frames:]``)."""
        patch = config.get("patch_size_t")
        return latent_frames + (-latent_frames % patch if patch else 0)

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        frames = self.denoised_frames(config, shapes.latent_frames)
        hidden = torch.zeros(batch, frames, config["in_channels"], shapes.latent_height, shapes.latent_width)
        rotary = None
        if config.get("use_rotary_positional_embeddings"):
            # the pipeline's own RoPE helper, given just the attributes it reads
            from diffusers import CogVideoXPipeline

            pipeline = SimpleNamespace(
                vae_scale_factor_spatial=self.vae_scale(shapes.entry),
                transformer=SimpleNamespace(config=SimpleNamespace(**{"patch_size_t": None, **config})),
            )
            rotary = CogVideoXPipeline._prepare_rotary_positional_embeddings(
                pipeline, shapes.spec.height, shapes.spec.width, frames, device
            )
        return {
            "hidden_states": hidden,
            "encoder_hidden_states": torch.zeros(batch, shapes.text_tokens["text_encoder"], config["text_embed_dim"]),
            "timestep": timesteps(batch, device),
            "image_rotary_emb": rotary,
            "return_dict": False,
        }

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        channels = self.latent_channels(shapes.entry)
        return {"z": torch.zeros(batch, channels, shapes.latent_frames, shapes.latent_height, shapes.latent_width)}
