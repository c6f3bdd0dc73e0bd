"""The frames a video pipeline makes of a request. Its ``prepare_latents`` takes ``(num_frames - 1) // t + 1`` latent
frames (``latent_count``), which the VAE decodes to ``kt + 1`` frames: those that floor ``num_frames`` so
(``floored_frames``), and WanPipeline, which first rounds it to ``kt + 1`` (``rounded_frames``), count, run and rate
the video at the frames it has, saying so."""

from __future__ import annotations


def latent_count(num_frames: int, temporal: int) -> int:
    """The latent frames of ``num_frames`` under a ``temporal``x causal video VAE: the first frame kept, the rest
    compressed."""
    return (num_frames - 1) // temporal + 1


def wan_rounded(num_frames: int, temporal: int) -> int:
    """WanPipeline's count for ``num_frames`` off ``tk+1``: ``num_frames // t * t + 1``, up or down, with a logged
    warning (pipeline_wan.py:494-499, pipeline_wan_i2v.py:637-642, diffusers 0.42.1)."""
    return max(num_frames // temporal * temporal + 1, 1)


def floored_frames(entry, num_frames: int, temporal: int) -> tuple[int, str | None]:
    """(frames made, a note where they are not the ``num_frames`` asked) under a ``temporal``x compressing VAE."""
    latent = latent_count(num_frames, temporal)
    made = (latent - 1) * temporal + 1
    if made == num_frames:
        return num_frames, None
    return made, (
        f"{entry.pipeline_class} takes {num_frames} frames as {latent} latent frames, decoded to {made} frames (its "
        f"VAE makes {temporal}k+1): counted, run and rated as {made}"
    )


def rounded_frames(entry, num_frames: int, temporal: int) -> tuple[int, str | None]:
    """(frames made, a note where they are not the ``num_frames`` asked) where the pipeline rounds first
    (``wan_rounded``)."""
    made = wan_rounded(num_frames, temporal)
    if made == num_frames:
        return num_frames, None
    return made, (
        f"{entry.pipeline_class} rounds {num_frames} frames to {made} (num_frames // {temporal} * {temporal} + 1, its "
        f"VAE making {temporal}k+1): counted, run and rated as {made}"
    )
