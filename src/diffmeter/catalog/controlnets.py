"""ControlNets as data: each one's config, the base models it steers, and the diffusers pipeline that runs it.

``--controlnet NAME`` adds the ControlNet to its base pipeline's entry as one more component, ``controlnet``,
and swaps the pipeline class for the ControlNet pipeline diffusers runs it with (``StableDiffusionXLPipeline``
-> ``StableDiffusionXLControlNetPipeline``): the family then plans its calls (``families.controlnet``)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from diffmeter.catalog.entry import ComponentEntry, Named, PipelineEntry, closest_names
from diffmeter.errors import DiffmeterError

#: the component name diffusers' ControlNet pipelines give it
CONTROLNET = "controlnet"
#: the denoiser a ControlNet steers, as the pipelines name it
DENOISERS = ("transformer", "unet")


class ControlNetEntry(Named, BaseModel):
    """One ControlNet: its model class and config, the pipelines it runs in (base pipeline class -> ControlNet
    pipeline class) and the ``__call__`` arguments it needs there (a union model's ``control_mode``)."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    aliases: list[str] = []
    class_name: str = Field(alias="class")
    #: the catalog model it was trained for (its model card's base); others of the same pipeline and widths take it
    base: str
    config: dict[str, Any]
    published_params: int | None = None
    published_params_source: str | None = None
    pipelines: dict[str, str]
    #: config keys the base's denoiser must share (its widths): a ControlNet for another size of the same pipeline
    #: class (SD3.5 Large's on SD3 Medium) is refused
    matches: list[str] = []
    call: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: str = ""
    origin: str = "catalog"

    def component(self) -> ComponentEntry:
        return ComponentEntry.model_validate(
            {
                "class": self.class_name,
                "config": self.config,
                "published_params": self.published_params,
                "published_params_source": self.published_params_source,
            }
        )


@cache
def all_controlnets() -> tuple[ControlNetEntry, ...]:
    """Every shipped ControlNet: real ones first, then the tiny random ones the tests run."""
    data = resources.files("diffmeter.catalog") / "data" / "controlnets"
    found = []
    for folder, origin in ((data, "catalog"), (data / "tiny", "tiny")):
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            if path.name.endswith(".json"):
                found.append(ControlNetEntry.model_validate({**json.loads(path.read_text()), "origin": origin}))
    return tuple(found)


def find_controlnet(name: str) -> ControlNetEntry:
    """A ControlNet by alias or hub id, a folder diffusers saved one in, or one line with the closest names."""
    if Path(name).expanduser().is_dir():
        return local_controlnet(Path(name).expanduser())
    names = {known.lower(): entry for entry in all_controlnets() for known in (entry.id, *entry.aliases)}
    if name.lower() in names:
        return names[name.lower()]
    close = closest_names(name, names)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise DiffmeterError(
        f"unknown ControlNet '{name}'.{hint} Run `diffmeter models --controlnets` for the ControlNets diffmeter knows"
    )


def local_controlnet(root: Path) -> ControlNetEntry:
    """A ControlNet saved by diffusers (``save_pretrained``: its config.json), run in the pipelines the catalog's
    ControlNets of its class run in, held to the same widths of the denoiser (``matches``)."""
    try:
        raw = json.loads((root / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise DiffmeterError(
            f"'{root}' holds no readable config.json: point --controlnet at the folder a ControlNet was saved in "
            "(save_pretrained), or name one `diffmeter models --controlnets` lists"
        ) from None
    class_name = raw.get("_class_name", "")
    same = [known for known in all_controlnets() if known.class_name == class_name]
    if not same:
        classes = ", ".join(sorted({known.class_name for known in all_controlnets()}))
        raise DiffmeterError(
            f"{root} holds a {class_name or 'model without _class_name'}: diffmeter runs ControlNets of the classes "
            f"{classes}; pick one of those"
        )
    return ControlNetEntry(
        id=str(root),
        class_name=class_name,
        base="",
        config={key: value for key, value in raw.items() if not key.startswith("_")},
        pipelines={base: run for known in same for base, run in known.pipelines.items()},
        matches=sorted({key for known in same for key in known.matches}),
        origin="local",
    )


def with_controlnet(entry: PipelineEntry, name: str | None) -> PipelineEntry:
    """``entry`` with the ControlNet ``name`` as its ``controlnet`` component, run by its ControlNet pipeline; a
    ControlNet made for another base model is refused in one line."""
    if name is None:
        return entry
    found = find_controlnet(name)
    pipeline = found.pipelines.get(entry.pipeline_class)
    if pipeline is None:
        bases = ", ".join(found.pipelines)
        raise DiffmeterError(
            f"ControlNet {found.name} steers {bases}; {entry.name} is a {entry.pipeline_class}: pick a ControlNet "
            f"for {entry.name} (`diffmeter models --controlnets`) or a model its base runs"
        )
    if found.origin != "local" and found.is_tiny != entry.is_tiny:
        kinds = ("a tiny random", "a real") if found.is_tiny else ("a real", "a tiny random")
        raise DiffmeterError(
            f"ControlNet {found.name} is {kinds[0]} one and {entry.name} {kinds[1]} pipeline: pair tiny with tiny"
        )
    denoiser = next((entry.components[n].config for n in DENOISERS if n in entry.components), {})
    differ = [key for key in found.matches if found.config.get(key) != denoiser.get(key)]
    if differ:
        said = ", ".join(f"{key} {found.config.get(key)} (its denoiser: {denoiser.get(key)})" for key in differ)
        raise DiffmeterError(
            f"ControlNet {found.name} is made for another denoiser than {entry.name}'s: {said}; pick a ControlNet for "
            f"{entry.name} (`diffmeter models --controlnets`)"
        )
    component = found.component()
    component.config = as_run(found.class_name, component.config, denoiser)
    return entry.model_copy(
        update={
            "pipeline_class": pipeline,
            "components": {**entry.components, CONTROLNET: component},
            "sources": {**entry.sources, CONTROLNET: found.sources.get("config", found.id)},
            "extra": {**entry.extra, CONTROLNET: {"id": found.id, "name": found.name, "call": found.call}},
        }
    )


def as_run(class_name: str, config: dict[str, Any], denoiser: dict[str, Any]) -> dict[str, Any]:
    """The ControlNet's config as its pipeline leaves the module: StableDiffusion3ControlNetPipeline.__init__ gives an
    SD3 ControlNet without a position embedding of its own (``use_pos_embed: false``, SD3.5's) a copy of the
    transformer's (pipeline_stable_diffusion_3_controlnet.py 222-224; controlnet_sd3.py 241-251,
    ``_get_pos_embed_from_transformer``): built here as its own, the same PatchEmbed, so it is counted and held."""
    if class_name != "SD3ControlNetModel" or config.get("use_pos_embed", True):
        return config
    import inspect

    from diffusers import SD3Transformer2DModel

    defaults = {name: p.default for name, p in inspect.signature(SD3Transformer2DModel.__init__).parameters.items()}
    keys = ("sample_size", "patch_size", "in_channels", "pos_embed_max_size")
    copied = {key: denoiser.get(key, defaults[key]) for key in keys}
    return {**config, **copied, "use_pos_embed": True, "pos_embed_type": "sincos"}


def controlnet_of(entry: PipelineEntry) -> dict[str, Any] | None:
    """The ControlNet an entry was given (``with_controlnet``): its id, name and call arguments; None without."""
    return entry.extra.get(CONTROLNET)
