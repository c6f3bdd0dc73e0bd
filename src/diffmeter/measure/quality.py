"""Image quality against the unoptimized run at the same seed: PSNR and SSIM (torchmetrics);
LPIPS (torchmetrics, AlexNet) when torchvision and its AlexNet weights are on disk; CLIP score
(prompt alignment, transformers' CLIP) when a CLIP checkpoint is in the local HF cache.

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


def load_frames(path: Path) -> torch.Tensor:
    """An image (or every frame of an animated PNG) as float NCHW in [0, 1]."""
    with Image.open(path) as image:
        frames = [np.asarray(frame.convert("RGB"), dtype=np.float32) / 255.0 for frame in ImageSequence.Iterator(image)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


class LpipsScorer:
    """LPIPS (AlexNet) from torchmetrics; its linear heads ship with torchmetrics, the backbone
    weights come from torchvision's cache."""

    def __init__(self) -> None:
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        self.metric = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True).eval()

    @torch.no_grad()
    def __call__(self, image: torch.Tensor, reference: torch.Tensor) -> float:
        return float(self.metric(image, reference))


def lpips_scorer() -> tuple[LpipsScorer | None, str | None]:
    """A scorer when torchvision and its AlexNet checkpoint are on disk (nothing is downloaded)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None, "not computed: LPIPS needs torchvision (pip install torchvision) and its AlexNet weights"
    from torchvision.models import AlexNet_Weights

    checkpoint = Path(torch.hub.get_dir()) / "checkpoints" / Path(AlexNet_Weights.DEFAULT.url).name
    if not checkpoint.is_file():
        return None, f"not computed: LPIPS needs torchvision's AlexNet weights at {checkpoint} (not downloaded offline)"
    return LpipsScorer(), None


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
    path: Path,
    baseline_path: Path,
    seed: int,
    prompt: str | None = None,
    clip: ClipScorer | None = None,
    lpips: LpipsScorer | None = None,
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
        lpips=lpips(image, reference) if lpips is not None else None,
        clip_score=clip(path, prompt) if scored else None,
        baseline_clip_score=clip(baseline_path, prompt) if scored else None,
    )


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
