"""DiT: class-conditional ImageNet transformer; no text encoder."""

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families.base import Family, Shapes, latents, register, timesteps


@register
class DiT(Family):
    name = "dit"

    def pipeline_size(self, entry, height: int, width: int) -> tuple[int, int, None]:
        """DiTPipeline takes no size: it generates the transformer's sample_size, decoded 8x."""
        native = entry.components[self.denoiser].config["sample_size"] * self.vae_scale(entry)
        if (height, width) != (native, native):
            raise DiffmeterError(
                f"{entry.name} generates {native}x{native} images only (DiTPipeline has no size argument); "
                "drop --height and --width"
            )
        return height, width, None

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "class_labels": torch.zeros(batch, dtype=torch.long),
            "return_dict": False,
        }
