"""The frames a video pipeline makes of a request: those that floor ``num_frames`` to their VAE's ``kt+1`` (their
``prepare_latents`` takes ``(num_frames - 1) // t + 1`` latent frames, which the VAE decodes to ``kt + 1`` frames)
count, run and rate the video at the frames it has, saying so."""

from __future__ import annotations


def floored_frames(entry, num_frames: int, temporal: int) -> tuple[int, str | None]:
    """(frames made, a note where they are not the ``num_frames`` asked) under a ``temporal``x compressing VAE."""
    latent = (num_frames - 1) // temporal + 1
    made = (latent - 1) * temporal + 1
    if made == num_frames:
        return num_frames, None
    return made, (
        f"{entry.pipeline_class} takes {num_frames} frames as {latent} latent frames, decoded to {made} frames (its "
        f"VAE makes {temporal}k+1): counted, run and rated as {made}"
    )
