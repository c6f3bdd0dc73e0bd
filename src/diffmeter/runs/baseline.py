"""``--compare-baseline``: a run against the unoptimized run of the same spec, image by image at the same seeds."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from diffmeter.measure.quality import clip_scorer, compare, lpips_scorer
from diffmeter.measure.quality_schema import Quality, summarize
from diffmeter.runs.results import BenchResult


def compare_with_baseline(result: BenchResult, folder: Path, baseline: BenchResult, baseline_folder: Path) -> Quality:
    """Each image of ``result`` (in ``folder``) against the baseline's image with the same seed."""
    by_seed = {image.seed: image for image in baseline.images}
    clip, clip_reason = clip_scorer()
    lpips, lpips_reason = lpips_scorer()
    compared = [
        compare(folder / image.path, baseline_folder / by_seed[image.seed].path, image.seed, image.prompt, clip, lpips)
        for image in result.images
        if image.seed in by_seed
    ]
    reasons = {name: reason for name, reason in (("lpips", lpips_reason), ("clip_score", clip_reason)) if reason}
    return summarize(str(baseline_folder), compared, clip.name if clip else None, reasons)


def notes(baseline: BenchResult, folder: Path, began: datetime) -> list[str]:
    """A baseline stored before this run ``began`` (UTC, whole seconds) was reused, not measured beside it: say
    from where and when (conditions may have changed since; over an hour apart, it is another session)."""
    apart = began - datetime.fromisoformat(baseline.created_utc)
    if apart.total_seconds() <= 0:
        return []
    minutes = apart.total_seconds() / 60
    since = "under a minute" if minutes < 1 else f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
    session = " (another session)" if minutes > 60 else ""
    return [
        f"the baseline was reused from {folder}, measured {baseline.created_utc}, {since} before this run{session}: "
        "the speed-up compares runs measured apart; --force on the baseline's folder, or a fresh --out, measures both "
        "now"
    ]
