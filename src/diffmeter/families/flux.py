"""FLUX.1: MMDiT with 2x2-packed latents, CLIP pooled + T5 sequence, guidance-distilled.

FLUX.1 Kontext (``FluxKontextPipeline``) runs the same transformer. It first re-fits the requested
size to ``max_area`` pixels at the requested aspect ratio (floored to multiples of 16); an input image
is resized to a preferred Kontext resolution, VAE-encoded once per call (its latents repeated for the
outputs), and its packed tokens ride along with the noisy latents in every transformer call (then dropped
from its output)."""

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.errors import DiffmeterError
from diffmeter.families import controlnet, lora
from diffmeter.families.base import Call, Family, Shapes, register, timesteps
from diffmeter.families.control_image import ControlImage
from diffmeter.families.images import ImageConditioned, note_tokens, packed_tokens, vae_encode_calls
from diffmeter.spec import size_text

#: FluxKontextPipeline.__call__'s max_area default
KONTEXT_MAX_AREA = 1024**2


def kontext_max_area(entry) -> int:
    """The ``max_area`` the pipeline is called with: the entry's own call arguments (tiny entries
    pass a small one), else ``FluxKontextPipeline.__call__``'s default."""
    called = entry.extra.get("runtime", {}).get("call", {})
    if "max_area" in called:
        return called["max_area"]
    from diffmeter.catalog.pipeline_defaults import call_defaults

    return call_defaults("FluxKontextPipeline").get("max_area", KONTEXT_MAX_AREA)


@register
class Flux(ControlImage, Family):
    name = "flux"
    max_sequence_limit = 512  # the pipeline's check_inputs refuses longer prompts
    flow_matching = True
    #: FluxPipeline warns and generates at the multiple of 16 just below a size it cannot take
    size_rounding = "down"
    text_encoders = ("text_encoder", "text_encoder_2")
    sequence_encoder = "text_encoder_2"
    cfg_mode = "never"  # FLUX.1 embeds guidance; true CFG only with true_cfg_scale and a negative prompt
    true_cfg = True
    default_sample_size = 128  # FluxPipeline.default_sample_size

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.FLUX

    def patch(self, entry) -> int:
        return 2  # the pipeline packs latents in 2x2 patches

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # FluxPipeline: vae_scale_factor * 2

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        image_tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        text_tokens = shapes.text_tokens["text_encoder_2"]
        return {
            "hidden_states": torch.zeros(batch, image_tokens, config["in_channels"]),
            "encoder_hidden_states": torch.zeros(batch, text_tokens, config["joint_attention_dim"]),
            "pooled_projections": torch.zeros(batch, config["pooled_projection_dim"]),
            "timestep": timesteps(batch, device),
            "img_ids": torch.zeros(image_tokens, 3),
            "txt_ids": torch.zeros(text_tokens, 3),
            "guidance": torch.zeros(batch) if config.get("guidance_embeds") else None,
            "return_dict": False,
        }

    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """FluxControlNetPipeline (diffusers 0.42.1, pipeline_flux_controlnet.py 916-940 and 1110-1158): the control
        image at the output size, repeated per output, is VAE-encoded once per call and packed like the latents
        (a ControlNet without ``input_hint_block``: the catalog's); the ControlNet runs once per step on the prompt
        alone, even under true CFG, whose second transformer call reuses its block samples."""
        config, batch = shapes.config(CONTROLNET), shapes.spec.batch_size
        tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        size = (shapes.spec.height, shapes.spec.width)

        def build(device):
            inputs = self.denoiser_inputs(shapes, batch, device)
            inputs["guidance"] = torch.zeros(batch) if config.get("guidance_embeds") else None
            inputs["controlnet_cond"] = torch.zeros(batch, tokens, shapes.config(self.denoiser)["in_channels"])
            if config.get("num_mode") is not None:  # a union ControlNet: its mode joins the text as one more token
                inputs["controlnet_mode"] = torch.zeros(batch, 1, dtype=torch.long)
            return inputs

        width = config["num_attention_heads"] * config["attention_head_dim"]

        def residuals(call_batch, device):
            block = torch.zeros(call_batch, tokens, width)
            return {
                "controlnet_block_samples": [block] * config["num_layers"],
                "controlnet_single_block_samples": [block] * config["num_single_layers"],
            }

        encode = controlnet.control_image_encoding(self.decoder, batch, size, "once per output")
        detail = f"runs once per step at batch {batch}, on the prompt alone"
        return controlnet.steered(
            shapes, calls, self.denoiser, build, residuals, detail, batch, shapes.spec.steps, encode
        )


@register
class FluxKontext(ImageConditioned, Flux):
    """FluxKontextPipeline: an edit of one input image (``--image-size``), or text-to-image without one."""

    name = "flux_kontext"
    max_images = 1

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.FLUX_KONTEXT

    def default_size(self, entry) -> tuple[int, int]:
        height, width, _ = self.pipeline_size(entry, *super().default_size(entry))
        return height, width

    def pipeline_size(self, entry, height: int, width: int) -> tuple[int, int, str | None]:
        """FluxKontextPipeline.__call__: keep the aspect ratio, fit the area to max_area, floor to
        multiples of vae_scale_factor * 2 (the same float expressions as the pipeline)."""
        area, step = kontext_max_area(entry), self.size_multiple(entry)
        aspect_ratio = width / height
        made_width = round((area * aspect_ratio) ** 0.5) // step * step
        made_height = round((area / aspect_ratio) ** 0.5) // step * step
        if made_height == 0 or made_width == 0:
            raise DiffmeterError(
                f"{entry.pipeline_class} fits {width}x{height} (WxH) to {area} pixels, leaving a side under "
                f"{step} pixels for {entry.name}; pick a less extreme aspect ratio"
            )
        if (made_height, made_width) == (height, width):
            return height, width, None
        return (
            made_height,
            made_width,
            (
                f"{entry.pipeline_class} generates {width}x{height} (WxH) at {made_width}x{made_height}: it keeps the "
                f"aspect ratio, fits the area to max_area={area} pixels and floors each side to a multiple of {step}"
            ),
        )

    def input_images(self, entry, spec, notes) -> list[tuple[int, int]]:
        """FluxKontextPipeline.__call__ (diffusers 0.42.1, "3. Preprocess image"): the image floored to multiples of
        vae_scale_factor * 2, its aspect ratio picks the nearest of PREFERRED_KONTEXT_RESOLUTIONS (unless called with
        ``_auto_resize=False``), each side floored again; the output keeps its own size (1024x1024 by default)."""
        if len(spec.image_sizes) > self.max_images:
            raise DiffmeterError(
                f"{entry.pipeline_class} edits one input image; got {len(spec.image_sizes)}: pass one --image or "
                "--image-size"
            )
        if not spec.image_sizes:
            notes.append(
                f"{entry.pipeline_class} counted as text-to-image (no input image); --image-size WxH counts an edit: "
                "the image VAE-encoded once per call, its packed tokens added to every transformer call"
            )
            return []
        step = self.size_multiple(entry)
        # image_processor.get_default_height_width floors the image to its vae_scale_factor (vae_scale_factor * 2
        # here) before the aspect ratio is taken; a side under it leaves a zero the pipeline divides by
        height, width = (side - side % step for side in spec.image_sizes[0])
        if 0 in (height, width):
            raise DiffmeterError(
                f"--image-size {size_text(spec.image_sizes[0])}: {entry.pipeline_class} floors each side of the input "
                f"image to a multiple of {step} pixels, leaving nothing; use at least {step}x{step}"
            )
        if entry.extra.get("runtime", {}).get("call", {}).get("_auto_resize", True):
            from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

            _, width, height = min((abs(width / height - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        made = (height // step * step, width // step * step)
        if made != spec.image_sizes[0]:
            notes.append(
                f"{entry.pipeline_class} resizes the {size_text(spec.image_sizes[0])} (WxH) input image to "
                f"{size_text(made)}: the preferred Kontext resolution nearest its aspect ratio, floored to a multiple "
                f"of {step}"
            )
        return [made]

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """One encode per call of the one image (diffusers 0.42.1, pipeline_flux_kontext.py:599-607: ``vae.encode``
        once per image given, ``image[i : i + 1]`` for each generator of a list); 644-647 repeat its latents for
        every output of the batch."""
        return vae_encode_calls(self, shapes, per_output=False)

    def image_arguments(self, entry, images: list[list]) -> dict:
        """One image for the whole call, as a user edits one image with several prompts or outputs."""
        return {"image": images[0][0]}

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        note_tokens(self, shapes, "editing, the input image", "attention grows with the square of their sum")
        return shapes

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        inputs = super().denoiser_inputs(shapes, batch, device)
        extra = packed_tokens(self, shapes)
        if extra:
            hidden = inputs["hidden_states"]
            inputs["hidden_states"] = torch.zeros(batch, hidden.shape[1] + extra, hidden.shape[2])
            inputs["img_ids"] = torch.zeros(inputs["img_ids"].shape[0] + extra, 3)
        return inputs
