"""One memory unit, GiB (2**30 bytes), in every command: a figure of one tiny spec reads the same in `profile --gpu`,
`fit`, `fit --all`'s page and summary, `bench`, `show`, `table` and the report; cards without a driver figure."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from diffmeter import units
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.peaks import PEAKS
from diffmeter.spec import CPU_DTYPE_NOTE

#: a decimal byte unit ("33.74 GB", "512 MB"), the unit that must be gone; bandwidths (GB/s, TB/s) stay
DECIMAL_BYTES = re.compile(r"\d\s?[kMGTPE]?B\b(?!/s)")


def shown(nbytes: int) -> str:
    """The rule, written out apart from ``units.gib``: 2 decimals from 1 GiB, 3 significant digits below."""
    amount = nbytes / 2**30
    exponent = int(f"{amount:.2e}".split("e")[1])  # of the figure rounded to 3 significant digits
    return f"{amount:,.2f} GiB" if amount == 0 or exponent >= 0 else f"{amount:.{2 - exponent}f} GiB"


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (33_740_000_000, "31.42 GiB"),  # FLUX.1-dev's parameters, once printed as "33.74 GB"
        (2**30, "1.00 GiB"),
        (16_376 * 2**20, "15.99 GiB"),  # an RTX 4080 as nvidia-smi reports it
        (12_345_678, "0.0115 GiB"),  # not "0.01 GiB"
        (3 * 2**20, "0.00293 GiB"),  # 3 MiB, not "0.00 GiB"
        (512 * 2**20, "0.500 GiB"),
        (0, "0.00 GiB"),
        (int(0.9996 * 2**30), "1.00 GiB"),  # rounding up to 1 GiB takes its 2 decimals
        (int(0.09996 * 2**30), "0.100 GiB"),
        (int(0.996 * 2**30), "0.996 GiB"),
        (1_000, "0.000000931 GiB"),  # a kB: digits, not an exponent
    ],
)
def test_bytes_read_as_gib_and_a_small_figure_keeps_its_digits(nbytes, text):
    assert units.gib(nbytes) == text == shown(nbytes)


def test_cards_without_a_driver_figure_read_the_datasheet_gb_as_gib_less_the_measured_reserve():
    """The RTX 4080 ("16 GB") reports 16,376 MiB; the 10^9-byte reading gave 14.90 GiB. The GDDR cards measured
    without ECC (RTX 4090 24,564, RTX 5090 32,607, RTX 3090 24,576 MiB) fall 12, 161 and 0 MiB short of their GB
    read as GiB: the median, 12 MiB, is taken off. An A40 (data-center GDDR, ECC on) is 15/16 of 48 GiB less the
    ECC-on cards' 12 MiB: 46,068 MiB, what the L40 and L40S of the same 48 GB report."""
    rtx4080 = named_gpu("rtx 4080")
    assert rtx4080.memory_bytes == 16 * 2**30 - 12 * 2**20
    assert abs(rtx4080.memory_bytes - 16_376 * 2**20) <= 16 * 2**20 and units.gib(rtx4080.memory_bytes) == "15.99 GiB"
    assert "16 GB read as GiB less 12 MiB" in rtx4080.source and "median" in rtx4080.source
    assert "3 GDDR cards" in rtx4080.source and "10^9" not in rtx4080.source
    assert named_gpu("a40").memory_bytes == 46_068 * 2**20 == named_gpu("l40s").memory_bytes
    assert "1/16 off for ECC" in named_gpu("a40").source
    h800 = named_gpu("h800 pcie")  # HBM: within half a percent of the H800 SXM's 81,559 MiB, under 80 GiB
    assert 81_559 * 2**20 * 0.995 < h800.memory_bytes < 80 * 2**30 and "HBM cards" in h800.source
    for row in PEAKS:  # no card is ever more than its datasheet's GB read as GiB
        memory = named_gpu(row.name).memory_bytes
        assert memory is None or memory <= row.memory_gb * 2**30


def test_gpu_spec_reads_gb_as_gib_and_takes_memory_gib_in_json():
    from diffmeter.predict.gpu_spec import spec_gpu

    for text in ("16GB", '{"memory_gib": 16}', '{"memory_gb": 16}'):
        device = spec_gpu(text)
        assert device.memory_bytes == 16 * 2**30 and "memory read as GiB" in device.source


def test_fit_reads_a_gb_memory_as_gib_and_says_so(cli):
    code, out, _ = cli("fit", "tiny-sd", "--memory", "16GB")
    said = " ".join(out.split())
    assert code == 0 and "tiny-sd (32x32 px (WxH), 2 steps, batch 1) on --memory 16GB, read as GiB (16.00 GiB," in said
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "rtx 4080")
    assert code == 0 and "tiny-sd (32x32 px (WxH), 2 steps, batch 1) on RTX 4080 (15.99 GiB," in " ".join(out.split())


def test_fit_on_the_cpu_holds_nothing_back_for_cuda(cli):
    """`fit --gpu cpu` said "1.28 GiB held back for CUDA" and took it off the machine's memory."""
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "cpu", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["held_back_bytes"] == 0
    left = payload["memory_bytes"] - payload["fits"][0]["peak_bytes"]
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "cpu")
    said = " ".join(out.split())
    # it says why it predicts float32, not the model's own dtype (a new user's trial: switched without a word)
    assert f"note: {CPU_DTYPE_NOTE}" in said
    assert code == 0 and "CUDA" not in said.replace(CPU_DTYPE_NOTE, "") and units.gib(left) in said


def test_every_command_prints_one_specs_memory_in_gib_with_the_same_value(cli, tmp_path, monkeypatch):
    from diffmeter.cli.app import console
    from diffmeter.report.leaderboard import leaderboard_html, summary_table
    from diffmeter.runs.leaderboard import model_cells

    monkeypatch.setattr(console, "width", 250)  # every column shown, a figure never broken across lines
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "rtx 4080", "--json")
    assert code == 0
    predicted = json.loads(out)
    peak, params, card = predicted["memory"]["peak_bytes"], predicted["param_bytes"], predicted["gpu"]["memory_bytes"]
    assert peak < 2**30 and card == named_gpu("rtx 4080").memory_bytes  # a tiny model: the small-figure rule
    printed = {}
    code, printed["profile"], _ = cli("profile", "tiny-sd", "--gpu", "rtx 4080")
    assert code == 0 and f"parameters: {shown(params)} at float32 (buffers not counted)" in printed["profile"]
    assert printed["profile"].count(shown(params)) >= 4  # the line above and every stage's parameters resident
    whole = next(line for line in printed["profile"].splitlines() if "whole generation" in line)
    assert whole.rstrip(" │").endswith(shown(peak)) and f"RTX 4080 ({shown(card)}" in printed["profile"]
    code, printed["fit"], _ = cli("fit", "tiny-sd", "--gpu", "rtx 4080")
    assert (
        code == 0
        and f"RTX 4080 ({shown(card)}, " in printed["fit"]
        and f"without techniques {shown(peak)}" in " ".join(printed["fit"].split())  # the title wraps between words
    )
    cells = model_cells("tiny-sd", [named_gpu("rtx 4080")])  # fit --all's cells, its page and its summary
    assert cells[0].peak_bytes == cells[0].plain_peak_bytes == peak
    printed["fit --all page"] = leaderboard_html(cells, [])
    page = printed["fit --all page"]
    assert (
        f'<td data-value="{card}">{shown(card)}</td>' in page and f'<td data-value="{peak}">{shown(peak)}</td>' in page
    )
    summary = Console(file=io.StringIO(), width=200)
    summary.print(summary_table(cells))
    printed["fit --all"] = summary.file.getvalue()
    assert re.search(rf"│ +{re.escape(shown(peak))} │", printed["fit --all"])

    code, printed["bench"], err = cli("bench", "tiny-sd", "--iterations", "1", "--out", tmp_path)
    assert code == 0, err
    (folder,) = [path.parent for path in tmp_path.rglob("results.json")]
    result = json.loads((folder / "results.json").read_text())
    rss, stored = result["summary"]["peak_memory"]["process_peak_rss_bytes"], result["prediction"]["peak_memory_bytes"]
    code, printed["show"], _ = cli("show", folder)
    assert code == 0
    for command in ("bench", "show"):  # the measured RSS and the stored prediction, read as stored
        assert f"process peak RSS {shown(rss)} (measured iterations)" in printed[command]
        assert f"predicted peak memory: {shown(stored)} of tensors" in printed[command]
    code, printed["table"], _ = cli("table", tmp_path)
    assert code == 0 and re.search(rf"│ +{re.escape(shown(rss))} │", printed["table"])
    code, printed["report"], _ = cli("report", tmp_path, "--out", tmp_path / "report.html")
    assert code == 0
    printed["report page"] = (tmp_path / "report.html").read_text()
    assert f">{shown(rss)}<" in printed["report page"]
    page = printed.pop("report page")  # its cells; the page's inline script is no figure
    assert not re.findall(r">\s*[\d.,]+\s?[kMGTP]?B\s*<", page)
    for command, text in printed.items():
        found = DECIMAL_BYTES.findall(text)
        assert found == [], f"{command} prints bytes in a decimal unit: {found}"


def test_the_parameters_line_names_each_dtype_and_the_memory_table_counts_buffers_by_name(cli):
    """Wan 2.2 A14B's header said "64.28 GiB at bfloat16" with its float32 VAE inside, beside a memory table's
    "parameters resident" of 64.39 GiB: that column holds the buffers too (the transformers' rotary tables)."""
    code, out, _ = cli("profile", "tiny-sd", "--dtype", "float16", "--component-dtype", "vae=float32", "--gpu", "h100")
    said = " ".join(out.split())
    assert code == 0 and "GiB at the run's dtypes: float16, vae float32 (buffers not counted)." in said
    assert "┃ parameters + buffers ┃" in said and "parameters resident" not in said
    # the memory table's title names the float32 VAE its figures hold, not the run's float16 alone
    assert "predicted peak memory (float16, vae float32; every component loaded)" in said
    code, out, _ = cli("profile", "tiny-sd", "--dtype", "float16", "--gpu", "h100")
    said = " ".join(out.split())
    assert code == 0 and "GiB at float16 (buffers not counted)." in said
    assert "predicted peak memory (float16; every component loaded)" in said


def test_an_amd_cards_held_back_memory_is_not_called_cudas(cli):
    """`fit sd15 --gpu mi300x` said "1.28 GiB held back for CUDA" on a ROCm card: it is that figure, measured for CUDA
    on an H200, held back for the ROCm runtime."""
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "mi300x")
    said = " ".join(out.split())
    assert code == 0 and "held back for the ROCm runtime)" in said and "for CUDA" not in said
    assert "Held back: 1.28 GiB for the ROCm runtime's context and libraries (CUDA's, measured on an H200" in said
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "mi300x")
    assert code == 0 and "ROCm" in out and "for CUDA" not in " ".join(out.split())  # the memory table's row
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "h100")
    assert code == 0 and "1.28 GiB held back for CUDA)" in " ".join(out.split())


def test_a_peak_over_a_thousand_tflops_is_written_with_thousands_separators(cli):
    """B200's title said "2.25e+03 TFLOP/s peak" where every other card's reads like "1,979"."""
    assert (units.significant(2250), units.significant(989.5), units.significant(65)) == ("2,250", "990", "65")
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "b200", "--dtype", "float16")
    assert code == 0 and "(float16: 2,250 TFLOP/s peak, 7,700 GB/s)" in out and "e+0" not in out
