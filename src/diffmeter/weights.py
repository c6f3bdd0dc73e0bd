"""Where a run's weights come from, decided from the disk alone (no library imported), so a missing checkpoint is
reported before anything loads and ``doctor`` lists the cached models quickly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diffmeter.catalog.controlnets import CONTROLNET, controlnet_of
from diffmeter.catalog.entry import PipelineEntry
from diffmeter.catalog.local import hf_cache_directory
from diffmeter.errors import DiffmeterError

WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class WeightsSource:
    """Where the weights come from: ``pretrained`` (a directory), ``random`` or ``tiny-random``."""

    kind: str
    path: Path | None = None
    variant: str | None = None

    @property
    def random(self) -> bool:
        return self.kind != "pretrained"

    def describe(self) -> str:
        if self.kind == "pretrained" and self.path is None:
            return "pretrained weights, located on the machine that runs it"
        if self.kind == "pretrained":
            return f"pretrained weights from {self.path}" + (f" (variant {self.variant})" if self.variant else "")
        if self.kind == "tiny-random":
            return "tiny random weights (a test pipeline: timings say nothing about the real model)"
        return "random weights at real size, from the catalog configs (timing and memory are real; images are noise)"


def locate_weights(entry: PipelineEntry, random_weights: bool) -> WeightsSource:
    """Decide where weights come from, or fail with where we looked and how to get them."""
    if entry.is_tiny:
        return WeightsSource("tiny-random")
    if random_weights:
        return WeightsSource("random")
    controlnet_root(entry)  # its weights found first: one line says what to download
    if entry.origin == "local":
        root = Path(entry.sources["configs"])
    else:
        root = hf_cache_directory(entry.id)
        if root is None:
            from huggingface_hub.constants import HF_HUB_CACHE

            raise DiffmeterError(
                f"weights for {entry.id} are not in the local Hugging Face cache (looked in {HF_HUB_CACHE}): "
                f"download them with `hf download {entry.id}`, pass a local diffusers directory as MODEL, "
                "or add --random-weights to time the architecture with random weights"
            )
    return WeightsSource("pretrained", root, _variant(entry, root))


def controlnet_root(entry: PipelineEntry) -> Path | None:
    """The local Hugging Face cache folder of the entry's ControlNet (None without one), or one line saying how to
    get it."""
    steering = controlnet_of(entry)
    if steering is None:
        return None
    if Path(steering["id"]).is_dir():  # a folder it was saved in (--controlnet FOLDER, a saved ControlNet pipeline)
        return Path(steering["id"])
    root = hf_cache_directory(steering["id"])
    if root is None:
        raise DiffmeterError(
            f"weights for the ControlNet {steering['id']} are not in the local Hugging Face cache: download them with "
            f"`hf download {steering['id']}`, or add --random-weights"
        )
    return root


def _variant(entry: PipelineEntry, root: Path) -> str | None:
    """``fp16`` when a component ships only fp16-variant files; fail when weights are missing."""
    missing, fp16_only = [], []
    for name in entry.components:
        if name == CONTROLNET:  # its own repository (``controlnet_root``)
            continue
        files = [f.name for f in (root / name).glob("*") if f.name.endswith(WEIGHT_SUFFIXES)]
        if not files:
            missing.append(name)
        elif all(".fp16." in file for file in files):
            fp16_only.append(name)
    if missing:
        raise DiffmeterError(
            f"{root} has configs but no weights for {', '.join(missing)} (looked for *.safetensors and *.bin): "
            f"download the full pipeline (`hf download {entry.id}`) or add --random-weights"
        )
    return "fp16" if fp16_only else None
