"""The predicted leaderboard (``runs/leaderboard.py``, ``report/leaderboard.py``, ``fit --all``): real catalog
models predicted on real table GPUs, the page sorted in a real browser, the CSV read back."""

from __future__ import annotations

import csv
import html
import io
import json
import re

import pytest
from browser import browser_tools
from diffusers.hooks import FirstBlockCacheConfig
from rich.console import Console

from diffmeter.catalog import resolve
from diffmeter.optimize import OptimizationSpec
from diffmeter.optimize.options import memory_setting_specs, parse_opt
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.operators import operator_work, predict_memory_and_work
from diffmeter.predict.roofline import predict_time
from diffmeter.quantization_spec import optimization_specs as quantization_specs
from diffmeter.report.leaderboard import leaderboard_csv, leaderboard_html, summary_table
from diffmeter.runs.leaderboard import Cell, model_cells
from diffmeter.spec import ProfileSpec

GPUS = ("H100 SXM", "L4", "T4")


@pytest.fixture(scope="module")
def cells():
    gpus = [named_gpu(name) for name in GPUS]
    return model_cells("sd15", gpus) + model_cells("flux-dev", gpus)


def cell(cells, model, gpu):
    return next(c for c in cells if c.model == model and c.gpu == gpu)


def test_a_model_that_fits_plain_gets_the_expected_time_and_energy_profile_gives(cells):
    found = cell(cells, "sd15", "H100 SXM")
    assert found.fits and found.setting == [] and found.peak_bytes == found.plain_peak_bytes
    spec = ProfileSpec(model="sd15").with_defaults(resolve("sd15").defaults)
    memory, work = predict_memory_and_work(spec)
    time = predict_time(work, named_gpu("H100 SXM"), weights=memory.weight_read_bytes)
    assert found.expected_s == time.expected_s and found.lower_s == time.lower_s
    assert found.energy_j == time.energy.per_output_j
    low, high = found.energy_j  # 700 W TDP x the fitted share x the expected time
    assert low < time.energy.power_w * time.expected_s[1] and high > time.energy.power_w * time.expected_s[0]
    assert any(note.startswith("energy: average board power") for note in found.notes)


def test_a_model_too_large_for_the_card_gets_the_memory_setting_fit_ranks_first_timed_as_fit_times_it(cells, cli):
    """FLUX.1-dev on an L4 (31.42 GiB of weights on a 22.49 GiB card): the leaderboard chose its setting among bench's
    bare --quantize int8|fp8 by the plain pipeline's bound, which it printed as the quantized setting's (30.35 s for
    quantize-fp8 on an RTX 4090, where profile --quantize fp8 says 40.37 s). Now its setting is fit's fastest memory
    setting, with fit's range and bound."""
    found = cell(cells, "flux-dev", "L4")
    assert found.plain_peak_bytes > found.memory_bytes
    assert found.fits and found.setting and found.peak_bytes < found.memory_bytes
    assert not {"quantize-int8", "quantize-fp8"} & set(found.setting)
    code, out, err = cli("fit", "flux-dev", "--gpu", "l4", "--json")
    assert code == 0, err
    plain = [row for row in json.loads(out)["fits"] if not row["optimizations"] and row["expected_s"]]
    first = min(plain, key=lambda row: row["expected_s"][0] * row["expected_s"][1])
    assert found.setting == first["techniques"] and list(found.expected_s) == first["expected_s"]
    assert found.lower_s == first["lower_s"] and found.energy_j


def test_each_card_gets_its_fastest_predicted_setting_with_the_speed_ups(cells):
    """sd15 fits plain on an H100: compiled it is faster than plain; FLUX.1-dev on an L4 needs a quantized format or
    an offload, and its fastest setting is one whose every technique is timed (an expected range, not a bound)."""
    sd15 = cell(cells, "sd15", "H100 SXM")
    middle = lambda pair: (pair[0] * pair[1]) ** 0.5  # noqa: E731
    assert any(t.startswith("compile") for t in sd15.fastest) and middle(sd15.fastest_s) < middle(sd15.expected_s)
    flux = cell(cells, "flux-dev", "L4")
    assert flux.fastest and flux.fastest_s and flux.fastest_s[0] < flux.fastest_s[1]
    row = next(r for r in csv.DictReader(io.StringIO(leaderboard_csv(cells))) if r["model"] == "sd15")
    assert row["fastest"].startswith("compile:mode=") and float(row["fastest_low_s"]) == sd15.fastest_s[0]


def test_the_fastest_setting_is_named_with_every_parameter_as_bench_takes_it():
    """The fastest cell names its quantized format as --quantize takes it and each speed-up as --opt takes it, with
    the parameters bench runs (the cache's threshold: diffusers' own default), in the page, the CSV and the one-GPU
    table; before, "quantize-torchao-int8wo + compile + first-block-cache" named no threshold nor mode."""
    threshold = FirstBlockCacheConfig().threshold
    board = Cell(
        model="flux-dev",
        gpu="L4",
        architecture="ada",
        memory_bytes=24 * 2**30,
        fits=True,
        setting=["offload-model"],
        peak_bytes=20 * 2**30,
        plain_peak_bytes=34 * 2**30,
        fastest=["quantize-torchao-int8wo", "offload-model", "compile", "first-block-cache"],
        fastest_s=(20.0, 30.0),
    )
    named = f"torchao:int8wo + offload-model + compile:mode=default + first-block-cache:threshold={threshold}"
    assert next(csv.DictReader(io.StringIO(leaderboard_csv([board]))))["fastest"] == named
    # the memory setting named alike (it read "offload-model+quantize-bnb-nf4+quantize-bnb-nf4@text_encoder")
    quantized = board.model_copy(update={"setting": ["offload-model", "quantize-bnb-nf4@text_encoder"]})
    assert next(csv.DictReader(io.StringIO(leaderboard_csv([quantized]))))["setting"] == (
        "offload-model + text_encoder=bnb:nf4"
    )
    assert html.escape(named) in leaderboard_html([board], [])
    shown = Console(width=400, record=True)
    shown.print(summary_table([board]))
    assert named in shown.export_text()
    quantize, offload, *speedups = named.split(" + ")
    assert quantization_specs([quantize]) == memory_setting_specs(("quantize-torchao-int8wo",))  # --quantize's value
    asked = [parse_opt(text) for text in speedups]  # --opt's values, bench's defaults
    assert asked == [
        OptimizationSpec(name="compile", params={"mode": "default"}),
        OptimizationSpec(name="first-block-cache", params={"threshold": threshold}),
    ]


def test_the_summary_per_gpu_shows_each_cards_memory_in_gib():
    """The table committed in benchmarks/results/leaderboard_summary.md: once "85.52 GB" for an H100 SXM, whose
    driver reports 81559 MiB (data/gpu_memory.json), 79.65 GiB."""
    gpus = [named_gpu("H100 SXM"), named_gpu("L4")]
    board = [
        Cell(model="sd15", gpu=g.name, architecture=g.architecture, memory_bytes=g.memory_bytes, fits=True, setting=[],
             plain_peak_bytes=2**31)
        for g in gpus
    ]  # fmt: skip
    shown = Console(width=200, record=True)
    shown.print(summary_table(board))
    text = shown.export_text()
    assert gpus[0].memory_bytes == 81559 * 2**20 and "│ H100 SXM │ 79.65 GiB │" in " ".join(text.split())
    assert not re.findall(r"\d\s?GB\b", text)


def test_a_card_without_a_vendor_tdp_or_a_dtype_peak_says_so(cells):
    assert cell(cells, "sd15", "L4").energy_j is not None  # NVIDIA's 72 W, cited in data/gpu_power.json
    a10g = model_cells("sd15", [named_gpu("A10G")])[0]  # AWS's part: NVIDIA states no TDP for it
    assert a10g.expected_s is not None and a10g.energy_j is None
    assert "energy: the table has no cited TDP for the A10G (data/gpu_power.json)" in a10g.notes
    t4 = cell(cells, "flux-dev", "T4")  # bfloat16 FLUX on a T4: no bf16 tensor cores in the table
    assert t4.expected_s is None and (not t4.fits or any("no time" in note for note in t4.notes))


def test_the_csv_holds_every_cell_with_units_in_its_names(cells):
    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(cells))))
    assert len(rows) == len(cells) == 6
    row = next(r for r in rows if r["model"] == "sd15" and r["gpu"] == "H100 SXM")
    found = cell(cells, "sd15", "H100 SXM")
    assert row["setting"] == "plain" and float(row["expected_low_s"]) == found.expected_s[0]
    assert float(row["energy_high_j"]) == found.energy_j[1] and int(row["memory_bytes"]) == found.memory_bytes
    assert summary_table(cells).row_count == len(GPUS)


def test_the_page_sorts_by_expected_time_in_a_real_browser(cells, tmp_path):
    playwright, executable = browser_tools()
    page_file = tmp_path / "leaderboard.html"
    page_file.write_text(leaderboard_html(cells, ["A100 (its row covers several memory sizes)"]))
    errors, requests = [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.as_uri())
            expected = "() => Array.from(document.querySelectorAll('tbody tr')).map(r => r.cells[8].dataset.value)"
            page.click("table.summary th:nth-child(9)")  # expected time, ascending
            ascending = page.evaluate(expected)
            page.click("table.summary th:nth-child(9)")
            descending = page.evaluate(expected)
            header = page.evaluate("() => document.querySelector('th:nth-child(9)').textContent")
        finally:
            browser.close()
    assert errors == [] and requests == [page_file.as_uri()]
    assert header == "expected time"
    numbers = [float(value) for value in ascending if value]
    assert numbers == sorted(numbers) and len(numbers) >= 2
    assert [float(value) for value in descending if value] == sorted(numbers, reverse=True)
    assert ascending[-len(cells) + len(numbers) :] == [""] * (len(cells) - len(numbers))  # unknowns last


def test_bad_leaderboard_input_is_one_line_and_exit_2(cli, tmp_path):
    for args, said in (
        (("fit", "sd15", "--all"), "drop MODEL"),
        (("fit", "sd15", "--gpu", "h100", "--csv", tmp_path / "x.csv"), "add --all"),
        (("fit", "--all", "--html", tmp_path / "missing" / "page.html"), "missing does not exist"),
        (("fit", "--all", "--html", tmp_path), "is a folder: name a file in it"),
        (("fit", "--all", "--gpu", "v100 sxm2"), "no single memory size"),
        (("fit", "--all", "--steps", "4", "--dtype", "fp16"), "drop --steps, --dtype"),
    ):
        code, out, err = cli(*args)
        assert code == 2 and said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_model_that_fits_only_with_a_tiled_decode_gets_the_tiled_decodes_expected_time(tmp_path, monkeypatch):
    """CogVideoX-2b's plain decode does not fit an L4; tiled it does, and the cell's times are the tiled decode's
    (more FLOPs than the plain one: the tiles overlap), with an expected range (a few minutes of fake tensors:
    the disk cache, in a folder of this test's own, keeps the cell's counts for the comparisons below)."""
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    found = model_cells("cogvideox-2b", [named_gpu("L4")])[0]
    assert found.fits and found.setting == ["vae-tiling"]
    spec = ProfileSpec(model="cogvideox-2b").with_defaults(resolve("cogvideox-2b").defaults)
    memory, plain = predict_memory_and_work(spec)
    tiled = predict_time(operator_work(spec, ("vae-tiling",)), named_gpu("L4"), weights=memory.weight_read_bytes)
    assert found.lower_s == tiled.lower_s and found.expected_s == tiled.expected_s
    assert tiled.lower_s > predict_time(plain, named_gpu("L4"), weights=memory.weight_read_bytes).lower_s
    assert "time: the VAE decode as vae-tiling runs it" in found.notes


def test_each_card_gets_the_quantized_bytes_its_kernels_make_as_fit_computes_them():
    """quanto int4 runs tinygemm on an sm_80+ card (no dequantized copy) and dequantizes each weight on a T4: the
    leaderboard's formats for each card are `fit --gpu`'s, not one kind's for every card (it used sm_80's for all)."""
    from diffmeter.predict.fit_formats import with_fit_formats
    from diffmeter.predict.kernel_kinds import OTHER_GPU, SM80
    from diffmeter.runs.leaderboard import card_formats

    spec = ProfileSpec(model="sd15").with_defaults(resolve("sd15").defaults)
    prediction, _ = predict_memory_and_work(spec)
    t4, h100 = (card_formats(prediction, spec, named_gpu(name)) for name in ("T4", "H100 SXM"))
    int4 = "quantize-quanto-int4"
    assert t4.dequantized_bytes[int4] == with_fit_formats(prediction, spec, OTHER_GPU).dequantized_bytes[int4]
    assert h100.dequantized_bytes[int4] == with_fit_formats(prediction, spec, SM80).dequantized_bytes[int4]
    assert sum(t4.dequantized_bytes[int4].values()) > sum(h100.dequantized_bytes[int4].values())
