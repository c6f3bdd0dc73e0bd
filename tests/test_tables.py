"""Tables at 80 and 120 columns: nothing truncated, no word or number broken, ids whole."""

import io

import pytest
from rich.console import Console
from rich.text import Text

from diffmeter import profile, units
from diffmeter.catalog import all_entries
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.tables import profile_table, summary_table

WIDTHS = [80, 120]
MODELS = ["flux-dev", "wan21-t2v-14b", "pixart-sigma-1024", "sd15"]


def render(renderable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def cell_words(table: FittedTable, width: int) -> list[str]:
    """Every word of every cell in the columns shown at ``width``."""
    shown = {column.header for column in table.fitted(width).columns}
    words = []
    for row in table.rows:
        for column, cell in zip(table.columns, row.cells, strict=True):
            if column.header in shown:
                words += Text.from_markup(cell).plain.split()
    return words


def check(table: FittedTable, width: int, whole: list[str]) -> str:
    text = render(table, width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    flat = " ".join(text.split())
    for value in whole:
        assert value in flat, f"{value!r} broken or missing at {width} columns"
    lines = text.splitlines()
    for word in cell_words(table, width):
        assert any(word in line for line in lines), f"{word!r} broken at {width} columns"
    return text


@pytest.mark.parametrize("width", WIDTHS)
def test_profile_tables_fit(width):
    profiles = [profile(name, steps=1) for name in MODELS]
    check(profile_table(profiles[0]), width, ["black-forest-labs/FLUX.1-dev", "text_encoder_2", "37.19 TMACs"])
    text = check(summary_table(profiles), width, MODELS)
    if width == 80:
        assert "not shown at this width:" in text  # columns give way, and the caption says which


def test_a_videos_frames_are_said_beside_its_pixel_size_not_inside_it():
    found = profile("wan21-t2v-14b", steps=1)
    title = profile_table(found).title
    assert f"{found.width}x{found.height} px (WxH), {found.num_frames} frames, 1 step" in title, title
    assert "f px" not in title


def test_the_summary_rows_say_a_scheduler_calls_the_denoiser_more_than_once_per_step():
    """SD 1.5's PNDM makes --steps 10 eleven denoiser calls: a row showing only "10" beside the MACs per step left
    its total unexplained (11 x per step, not 10 x)."""
    found = profile("sd15", steps=10)
    assert found.denoiser_steps == 11
    (row,) = summary_table([found]).rows
    assert row.cells[2] == "10 (11 denoiser steps)"


def test_the_total_row_splits_the_whole_generation_by_kind():
    """The total row's kind column holds the whole generation's matmul / convolution / attention shares (the
    components' MACs of each kind summed), its FLOPs beside its MACs."""
    found = profile("sd15", steps=1)
    row = next(row for row in profile_table(found).rows if row.cells[0] == "total")
    kinds = {kind: sum(c.macs_by_kind.get(kind, 0) for c in found.components) for kind in ("matmul", "convolution")}
    shares = row.cells[7].split(" / ")
    assert shares[:2] == [f"{100 * kinds[kind] / found.total_macs:.0f}%" for kind in ("matmul", "convolution")]
    assert row.cells[6] == f"{units.macs(found.total_macs)} ({units.flops(found.total_flops)})"


@pytest.mark.parametrize("width", WIDTHS)
def test_run_and_optimization_tables_fit(width, tmp_path):
    import torch

    from diffmeter.optimize.matrix import compatibility
    from diffmeter.report.optimizations_table import model_table
    from diffmeter.report.run_table import run_table
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    result, _ = bench(BenchSpec(model="tiny-flux", steps=2, iterations=1), out=tmp_path)
    text = render(run_table(result), width)
    assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
    assert "diffmeter/tiny-flux" in " ".join(text.split())
    rows = compatibility(all_entries()[0], torch.device("cpu"))
    check(model_table("optimizations for flux-dev on cpu", rows), width, ["first-block-cache", "fp8-text-encoder"])


def test_a_column_with_nothing_in_it_gives_way_before_any_other():
    """Dropping by importance alone kept an all-dash column (energy on a CPU) and hid one with figures."""
    table = FittedTable(
        "t", [Column("name", justify="left"), Column("quality", drop=1), Column("energy / image", drop=9)]
    )
    table.add_row("tiny-sd", "31.20 dB", "-")
    table.add_row("tiny-flux", "identical", "-")
    width = sum(table.narrowest(index) for index in range(3)) + 3 * 3  # one short of the three columns
    assert [column.header for column in table.fitted(width).columns] == ["name", "quality"]
    table.add_row("tiny-dit", "-", "12.5 J")
    assert [column.header for column in table.fitted(width).columns] == ["name", "energy / image"]


def test_a_psnr_mean_says_it_is_over_the_images_that_differ():
    """ "PSNR mean 83.01 dB (min 83.01 dB), 4 of 5 images identical": the mean was of the one image that differs
    (an identical image's PSNR is infinite), which the line did not say (a new user's trial)."""
    from diffmeter.measure.quality_schema import ImageQuality, summarize
    from diffmeter.report.run_table import quality_line

    def image(seed, psnr):
        return ImageQuality(path="a", baseline_path="b", seed=seed, identical=psnr is None, psnr_db=psnr, ssim=1.0)

    quality = summarize("base", [image(0, 83.0), *(image(seed, None) for seed in range(1, 5))], None, {})
    assert quality.mean_psnr_db == 83.0 and quality.identical == 4
    assert "PSNR mean 83.00 dB over the 1 differing image (min 83.00 dB)" in quality_line(quality)
    quality = summarize("base", [image(0, 40.0), image(1, 50.0)], None, {})
    assert "PSNR mean 45.00 dB (min 40.00 dB)" in quality_line(quality)  # none identical: the mean of all
