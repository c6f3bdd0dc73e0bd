"""Image quality against the unoptimized run at the same seed: PSNR and SSIM (torchmetrics).

Images are compared as saved (8-bit PNG, videos frame by frame). Identical images have no
finite PSNR; they are counted as ``identical`` and left out of the PSNR mean.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageSequence
from pydantic import BaseModel

#: what the optional perceptual metrics would need, said in the result instead of a number
NOT_COMPUTED = {
    "lpips": "not computed: LPIPS needs torchvision and pretrained AlexNet/VGG weights, not loaded offline",
    "clip_score": "not computed: CLIP score needs a CLIP checkpoint in the local Hugging Face cache",
}


class ImageQuality(BaseModel):
    """One optimized image against its baseline (same prompt, same seed)."""

    path: str
    baseline_path: str
    seed: int
    identical: bool
    #: decibels; None when identical (infinite)
    psnr_db: float | None
    ssim: float


class Quality(BaseModel):
    """Images against the unoptimized run: PSNR in dB (higher is closer), SSIM in [-1, 1]."""

    baseline: str
    images: list[ImageQuality]
    identical: int
    mean_psnr_db: float | None
    min_psnr_db: float | None
    mean_ssim: float
    min_ssim: float
    not_computed: dict[str, str] = NOT_COMPUTED


def load_frames(path: Path) -> torch.Tensor:
    """An image (or every frame of an animated PNG) as float NCHW in [0, 1]."""
    with Image.open(path) as image:
        frames = [np.asarray(frame.convert("RGB"), dtype=np.float32) / 255.0 for frame in ImageSequence.Iterator(image)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


def compare(path: Path, baseline_path: Path, seed: int) -> ImageQuality:
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    image, reference = load_frames(path), load_frames(baseline_path)
    if image.shape != reference.shape:
        raise ValueError(f"{path} is {tuple(image.shape)}, its baseline {tuple(reference.shape)}")
    identical = bool(torch.equal(image, reference))
    psnr = None if identical else float(peak_signal_noise_ratio(image, reference, data_range=1.0))
    ssim = float(structural_similarity_index_measure(image, reference, data_range=1.0))
    return ImageQuality(
        path=str(path.name), baseline_path=str(baseline_path), seed=seed, identical=identical, psnr_db=psnr, ssim=ssim
    )


def summarize(baseline: str, images: list[ImageQuality]) -> Quality:
    psnrs = [image.psnr_db for image in images if image.psnr_db is not None and math.isfinite(image.psnr_db)]
    ssims = [image.ssim for image in images]
    return Quality(
        baseline=baseline,
        images=images,
        identical=sum(image.identical for image in images),
        mean_psnr_db=sum(psnrs) / len(psnrs) if psnrs else None,
        min_psnr_db=min(psnrs) if psnrs else None,
        mean_ssim=sum(ssims) / len(ssims),
        min_ssim=min(ssims),
    )
