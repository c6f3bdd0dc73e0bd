"""Each published figure is predicted on the card its source names: where the source states the card's memory
("A100 (we used the 40 GB version)"), the table row it is predicted on has that memory."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

FIGURES = Path(__file__).parents[1] / "benchmarks" / "published_figures.yaml"
#: the first memory size a text names ("40GB", "40 GB"): the card's, in a row name and in gpu_as_published alike
SIZE = re.compile(r"(\d+)\s?GB\b")


def test_a_stated_memory_size_is_the_rows():
    figures = yaml.safe_load(FIGURES.read_text())["figures"]
    checked, wrong = 0, []
    for figure in figures:
        row, said = SIZE.search(figure.get("gpu") or ""), SIZE.search(figure.get("gpu_as_published") or "")
        if row and said:
            checked += 1
            if row.group(1) != said.group(1):
                wrong.append(f"{figure['id']}: {figure['gpu']} for '{figure['gpu_as_published']}'")
    assert checked >= 40 and not wrong, wrong
    # the diffusers PyTorch 2.0 page's benchmark: its authors' post names the 40 GB A100
    pt2doc = [f for f in figures if f["id"].startswith("pt2doc-sd14-a100")]
    assert len(pt2doc) == 24 and {f["gpu"] for f in pt2doc} == {"A100 40GB SXM"}
