"""The records of image quality against the unoptimized run (``quality`` computes them), importable without torch:
a stored run is read without it."""

from __future__ import annotations

import math

from pydantic import BaseModel


class ImageQuality(BaseModel):
    """One optimized image against its baseline (same prompt, same seed)."""

    path: str
    baseline_path: str
    seed: int
    identical: bool
    #: decibels; None when identical (infinite)
    psnr_db: float | None
    ssim: float
    #: perceptual distance to the baseline image (0 = same; AlexNet LPIPS)
    lpips: float | None = None
    #: 100 x cosine(image, prompt) in CLIP space, floored at 0, for the image and its baseline
    clip_score: float | None = None
    baseline_clip_score: float | None = None


class Quality(BaseModel):
    """Images against the unoptimized run: PSNR in dB (higher is closer), SSIM in [-1, 1]."""

    baseline: str
    images: list[ImageQuality]
    identical: int
    mean_psnr_db: float | None
    min_psnr_db: float | None
    mean_ssim: float
    min_ssim: float
    mean_lpips: float | None = None
    clip_model: str | None = None
    mean_clip_score: float | None = None
    mean_baseline_clip_score: float | None = None
    #: metrics that could not be computed here, and why
    not_computed: dict[str, str] = {}


def summarize(
    baseline: str, images: list[ImageQuality], clip_model: str | None, not_computed: dict[str, str]
) -> Quality:
    psnrs = [image.psnr_db for image in images if image.psnr_db is not None and math.isfinite(image.psnr_db)]
    ssims = [image.ssim for image in images]
    clips = [(image.clip_score, image.baseline_clip_score) for image in images if image.clip_score is not None]
    lpips = [image.lpips for image in images if image.lpips is not None]
    return Quality(
        baseline=baseline,
        images=images,
        identical=sum(image.identical for image in images),
        mean_psnr_db=sum(psnrs) / len(psnrs) if psnrs else None,
        min_psnr_db=min(psnrs) if psnrs else None,
        mean_ssim=sum(ssims) / len(ssims),
        min_ssim=min(ssims),
        mean_lpips=sum(lpips) / len(lpips) if lpips else None,
        clip_model=clip_model if clips else None,
        mean_clip_score=sum(c for c, _ in clips) / len(clips) if clips else None,
        mean_baseline_clip_score=sum(b for _, b in clips) / len(clips) if clips else None,
        not_computed=not_computed,
    )
