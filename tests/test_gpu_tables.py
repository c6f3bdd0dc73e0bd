"""The GPU data files state each cited figure once: cards of one die share a row through ``same_as``, which the
loaders resolve, and no two stated rows repeat one cited entry."""

import json
from importlib import resources

import pytest

from diffmeter.predict.devices import named_gpu, nvlinks, of_row, resolve_same_as
from diffmeter.predict.peaks import PEAKS

FILES = ("gpu_cache.json", "host_links.json", "gpu_memory.json", "gpu_power.json", "gpu_nvlink.json")
A100S = ("A100 80GB SXM", "A100 80GB PCIe", "A100 40GB SXM", "A100 40GB PCIe")


def raw_rows(file: str) -> dict[str, dict]:
    return json.loads(resources.files("diffmeter.predict").joinpath("data", file).read_text())["gpus"]


def test_the_four_a100s_read_one_l2_and_one_host_link():
    devices = [of_row(next(row for row in PEAKS if row.name == name)) for name in A100S]
    assert {d.l2_bytes for d in devices} == {40 * 2**20}
    assert {(d.host_link, d.host_link_bytes_per_s) for d in devices} == {("PCIe Gen4 x16", 32e9)}
    assert sum("same_as" not in raw_rows("gpu_cache.json")[name] for name in A100S) == 1
    assert sum("same_as" not in raw_rows("host_links.json")[name] for name in A100S) == 1


@pytest.mark.parametrize("file", FILES)
def test_no_cited_entry_is_stated_twice(file):
    stated: dict[str, str] = {}
    for name, entry in raw_rows(file).items():
        if "same_as" in entry or not entry.get("source"):
            continue
        text = json.dumps(entry, sort_keys=True)
        assert text not in stated, f"data/{file}: {name} repeats {stated[text]}'s entry: make it same_as that row"
        stated[text] = name


@pytest.mark.parametrize("file", FILES)
def test_every_row_names_a_card_of_the_table(file):
    assert set(raw_rows(file)) <= {row.name for row in PEAKS}


def test_an_alias_of_a_missing_row_or_of_an_alias_is_refused():
    stated = {"A": {"l2_mb": 40, "source": "s"}, "B": {"same_as": "A"}}
    assert resolve_same_as(stated, "t")["B"] is stated["A"]
    with pytest.raises(ValueError, match="C is the same as 'B'"):
        resolve_same_as({**stated, "C": {"same_as": "B"}}, "t")
    with pytest.raises(ValueError, match="D is the same as 'Z'"):
        resolve_same_as({**stated, "D": {"same_as": "Z"}}, "t")


CONSUMER = ("RTX 3060 12GB", "RTX 4060 Ti 16GB", "RTX 4070", "RTX 4070 Ti", "RTX 4070 Ti Super", "RTX 5060 Ti 16GB")
CONSUMER += ("RTX 5070", "RTX 5070 Ti")


@pytest.mark.parametrize("name", CONSUMER)
def test_every_consumer_card_carries_what_a_prediction_reads(name):
    """Memory, bandwidth, a bfloat16 peak, a TDP, a host link and an architecture each, cited in its data file."""
    device = named_gpu(name)
    assert device.memory_bytes and device.bandwidth_bytes_per_s and device.peak_tflops("bfloat16")
    assert device.tdp_w and device.host_link and device.architecture in ("ampere", "ada", "rtx-blackwell")
    for file in ("gpu_power.json", "host_links.json"):
        entry = raw_rows(file)[name]
        assert "same_as" in entry or entry["source"]


def test_the_eight_lane_cards_get_half_the_x16_rate():
    """The RTX 4060 Ti runs PCIe Gen4 x8 and the 5060 Ti Gen5 x8: offloading's transfers over them take twice as
    long as over a x16 card of the same generation."""
    assert named_gpu("rtx 4060 ti").host_link_bytes_per_s == named_gpu("rtx 4070").host_link_bytes_per_s / 2 == 16e9
    assert named_gpu("rtx 5060 ti").host_link_bytes_per_s == named_gpu("rtx 5070").host_link_bytes_per_s / 2 == 32e9


def test_nvlink_figures_resolve_per_card_each_cited():
    """The loader reads every row of data/gpu_nvlink.json, aliases resolved; a figure names its source and line,
    and the export cards read less than the cards they were cut from."""
    links = nvlinks()
    assert set(links) == set(raw_rows("gpu_nvlink.json"))
    assert links["A100 80GB SXM"] is links["A100 40GB SXM"] and links["L4"]["gb_s"] is None
    for name, link in links.items():
        assert link["source"] and link["quote"], name
        assert link["gb_s"] is None or link["link"].startswith("NVLink"), name
    assert links["A800 80GB SXM"]["gb_s"] < links["A100 80GB SXM"]["gb_s"]
    assert links["H800 SXM"]["gb_s"] < links["H100 SXM"]["gb_s"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sdxl", "flux-dev"])
def test_the_h200_is_predicted_no_slower_than_the_h100_whose_die_it_is(model):
    """The H200 SXM is the H100 SXM's GH100 (132 SMs, the same peaks, 50 MB of L2) with faster memory: every
    stage's bound, its expected range and the energy per image are no higher. Without its L2 row every byte was
    charged to memory: SDXL's energy per image 1.60-2.35 kJ against the H100's 1.39-2.05 kJ."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    h100, h200 = named_gpu("H100 SXM"), named_gpu("H200 SXM")
    assert h200.l2_bytes == h100.l2_bytes == 50 * 2**20
    work = operator_work(ProfileSpec(model=model, dtype="bf16"))
    slower, faster = predict_time(work, h100), predict_time(work, h200)
    for was, now in zip(slower.stages, faster.stages, strict=True):
        assert now.lower_s <= was.lower_s and all(map(float.__le__, now.expected_s, was.expected_s))
    assert all(map(float.__le__, faster.energy.per_output_j, slower.energy.per_output_j))
