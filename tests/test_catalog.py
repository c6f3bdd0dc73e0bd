"""The shipped catalog: every entry loads, builds, and matches the released models."""

import json

import pytest
from tiny_runs import REAL

from diffmeter.catalog import all_entries, resolve
from diffmeter.errors import DiffmeterError
from diffmeter.pipelines import build_component, component_class, count_stored_elements

REQUIRED = [
    "black-forest-labs/FLUX.1-dev",
    "black-forest-labs/FLUX.1-schnell",
    "stable-diffusion-v1-5/stable-diffusion-v1-5",
    "stabilityai/stable-diffusion-2-1-base",
    "stabilityai/stable-diffusion-2-1",
    "stabilityai/stable-diffusion-xl-base-1.0",
    "stabilityai/stable-diffusion-3-medium-diffusers",
    "stabilityai/stable-diffusion-3.5-medium",
    "stabilityai/stable-diffusion-3.5-large",
    "PixArt-alpha/PixArt-XL-2-512x512",
    "PixArt-alpha/PixArt-XL-2-1024-MS",
    "PixArt-alpha/PixArt-Sigma-XL-2-1024-MS",
    "Efficient-Large-Model/Sana_600M_512px_diffusers",
    "Efficient-Large-Model/Sana_600M_1024px_diffusers",
    "Efficient-Large-Model/Sana_1600M_512px_diffusers",
    "Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    "Alpha-VLLM/Lumina-Image-2.0",
    "Alpha-VLLM/Lumina-Next-SFT-diffusers",
    "kandinsky-community/kandinsky-3",
    "Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers",
    "facebook/DiT-XL-2-256",
    "facebook/DiT-XL-2-512",
]
PUBLISHED = [
    (entry, name) for entry in REAL for name, component in entry.components.items() if component.published_params
]


def test_catalog_has_every_required_pipeline_with_sources():
    ids = {entry.id for entry in REAL}
    assert set(REQUIRED) <= ids
    for entry in REAL:
        assert entry.sources, entry.id
        assert entry.aliases, entry.id


def test_names_are_unique():
    names = [name.lower() for entry in all_entries() for name in (entry.id, *entry.aliases)]
    assert len(names) == len(set(names))


@pytest.mark.slow
@pytest.mark.parametrize("entry,name", PUBLISHED, ids=lambda v: v if isinstance(v, str) else v.name)
def test_parameter_count_matches_published_figure(entry, name):
    """Published figures are checkpoint sizes or papers' counts: compare what a checkpoint stores."""
    component = entry.components[name]
    counted = count_stored_elements(build_component(component, "meta"))
    assert abs(counted - component.published_params) / component.published_params < 0.005, (
        f"{entry.name}/{name}: {counted} vs published {component.published_params} "
        f"({component.published_params_source})"
    )


def test_published_figures_cover_most_components():
    total = sum(len(entry.components) for entry in REAL)
    assert len(PUBLISHED) / total > 0.75


@pytest.mark.parametrize("name", ["flux-dev", "FLUX-DEV", "black-forest-labs/FLUX.1-dev", "sd15", "tiny-sd"])
def test_resolve_by_alias_or_hub_id(name):
    assert resolve(name).family in ("flux", "sd")


def test_unknown_name_suggests_close_matches():
    with pytest.raises(DiffmeterError, match="flux-dev"):
        resolve("flux-deb")


def _write_pipeline_dir(root, entry, drop=()):
    index = {
        "_class_name": entry.pipeline_class,
        "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "DDIMScheduler"],
    }
    for name, component in entry.components.items():
        library = (
            "transformers" if component.class_name.startswith(("CLIP", "T5", "Gemma", "Bert", "UMT5")) else "diffusers"
        )
        index[name] = [library, component.class_name]
        if name not in drop:
            (root / name).mkdir(parents=True)
            (root / name / "config.json").write_text(
                json.dumps({"_class_name": component.class_name, **component.config})
            )
    (root / "model_index.json").write_text(json.dumps(index))


def test_local_directory_profiles_like_the_catalog_entry(tmp_path):
    from diffmeter import profile

    entry = resolve("tiny-sd3")
    _write_pipeline_dir(tmp_path, entry)
    local, catalog = profile(str(tmp_path), height=32, width=32, steps=2), profile("tiny-sd3", steps=2)
    assert local.origin == "local" and local.family == "sd3"
    assert [c.macs for c in local.components] == [c.macs for c in catalog.components]


def test_hub_id_in_local_hf_cache_is_found_offline(tmp_path, monkeypatch):
    entry = resolve("tiny-flux")
    snapshot = tmp_path / "models--someone--my-flux" / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--someone--my-flux" / "refs").mkdir()
    (tmp_path / "models--someone--my-flux" / "refs" / "main").write_text("0123456789abcdef")
    _write_pipeline_dir(snapshot, entry)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    resolved = resolve("someone/my-flux")
    assert resolved.family == "flux" and resolved.id == "someone/my-flux"
    assert set(resolved.components) == set(entry.components)


def test_directory_without_model_index_is_refused(tmp_path):
    with pytest.raises(DiffmeterError, match="no model_index.json"):
        resolve(str(tmp_path))


def test_unknown_pipeline_family_is_refused(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "MysteryPipeline"}))
    with pytest.raises(DiffmeterError, match="no diffmeter family describes MysteryPipeline .*adding-a-family.md"):
        resolve(str(tmp_path))


def test_an_unknown_pipeline_names_the_family_sharing_its_components(tmp_path):
    index = {
        "_class_name": "MyFluxInpaintPipeline",
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
    }
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(DiffmeterError) as refused:
        resolve(str(tmp_path))
    message = str(refused.value)
    assert "nearest family is 'flux' (shares AutoencoderKL, FluxTransformer2DModel, T5EncoderModel)" in message
    assert "\n" not in message and "docs/adding-a-family.md" in message


def test_missing_component_config_is_named(tmp_path):
    _write_pipeline_dir(tmp_path, resolve("tiny-sd"), drop=("vae",))
    with pytest.raises(DiffmeterError, match="component 'vae' has no config"):
        resolve(str(tmp_path))


@pytest.mark.parametrize("entry", [e for e in all_entries() if "runtime" in e.extra], ids=lambda e: e.name)
def test_flow_matching_families_are_the_ones_shipped_with_flow_matching_schedulers(entry):
    """Family.flow_matching picks the ladder's sampler and refuses noise-prediction schedulers:
    it must agree with the scheduler the pipeline really ships."""
    from diffmeter.families import get_family

    scheduler = entry.extra["runtime"]["scheduler"]["class"]
    assert get_family(entry.family).flow_matching == scheduler.startswith("FlowMatch"), scheduler


PUBLISHED_COMPUTE = [(e, f) for e in all_entries() for f in e.extra.get("published_compute", [])]


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "figure"), PUBLISHED_COMPUTE, ids=[e.name for e, _ in PUBLISHED_COMPUTE])
def test_published_compute_figures_agree_with_the_count(entry, figure):
    """A compute figure an entry cites (docs/catalog-compute.md shows them) is what diffmeter counts for
    the same thing at the same settings, within 1%."""
    from diffmeter.flops.profile import profile

    counted = profile(entry.name, **figure["settings"])
    if figure["counts"] == "generation":
        ours = counted.total_macs
    else:
        (component,) = [c for c in counted.components if c.name == figure["component"]]
        ours = component.macs_per_call
    assert ours == pytest.approx(figure["macs"], rel=0.01), figure["figure"]


def test_the_compute_table_in_the_docs_lists_every_catalog_model():
    """docs/catalog-compute.md is generated (python benchmarks/catalog_compute.py): a new entry needs a rerun."""
    from pathlib import Path

    table = (Path(__file__).parents[1] / "docs" / "catalog-compute.md").read_text()
    missing = [e.name for e in all_entries() if not e.is_tiny and f"| {e.name} |" not in table]
    assert not missing, f"rerun python benchmarks/catalog_compute.py for {missing}"


def test_component_classes_only_a_pipeline_package_exports_are_found():
    """LTX-2's text connectors and vocoder live in diffusers.pipelines.ltx2, not at diffusers' top level."""
    connectors = component_class("LTX2TextConnectors")
    assert connectors.__module__ == "diffusers.pipelines.ltx2.connectors"
    with pytest.raises(DiffmeterError, match="'NoSuchModel' is in neither diffusers"):
        component_class("NoSuchModel")


@pytest.mark.parametrize(
    ("asked", "first", "among"),
    # "ltx" suggested ltx2, tiny-ltx and tiny-ltx2, never ltx-video (a new user's trial): names it begins come first
    [("fluxdev", "flux-dev", ()), ("sdxl-turbo", "sd35-large-turbo", ()), ("ltx", "ltx2", ("ltx-video",))],
)
def test_an_unknown_model_suggests_each_entry_once(asked, first, among):
    """`profile fluxdev` suggested flux-dev and flux1-dev, one entry's id and alias: each entry is named once, by its
    closest name."""
    with pytest.raises(DiffmeterError, match="Did you mean") as raised:
        resolve(asked)
    suggested = str(raised.value).split("Did you mean ")[1].split("?")[0].split(", ")
    assert suggested[0] == first and len(suggested) == 3
    assert set(among) <= set(suggested) and not [name for name in suggested if name.startswith("tiny-")]
    assert len({resolve(name).id for name in suggested}) == len(suggested)
