"""Images of lossy runs beside their unoptimized images at the same seed, embedded in the page:
thumbnails, the full-size image on click, and each pair's PSNR and SSIM."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from diffmeter.report.html.study import WEIGHTS_LABELS, Run, Study

THUMBNAIL_PX = 192


@dataclass
class Pair:
    seed: int
    prompt: str | None
    baseline: Path
    optimized: Path
    psnr_db: float | None
    ssim: float


def lossy_pairs(study: Study, per_run: int) -> list[tuple[Run, list[Pair]]]:
    """For each run whose images differ from its baseline's, up to ``per_run`` image pairs."""
    found = []
    for run in study.complete:
        quality = run.result.quality
        if quality is None or quality.identical == len(quality.images):
            continue
        baseline = study.run_at(quality.baseline, near=run.folder.parent)
        if baseline is None:
            continue
        by_seed = {image.seed: image for image in baseline.result.images}
        mine = {image.seed: image for image in run.result.images}
        pairs = [
            Pair(
                seed=q.seed,
                prompt=mine[q.seed].prompt if q.seed in mine else None,
                baseline=baseline.folder / by_seed[q.seed].path,
                optimized=run.folder / mine[q.seed].path,
                psnr_db=q.psnr_db,
                ssim=q.ssim,
            )
            for q in quality.images
            if q.seed in by_seed and q.seed in mine
        ]
        pairs = [pair for pair in pairs if pair.baseline.is_file() and pair.optimized.is_file()][:per_run]
        if pairs:
            found.append((run, pairs))
    return found


def gallery_html(study: Study, per_run: int) -> str:
    blocks = []
    for run, pairs in lossy_pairs(study, per_run):
        tag = WEIGHTS_LABELS[run.weights]
        cards = "".join(_pair_html(pair) for pair in pairs)
        blocks.append(
            f'<div class="gallery-run"><h3>{html.escape(run.label)} <span class="tag">{html.escape(tag)}</span></h3>'
            f'<div class="pairs">{cards}</div></div>'
        )
    return "".join(blocks)


def _pair_html(pair: Pair) -> str:
    psnr = "identical" if pair.psnr_db is None else f"PSNR {pair.psnr_db:.2f} dB"
    prompt = html.escape(pair.prompt or "")
    return (
        '<figure class="pair">'
        f"{_image_html(pair.baseline, 'unoptimized')}{_image_html(pair.optimized, 'optimized')}"
        f'<figcaption>seed {pair.seed}: {psnr}, SSIM {pair.ssim:.4f}<br><span class="prompt">{prompt}</span>'
        "</figcaption></figure>"
    )


def _image_html(path: Path, role: str) -> str:
    full = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    return (
        f'<div class="shot"><img class="thumb" alt="{role} image" src="{_thumbnail(path)}" '
        f'data-full="{full}" title="click for full size"><div class="role">{role}</div></div>'
    )


def _thumbnail(path: Path) -> str:
    with Image.open(path) as image:  # a video's first frame
        image = image.convert("RGB")
        image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX), Image.Resampling.NEAREST if image.width < 64 else Image.LANCZOS)
        if image.width < THUMBNAIL_PX // 2:  # tiny test images: enlarged without smoothing
            scale = THUMBNAIL_PX // image.width
            image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
