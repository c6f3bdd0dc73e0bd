"""Entries read from a diffusers directory on disk (a local folder or an HF cache snapshot).

Only the JSON configs are read (model_index.json and each component's config.json),
so a directory without weights profiles just as well.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from diffmeter.catalog import pipeline_defaults
from diffmeter.catalog.controlnets import CONTROLNET, DENOISERS, all_controlnets, as_run
from diffmeter.catalog.entry import ComponentEntry, Defaults, PipelineEntry
from diffmeter.errors import DiffmeterError

#: pipeline classes that run like a catalog family but name no catalog entry (older aliases; the image-to-video
#: pipelines a family runs a text-to-video checkpoint through, ``Family.conditioned_pipeline``)
PIPELINE_ALIASES = {
    "Lumina2Text2ImgPipeline": "lumina2",
    "LuminaText2ImgPipeline": "lumina_next",
    "LTXImageToVideoPipeline": "ltx",
    "LTX2ImageToVideoPipeline": "ltx2",
}

_RUNTIME_ONLY = {
    "scheduler",
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
    "processor",  # a transformers processor (QwenImage21Pipeline): tokenizer + image processor
    "feature_extractor",
    "image_processor",  # a transformers image processor (WanImageToVideoPipeline)
    "safety_checker",
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
    family = family_of_pipeline(known).get(pipeline_class)
    if family is None:
        raise DiffmeterError(unknown_pipeline_message(pipeline_class, index, known, index_path))
    components, init = {}, {}
    for name, spec in index.items():
        if name.startswith("_") or name in _RUNTIME_ONLY:
            continue
        if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(part, str | None) for part in spec)):
            init[name] = spec  # a plain __init__ argument (Wan 2.2's boundary_ratio, Qwen-Image 2.1's sample_sigmas)
            continue
        if spec[1] is None:
            continue
        config_path = root / name / "config.json"
        if spec[1].endswith("Guidance") and (root / name / "guider_config.json").is_file():
            config_path = root / name / "guider_config.json"  # what diffusers guiders save
        if not config_path.is_file():
            raise DiffmeterError(f"component '{name}' has no config at {config_path}")
        config = {k: v for k, v in _read_json(config_path).items() if not k.startswith("_")}
        if spec[1].endswith("Guidance"):  # a guider: configuration, not a module to count
            init[name] = {"class": spec[1], "config": config}
            continue
        components[name] = ComponentEntry(class_name=spec[1], config=config)
    template, same_model = _same_family(known, family, repo_id or index.get("_name_or_path"))
    extra = {**(template.extra if template else {}), "pipeline_init": init}
    extra.pop("scheduler", None)  # the folder's own scheduler, never the template's (nor what it says of its own)
    extra.pop("scheduler_note", None)
    if "processor" in extra:  # the folder's own vision processor bounds (Qwen-Image-Edit), where it has them
        extra["processor"] = _processor_bounds(root / "processor" / "preprocessor_config.json", extra["processor"])
    if CONTROLNET in components:  # a saved ControlNet pipeline: its ControlNet is the folder's own
        components[CONTROLNET] = _controlnet_as_run(components)
        extra[CONTROLNET] = {"id": str(root / CONTROLNET), "name": f"{root.name}/{CONTROLNET}", "call": {}}
    scheduler_path = root / "scheduler" / "scheduler_config.json"
    if scheduler_path.is_file():  # Wan 2.2 switches experts where its timesteps cross a boundary
        scheduler = _read_json(scheduler_path)
        extra["scheduler"] = {"class": scheduler.get("_class_name"), "config": scheduler}
    entry = PipelineEntry(
        id=repo_id or str(root),
        aliases=[],
        family=family,
        pipeline_class=pipeline_class,
        defaults=template.defaults if template else Defaults(height=1024, width=1024, steps=30, guidance_scale=5.0),
        text_max_length=dict(template.text_max_length) if template else {},
        components=components,
        sources={"configs": str(root)},
        extra=extra,
        origin="local",
    )
    if same_model:  # the catalog's own model: keep its model-card defaults
        return entry
    defaults, lengths = pipeline_defaults.derive(entry, root, template)
    sources = {**entry.sources, "defaults": f"{pipeline_class}.__call__ defaults and the folder's configs"}
    return entry.model_copy(update={"defaults": defaults, "text_max_length": lengths, "sources": sources})


def family_of_pipeline(known: tuple[PipelineEntry, ...]) -> dict[str, str]:
    """Pipeline class -> family, from the catalog's own entries (and older class aliases), and the ControlNet
    pipeline classes the catalog's ControlNets run their bases in (``StableDiffusionXLControlNetPipeline``)."""
    families = {**PIPELINE_ALIASES, **{entry.pipeline_class: entry.family for entry in known}}
    steered = {run: families.get(base) for found in all_controlnets() for base, run in found.pipelines.items()}
    return {**{run: family for run, family in steered.items() if family}, **families}


def _controlnet_as_run(components: dict[str, ComponentEntry]) -> ComponentEntry:
    """A saved pipeline's ControlNet as its pipeline leaves it (``controlnets.as_run``: SD3.5's position embedding)."""
    found = components[CONTROLNET]
    denoiser = next((components[name].config for name in DENOISERS if name in components), {})
    return found.model_copy(update={"config": as_run(found.class_name, found.config, denoiser)})


def unknown_pipeline_message(pipeline_class: str, index: dict, known: tuple[PipelineEntry, ...], path: Path) -> str:
    """One line: no family describes ``pipeline_class``; the nearest one, and where adding one is explained."""
    classes = {spec[1] for spec in index.values() if isinstance(spec, list) and len(spec) == 2}
    shared = {}
    for entry in known:
        common = classes & {component.class_name for component in entry.components.values()}
        if len(common) > len(shared.get(entry.family, ())):
            shared[entry.family] = common
    if shared:
        family, common = max(shared.items(), key=lambda item: len(item[1]))
        why = f"shares {', '.join(sorted(common))}"
    else:
        names = family_of_pipeline(known)
        close = difflib.get_close_matches(pipeline_class, names, n=1, cutoff=0.0)
        family, why = (names[close[0]], f"closest class name {close[0]}") if close else (None, "")
    nearest = f"; the nearest family is '{family}' ({why})" if family else ""
    return (
        f"no diffmeter family describes {pipeline_class or 'a pipeline without _class_name'} ({path}){nearest}; "
        "docs/adding-a-family.md shows how to add one"
    )


def _processor_bounds(path: Path, template: dict) -> dict:
    """The pixel bounds a Qwen2-VL image processor saved in ``path`` resizes images within (``size``'s
    shortest_edge/longest_edge, older files' min_pixels/max_pixels); the template's where the folder has no file."""
    if not path.is_file():
        return template
    config = _read_json(path)
    size = config.get("size") or {}
    low, high = size.get("shortest_edge", config.get("min_pixels")), size.get("longest_edge", config.get("max_pixels"))
    if low is None or high is None:
        return template
    return {"value": {"min_pixels": low, "max_pixels": high}, "note": f"the folder's {path}"}


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
