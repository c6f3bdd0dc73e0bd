"""Entries read from a diffusers directory on disk (a local folder or an HF cache snapshot).

Only the JSON configs are read (model_index.json and each component's config.json),
so a directory without weights profiles just as well.
"""

from __future__ import annotations

import json
from pathlib import Path

from diffmeter.catalog import pipeline_defaults
from diffmeter.catalog.entry import ComponentEntry, Defaults, PipelineEntry
from diffmeter.errors import DiffmeterError

FAMILY_OF_PIPELINE = {
    "FluxPipeline": "flux",
    "StableDiffusionPipeline": "sd",
    "StableDiffusionXLPipeline": "sdxl",
    "StableDiffusion3Pipeline": "sd3",
    "PixArtAlphaPipeline": "pixart",
    "PixArtSigmaPipeline": "pixart",
    "SanaPipeline": "sana",
    "Lumina2Pipeline": "lumina2",
    "Lumina2Text2ImgPipeline": "lumina2",
    "LuminaPipeline": "lumina_next",
    "LuminaText2ImgPipeline": "lumina_next",
    "Kandinsky3Pipeline": "kandinsky3",
    "HunyuanDiTPipeline": "hunyuandit",
    "DiTPipeline": "dit",
    "WanPipeline": "wan",
    "CogVideoXPipeline": "cogvideox",
}

_RUNTIME_ONLY = {
    "scheduler",
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
    "feature_extractor",
    "safety_checker",
    "image_encoder",
    "id2label",
}


def hf_cache_directory(repo_id: str) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local HF cache, if it is there."""
    if repo_id.count("/") != 1:
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def entry_from_directory(root: Path, known: tuple[PipelineEntry, ...], repo_id: str | None = None) -> PipelineEntry:
    """Build an entry from ``root``: its configs, and the defaults of its own pipeline class (a
    catalog entry of the same family fills what the class does not say)."""
    index_path = root / "model_index.json"
    if not index_path.is_file():
        raise DiffmeterError(
            f"'{root}' has no model_index.json: point MODEL at the root of a diffusers "
            "pipeline directory (the folder holding model_index.json)"
        )
    index = _read_json(index_path)
    pipeline_class = index.get("_class_name", "")
    family = FAMILY_OF_PIPELINE.get(pipeline_class)
    if family is None:
        supported = ", ".join(sorted(FAMILY_OF_PIPELINE))
        raise DiffmeterError(f"unknown pipeline family '{pipeline_class}' in {index_path}; supported: {supported}")
    components = {}
    for name, spec in index.items():
        if name.startswith("_") or name in _RUNTIME_ONLY or not isinstance(spec, list):
            continue
        if spec[1] is None:
            continue
        config_path = root / name / "config.json"
        if not config_path.is_file():
            raise DiffmeterError(f"component '{name}' has no config at {config_path}")
        config = {k: v for k, v in _read_json(config_path).items() if not k.startswith("_")}
        components[name] = ComponentEntry(class_name=spec[1], config=config)
    template, same_model = _same_family(known, family, repo_id or index.get("_name_or_path"))
    entry = PipelineEntry(
        id=repo_id or str(root),
        aliases=[],
        family=family,
        pipeline_class=pipeline_class,
        defaults=template.defaults if template else Defaults(height=1024, width=1024, steps=30, guidance_scale=5.0),
        text_max_length=dict(template.text_max_length) if template else {},
        components=components,
        sources={"configs": str(root)},
        extra=template.extra if template else {},
        origin="local",
    )
    if same_model:  # the catalog's own model: keep its model-card defaults
        return entry
    defaults, lengths = pipeline_defaults.derive(entry, root, template)
    sources = {**entry.sources, "defaults": f"{pipeline_class}.__call__ defaults and the folder's configs"}
    return entry.model_copy(update={"defaults": defaults, "text_max_length": lengths, "sources": sources})


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DiffmeterError(f"cannot read {path}: {error}") from None


def _same_family(known: tuple[PipelineEntry, ...], family: str, repo_id: str | None):
    """(a catalog entry of ``family``, whether it is the very model ``repo_id`` names)."""
    real = [entry for entry in known if entry.family == family and entry.origin == "catalog"]
    exact = [entry for entry in real if repo_id and entry.id.lower() == repo_id.lower()]
    return (exact or real or [None])[0], bool(exact)
