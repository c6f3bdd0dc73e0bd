"""Image quality against the unoptimized run at the same seed: PSNR and SSIM (torchmetrics),
and CLIP score (prompt alignment, transformers' CLIP) when a CLIP checkpoint is in the local
Hugging Face cache.

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

#: CLIP checkpoints looked for in the local HF cache, best first (DIFFMETER_CLIP_MODEL overrides)
CLIP_MODELS = ("openai/clip-vit-large-patch14", "openai/clip-vit-base-patch16", "openai/clip-vit-base-patch32")
LPIPS_NOT_COMPUTED = "not computed: LPIPS needs torchvision and pretrained AlexNet/VGG weights, not loaded offline"


class ImageQuality(BaseModel):
    """One optimized image against its baseline (same prompt, same seed)."""

    path: str
    baseline_path: str
    seed: int
    identical: bool
    #: decibels; None when identical (infinite)
    psnr_db: float | None
    ssim: float
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
    clip_model: str | None = None
    mean_clip_score: float | None = None
    mean_baseline_clip_score: float | None = None
    #: metrics that could not be computed here, and why
    not_computed: dict[str, str] = {}


def load_frames(path: Path) -> torch.Tensor:
    """An image (or every frame of an animated PNG) as float NCHW in [0, 1]."""
    with Image.open(path) as image:
        frames = [np.asarray(frame.convert("RGB"), dtype=np.float32) / 255.0 for frame in ImageSequence.Iterator(image)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


class ClipScorer:
    """CLIP score with a local checkpoint: 100 x max(cosine(image, text), 0), frames averaged."""

    def __init__(self, directory: Path, name: str) -> None:
        import transformers

        self.name = name
        self.model = transformers.CLIPModel.from_pretrained(directory, local_files_only=True).eval()
        self.processor = transformers.CLIPProcessor.from_pretrained(directory, local_files_only=True)

    @torch.no_grad()
    def __call__(self, path: Path, prompt: str) -> float:
        with Image.open(path) as image:
            frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(image)]
        inputs = self.processor(text=[prompt], images=frames, return_tensors="pt", padding=True, truncation=True)
        image_features = _features(self.model.get_image_features(pixel_values=inputs["pixel_values"]))
        text_features = _features(
            self.model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        )
        cosine = torch.nn.functional.cosine_similarity(image_features, text_features)
        return float(100 * cosine.clamp(min=0).mean())


def _features(output) -> torch.Tensor:
    """Embeddings from get_*_features, which newer transformers wrap in an output object."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def clip_scorer() -> tuple[ClipScorer | None, str | None]:
    """A scorer from the local HF cache (or DIFFMETER_CLIP_MODEL), or why there is none."""
    import os

    from diffmeter.catalog.local import hf_cache_directory

    override = os.environ.get("DIFFMETER_CLIP_MODEL")
    for name in [override] if override else CLIP_MODELS:
        directory = Path(name).expanduser() if Path(name).expanduser().is_dir() else hf_cache_directory(name)
        if directory is not None and (directory / "config.json").is_file():
            try:
                return ClipScorer(directory, name), None
            except (OSError, ValueError) as error:
                return None, f"not computed: cannot load CLIP from {directory}: {str(error).splitlines()[0]}"
    wanted = override or ", ".join(CLIP_MODELS)
    return (
        None,
        f"not computed: no CLIP checkpoint in the local Hugging Face cache (looked for {wanted}); "
        f"`hf download {CLIP_MODELS[1]}` or set DIFFMETER_CLIP_MODEL to a local CLIP folder",
    )


def compare(
    path: Path, baseline_path: Path, seed: int, prompt: str | None = None, clip: ClipScorer | None = None
) -> ImageQuality:
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    image, reference = load_frames(path), load_frames(baseline_path)
    if image.shape != reference.shape:
        raise ValueError(f"{path} is {tuple(image.shape)}, its baseline {tuple(reference.shape)}")
    identical = bool(torch.equal(image, reference))
    psnr = None if identical else float(peak_signal_noise_ratio(image, reference, data_range=1.0))
    ssim = float(structural_similarity_index_measure(image, reference, data_range=1.0))
    scored = clip is not None and prompt is not None
    return ImageQuality(
        path=str(path.name),
        baseline_path=str(baseline_path),
        seed=seed,
        identical=identical,
        psnr_db=psnr,
        ssim=ssim,
        clip_score=clip(path, prompt) if scored else None,
        baseline_clip_score=clip(baseline_path, prompt) if scored else None,
    )


def summarize(baseline: str, images: list[ImageQuality], clip_model: str | None, clip_reason: str | None) -> Quality:
    psnrs = [image.psnr_db for image in images if image.psnr_db is not None and math.isfinite(image.psnr_db)]
    ssims = [image.ssim for image in images]
    clips = [(image.clip_score, image.baseline_clip_score) for image in images if image.clip_score is not None]
    not_computed = {"lpips": LPIPS_NOT_COMPUTED}
    if clip_reason:
        not_computed["clip_score"] = clip_reason
    return Quality(
        baseline=baseline,
        images=images,
        identical=sum(image.identical for image in images),
        mean_psnr_db=sum(psnrs) / len(psnrs) if psnrs else None,
        min_psnr_db=min(psnrs) if psnrs else None,
        mean_ssim=sum(ssims) / len(ssims),
        min_ssim=min(ssims),
        clip_model=clip_model if clips else None,
        mean_clip_score=sum(c for c, _ in clips) / len(clips) if clips else None,
        mean_baseline_clip_score=sum(b for _, b in clips) / len(clips) if clips else None,
        not_computed=not_computed,
    )
