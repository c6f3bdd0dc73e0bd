"""FLUX.1: MMDiT with 2x2-packed latents, CLIP pooled + T5 sequence, guidance-distilled.

FLUX.1 Kontext (``FluxKontextPipeline``) runs the same transformer; without an input image it
generates like FluxPipeline, except that it first re-fits the requested size to ``max_area``
pixels at the requested aspect ratio (floored to multiples of 16)."""

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Family, Shapes, register, timesteps

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
class Flux(Family):
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


@register
class FluxKontext(Flux):
    """FluxKontextPipeline run as text-to-image (no input image)."""

    name = "flux_kontext"

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

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        shapes.note(
            f"{entry.pipeline_class} counted as text-to-image (no input image); editing an image also "
            "VAE-encodes it once and adds its packed tokens (resized to a preferred Kontext resolution: "
            f"4096 tokens for a square input at 1024x1024) to the {tokens} noisy-latent tokens of every "
            "transformer call"
        )
        return shapes
