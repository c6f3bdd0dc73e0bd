"""The report's plots on real tiny runs: stage shares as show gives them, adding up to 100%, plots with nothing to
draw saying why, log axes labelled with whole numbers and units, compute in the unit that reads 1-999, and one
colour per series in every subplot."""

import re
import shutil

import pytest
from browser import browser_tools
from rich.console import Console

from diffmeter import units
from diffmeter.optimize.options import parse_opt
from diffmeter.report.html import write_report
from diffmeter.report.html.compute_plots import compute
from diffmeter.report.html.figures import SECTIONS
from diffmeter.report.html.plot_style import log_ticks
from diffmeter.report.html.scaling_plots import scaling
from diffmeter.report.html.study import read_study
from diffmeter.report.html.time_plots import time_breakdown
from diffmeter.report.html.tradeoff_plots import speedup_ticks, tradeoffs
from diffmeter.report.run_table import run_table
from diffmeter.report.speedup_text import speedup_tick
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

FAST = {"model": "tiny-sd", "steps": 2, "iterations": 4, "device": "cpu", "predict": False}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A baseline at two batch sizes and a lossless technique compared with it (every image identical)."""
    out = tmp_path_factory.mktemp("plots")
    bench(BenchSpec(**FAST), out=out)
    bench(BenchSpec(**FAST, batch_size=2), out=out)
    bench(BenchSpec(**FAST, optimizations=[parse_opt("fuse-qkv")], compare_baseline=True), out=out)
    return read_study(out)


#: a stage as the plots name it -> its share column in ``diffmeter table``
TABLE_SHARES = {"text encoding": "text_share", "denoising": "denoise_share", "VAE decode": "decode_share"}
TABLE_SHARES |= {"image encoding": "image_share", "other": "other_share"}


def test_where_the_time_goes_shows_the_median_and_shares_show_gives(study):
    """The bars are show's share column (of the mean call), as table's share columns are, and their labels show's
    median per call: they once showed one middle call's total (1.015 s beside show's median 1.399 s) and that call's
    shares, and table's were each stage's median over the sum of the medians (denoise 82% beside show's 76.8%)."""
    (bars, _steps) = time_breakdown(study)
    totals = [sum(values) for values in zip(*(trace.x for trace in bars.figure.data), strict=True)]
    assert totals == pytest.approx([100.0] * len(study.complete), abs=1e-9)
    console = Console(width=200, record=True)
    for index, run in enumerate(study.complete):
        console.print(run_table(run.result))
        lines = [line.split("│")[1:-1] for line in console.export_text().splitlines() if line.startswith("│")]
        rows = {cells[0].strip(): [cell.strip() for cell in cells] for cells in lines}
        assert bars.figure.data[0].y[index] == f"{run.label} (median {rows['total'][1]} per call)"
        for trace in bars.figure.data:
            (shown,) = [cells[4] for stage, cells in rows.items() if stage.startswith(trace.name)]
            assert f"{trace.x[index]:.1f}%" == shown, (run.label, trace.name)
            table = run.row[TABLE_SHARES[trace.name]]  # diffmeter table's column: the same share, not another
            assert 100 * table == pytest.approx(trace.x[index], rel=1e-9), (run.label, trace.name)
    assert bars.figure.layout.xaxis.range == (0, 100)
    assert bars.figure.layout.xaxis.title.text == "share of the mean call (%)"


def test_a_quality_plot_of_identical_images_says_why_instead_of_empty_axes(study):
    (fused,) = [run for run in study.complete if run.row["optimizations"] == "fuse-qkv"]
    assert fused.row["identical_images"] == FAST["iterations"] and fused.row["psnr_db"] is None
    quality = tradeoffs(study)[0].figure
    notes = [annotation.text for annotation in quality.layout.annotations]
    assert any("identical" in text and "PSNR is infinite" in text for text in notes), notes
    assert quality.layout.xaxis.visible is False and quality.layout.yaxis.visible is False  # the PSNR panel
    assert [trace.xaxis for trace in quality.data] == ["x2"]  # nothing drawn on the PSNR panel
    low, high = quality.layout.yaxis2.range
    assert 0.8 < low < 1 < high < 1.05  # SSIM 1 on an axis near 1, not 0-2
    (trace,) = quality.data
    assert trace.error_x.array[0] >= 0 and trace.error_x.arrayminus[0] >= 0  # the speed-up's interval drawn


def test_log_axes_are_labelled_in_full_with_units():
    ticks = log_ticks([0.0031, 0.042], units.seconds)
    assert ticks["type"] == "log" and ticks["tickvals"] == pytest.approx([0.002, 0.005, 0.01, 0.02, 0.05])
    assert ticks["ticktext"] == ["2.00 ms", "5.00 ms", "10.00 ms", "20.00 ms", "50.00 ms"]
    wide = log_ticks([1e-4, 50.0])
    assert wide["tickvals"] == pytest.approx([1e-4, 1e-3, 1e-2, 0.1, 1, 10])
    narrow = log_ticks([0.31, 0.35], units.seconds)
    assert narrow["ticktext"] == ["310.00 ms", "350.00 ms"]  # within one step: its ends, never a bare "3"
    assert log_ticks([1.619, 1.624], units.seconds)["ticktext"] == ["1.619 s"]  # ends that would overlap: one
    assert log_ticks([0.0, -1.0]) == {}


def test_a_speed_up_axis_says_faster_and_slower_as_the_tables_do_and_shows_1x(study):
    """Ticks of the trade-off plot's speed-up axis read as every table says a factor ("20.0x slower", never "0.05x";
    "1.23x faster", never a bare "1.23x") and always hold 1x: a narrow axis once had two ticks, '1.13x slower' and
    '1.23x', and no mark of which side of 1x a point was on."""
    ticks = speedup_ticks([0.0898, 2.4])
    assert ticks["ticktext"] == [
        "20.0x slower",
        "10.0x slower",
        "5.00x slower",
        "2.00x slower",
        "1x",
        "2.00x faster",
        "5.00x faster",
    ]
    narrow = speedup_ticks([0.885, 1.23])
    assert narrow["ticktext"] == ["1.13x slower", "1x", "1.23x faster"] and 1.0 in narrow["tickvals"]
    above = speedup_ticks([1.5, 3.1])  # every run faster: 1x still on the axis, inside its range
    assert above["ticktext"][0] == "1x" and above["range"][0] < 0
    assert [speedup_tick(v) for v in (1 / 11.1, 1.0, 0.999, 1.5)] == ["11.1x slower", "1x", "1x", "1.50x faster"]
    quality = tradeoffs(study)[0].figure
    assert 1.0 in quality.layout.xaxis2.tickvals and "1x" in quality.layout.xaxis2.ticktext
    lines = [(shape.x0, shape.x1, shape.xref) for shape in quality.layout.shapes]
    assert lines == [(1.0, 1.0, "x2")]  # the SSIM panel's 1x line; the PSNR panel, every image identical, has none


def test_compute_is_in_the_unit_that_reads_1_to_999(study, tmp_path):
    import json

    from diffmeter.flops.profile import profile

    profiles = [profile("tiny-sd", height=size, width=size) for size in (32, 64)]
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": [p.to_json_dict() for p in profiles]}))
    figures = compute(read_study(tmp_path))
    shares, by_size = figures[0].figure, figures[1].figure
    factor, prefix = units.prefix(max(p.total_flops for p in profiles))
    assert prefix in ("M", "G") and f" {prefix}FLOPs)" in shares.data[0].y[0]  # "... (389.40 MFLOPs)"
    assert by_size.layout.yaxis.title.text == f"{prefix}FLOPs per image"
    assert all(1 <= y < 1000 for trace in by_size.data for y in trace.y)


def test_every_subplot_draws_a_series_in_one_colour(study):
    (batch,) = scaling(study)
    colors: dict[str, set] = {}
    for trace in batch.figure.data:
        colors.setdefault(trace.legendgroup, set()).update({trace.marker.color, trace.line.color})
    assert colors and all(len(found) == 1 for found in colors.values()), colors
    assert len(batch.figure.data) == 3 * len(colors)  # latency, throughput and compute per series


def test_the_batch_plot_caption_names_the_compute_unit_its_axis_uses(study):
    """The caption once said "achieved TFLOP/s" beside an axis in GFLOP/s (tiny runs reach about 1 GFLOP/s)."""
    (batch,) = scaling(study)
    unit = batch.figure.layout.yaxis3.title.text
    peak = max(run.row["denoise_tflops_per_s"] for run in study.complete if not run.row["optimizations"]) * 1e12
    assert unit == f"{units.prefix(peak)[1]}FLOP/s"
    assert f"achieved {unit}:" in batch.caption
    assert {found for found in re.findall(r"\b\w?FLOP/s", batch.caption)} == {unit}  # no other rate unit


#: a number a hover shows: a placeholder with a number format ("%{y:.4g}"), or the batch size ("%{x}")
NUMBER = re.compile(r"%\{(?:[xy]|customdata[^}:]*)(?::[^}]*)?\}")


def _bare(template: str) -> list[str]:
    """The numbers in a hover template with no unit or name beside them ("%{y:.4g}<extra>", not "%{y:.4g} GiB")."""
    bare = []
    for found in NUMBER.finditer(template):
        after = re.match(r"(?:(?!%\{)[^<,])*", template[found.end() :]).group().strip(" :")
        named = re.search(r"[A-Za-z]+ $", template[: found.start()])  # "batch %{x}", "SSIM %{y:.4f}"
        if ":" in found.group() or found.group() in ("%{x}", "%{y}"):
            category = found.group() in ("%{x}", "%{y}") and not named  # a bar's run label, a waterfall's rung
            if not after and not named and not category:
                bare.append(found.group())
    return bare


def test_every_hover_value_names_its_unit(study):
    """Every trace of every plot has a hover with each number's unit (or none, for a reference line): the peak
    memory plot once showed "%{x:.4g} s per image, %{y:.4g}", a memory with no GiB, and the batch plot's latency
    and throughput subplots Plotly's bare "(2, 0.73)"."""
    assert _bare("%{text}<br>%{x:.4g} s per image, %{y:.4g}<extra></extra>") == ["%{y:.4g}"]  # the rule bites
    checked = 0
    for _, _, builder in SECTIONS:
        for figure in builder(study):
            for trace in figure.figure.data:
                if trace.hoverinfo == "skip":
                    continue
                assert trace.hovertemplate, (figure.figure.layout.title.text, trace.name)
                assert _bare(trace.hovertemplate) == [], (figure.figure.layout.title.text, trace.hovertemplate)
                checked += 1
    assert checked >= 10
    (memory,) = [f for f in tradeoffs(study) if f.figure.layout.title.text.startswith("Peak memory")]
    assert all("%{y:.4g} GiB" in trace.hovertemplate for trace in memory.figure.data)


#: an axis title that reads as a time (or a figure of one) must say its unit
TIMED = re.compile(r"\btime\b|measured|predicted|seconds")


def test_every_time_axis_names_its_unit(study):
    """A new user's trial: the step, trade-off and prediction plots' time axes read "time per step (log scale)",
    "measured median (log)": seconds only on hover. Every axis title that is a time says "s" (or seconds)."""
    checked = 0
    for _, _, builder in SECTIONS:
        for figure in builder(study):
            layout = figure.figure.layout
            for name in [key for key in layout.to_plotly_json() if key.startswith(("xaxis", "yaxis"))]:
                title = (layout[name].title.text or "") if layout[name].title else ""
                if TIMED.search(title):
                    assert re.search(r"\(s[,)]|seconds", title), (layout.title.text, title)
                    checked += 1
    assert checked >= 3


HEADERS, ROWS = "table.summary th", "table.summary tbody tr"


def test_sorting_by_psnr_puts_identical_images_above_every_finite_psnr(study, tmp_path):
    """Identical images (infinite PSNR, shown "identical") once had an empty sort value and sorted with the runs that
    have no PSNR; in a real browser they now sort above a lossy run's finite PSNR, the missing ones last either way."""
    out = tmp_path / "study"
    shutil.copytree(study.root, out)  # the baseline reused: one more run, a lossy one (another sampler)
    bench(BenchSpec(**FAST, optimizations=[parse_opt("scheduler:name=dpm++2m")], compare_baseline=True), out=out)
    report = write_report(out, tmp_path / "report.html", "PSNR order")
    playwright, executable = browser_tools()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(report.as_uri())
            headers = page.evaluate(f"() => Array.from(document.querySelectorAll('{HEADERS}')).map(h => h.textContent)")
            column = headers.index("PSNR")
            cells = f"() => Array.from(document.querySelectorAll('{ROWS}')).map(r => r.cells[{column}].textContent)"
            page.click(f"table.summary th:nth-child({column + 1})")
            ascending = page.evaluate(cells)
            page.click(f"table.summary th:nth-child({column + 1})")
            descending = page.evaluate(cells)
        finally:
            browser.close()
    assert descending[0] == "identical" and descending[1].endswith(" dB") and set(descending[2:]) == {"-"}, descending
    assert ascending[0].endswith(" dB") and ascending[1] == "identical" and set(ascending[2:]) == {"-"}, ascending


def test_runs_of_one_label_are_told_apart_by_what_differs(tmp_path):
    """A new user's report named four batch-scaling lines "tiny-sd 32x32 unoptimized" (float32 and bfloat16, 1 and
    2 steps): each name now adds the settings that differ among the runs sharing it, and only those."""
    for dtype in ("float32", "bfloat16"):
        for batch in (1, 2):
            bench(BenchSpec(**{**FAST, "iterations": 1}, dtype=dtype, batch_size=batch), out=tmp_path)
    study = read_study(tmp_path)
    assert sorted({run.label for run in study.runs}) == [
        "tiny-sd 32x32 b1 unoptimized bfloat16",
        "tiny-sd 32x32 b1 unoptimized float32",
        "tiny-sd 32x32 b2 unoptimized bfloat16",
        "tiny-sd 32x32 b2 unoptimized float32",
    ]
    (batch,) = scaling(study)
    names = {trace.name for trace in batch.figure.data}
    assert names == {"tiny-sd 32x32 unoptimized bfloat16", "tiny-sd 32x32 unoptimized float32"}
    colors = {trace.name: trace.marker.color for trace in batch.figure.data}
    assert len(set(colors.values())) == 2  # one colour each, as the legend tells them apart
