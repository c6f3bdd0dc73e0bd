"""The GPU data files state each cited figure once: cards of one die share a row through ``same_as``, which the
loaders resolve, and no two stated rows repeat one cited entry."""

import json
from importlib import resources

import pytest

from diffmeter.predict.devices import of_row, resolve_same_as
from diffmeter.predict.peaks import PEAKS

FILES = ("gpu_cache.json", "host_links.json", "gpu_memory.json", "gpu_power.json")
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
