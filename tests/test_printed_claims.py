"""The held-out figures `profile --gpu` prints beside a quantized or compiled time are the ones the committed
held-out tests found (benchmarks/results/calibration_quantized.md, calibration_techniques.md): a refit that
changes them without the claim fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diffmeter.predict.quantized_time import HELD_OUT as QUANTIZED
from diffmeter.predict.timed_techniques import HELD_OUT as TECHNIQUES

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"


def held_out(page: str, section: str) -> tuple[str, str, str]:
    """(inside, runs, median error) of ``section``'s held-out line on the committed ``page``."""
    text = (RESULTS / page).read_text()
    part = text[text.index(f"## {section}") :]
    found = re.search(r"coverage \*\*(\d+%)\*\* \((\d+ of \d+)\), midpoint median error \*\*([\d.]+%)\*\*", part)
    return found.groups()


@pytest.mark.parametrize(
    ("claim", "page", "section"),
    [(QUANTIZED, "calibration_quantized.md", "all quantized runs"), (TECHNIQUES, "calibration_techniques.md", "all")],
)
def test_the_printed_claim_is_the_committed_held_out_figure(claim, page, section):
    inside, runs, error = held_out(page, section)
    assert f"{runs} published" in claim and f"({inside})" in claim and f"median error {error}" in claim
    assert page in claim


def test_a_quantized_time_says_what_its_held_out_test_found(cli):
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "quanto:int8")
    assert code == 0 and QUANTIZED.split(";")[0] in " ".join(out.split())
