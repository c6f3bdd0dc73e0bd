"""`diffmeter models MODEL`: each published quantized file's size in GiB (as GPU memory is counted) first, to the
published figure's precision, with the figure as published beside it (text) and kept as ``size`` (``--json``)."""

from __future__ import annotations

import json

from diffmeter.catalog.quantized_files import UNITS, PublishedSize, all_files
from diffmeter.report.quantized_files_table import published_text

GB = "GB (Hugging Face file list: decimal, 10^9 bytes, rounded to 3 significant figures)"


def test_a_published_size_in_gib_is_no_more_precise_than_the_figure():
    # worked by hand: 23.8e9 / 2^30 = 22.165; 6.7e9 / 2^30 = 6.240; 12e9 / 2^30 = 11.176; 128e6 / 2^30 = 0.11921;
    # 4,032,341,280 / 2^30 = 3.7554 (exact bytes: two decimals)
    assert PublishedSize(value=23.8, unit=GB).gib() == 22.2
    assert PublishedSize(value=6.7, unit=GB).gib() == 6.2
    assert PublishedSize(value=12, unit=GB).gib() == 11 and PublishedSize(value=12, unit=GB).gib_decimals() == 0
    assert PublishedSize(value=128, unit="MB (Hugging Face file list: decimal, 10^6 bytes)").gib() == 0.119
    assert PublishedSize(value=4032341280, unit="B").gib() == 3.76


def test_every_shipped_files_gib_figure_stands_for_its_published_bytes():
    """The GiB figure, read as its last digit's half either side, overlaps the bytes the published figure stands
    for: no shipped figure is converted wrong or rounded past what it says."""
    for file in all_files():
        size = file.size
        half = 10 ** -size.gib_decimals() / 2
        low, high = (end / 2**30 for end in size.byte_range())
        assert size.gib() - half <= high and low <= size.gib() + half, (file.file, size)
        assert abs(size.gib() - size.value * UNITS[size.unit.split()[0]] / 2**30) <= half, (file.file, size)


def test_models_shows_gib_first_with_the_published_figure_beside_it(cli):
    files = {file.file: file for file in all_files() if file.model == "flux-dev"}
    assert published_text(files["flux1-dev-F16.gguf"]) == "22.2 GiB (23.8 GB)"
    assert published_text(files["flux1-dev-Q2_K.gguf"]) == "3.76 GiB (4,032,341,280 B)"
    code, out, err = cli("models", "flux-dev")
    assert code == 0, err
    assert "22.2 GiB (23.8 GB)" in out and "3.76 GiB (4,032,341,280 B)" in out
    assert "Published: the size in GiB (2^30 bytes" in " ".join(out.split())
    code, out, err = cli("models", "flux-dev", "--json")
    assert code == 0, err
    rows = {row["file"]: row for row in json.loads(out)["files"]}
    f16 = rows["flux1-dev-F16.gguf"]
    assert f16["size"] == {"value": 23.8, "unit": GB}  # as published, kept
    assert f16["size_gib"] == 22.2 and f16["size_bytes"] == [23_750_000_000, 23_850_000_000]
    q2 = rows["flux1-dev-Q2_K.gguf"]
    assert q2["size_gib"] == 3.76 and q2["size_bytes"] == [4_032_341_280, 4_032_341_280]
