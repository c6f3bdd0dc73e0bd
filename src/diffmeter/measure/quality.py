"""Image quality against the unoptimized run at the same seed: PSNR and SSIM (torchmetrics);
LPIPS (torchmetrics, AlexNet) when torchvision and its AlexNet weights are on disk; CLIP score
(prompt alignment, transformers' CLIP) when a CLIP checkpoint is in the local HF cache.

Images are compared as saved (8-bit PNG, videos frame by frame). Identical images have no
finite PSNR; they are counted as ``identical`` and left out of the PSNR mean.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageSequence

from diffmeter.measure.quality_schema import ImageQuality

#: CLIP checkpoints looked for in the local HF cache, best first (DIFFMETER_CLIP_MODEL overrides)
CLIP_MODELS = ("openai/clip-vit-large-patch14", "openai/clip-vit-base-patch16", "openai/clip-vit-base-patch32")


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
