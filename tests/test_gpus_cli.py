"""`diffmeter gpus`: every card --gpu can name, each name one that --gpu takes back, with the figures predictions
read (a new user's trial: the list was only in the error for a misspelt card)."""

import json

from diffmeter.predict.devices import named_gpu
from diffmeter.predict.peaks import PEAKS


def test_every_listed_gpu_is_a_name_gpu_takes_with_the_figures_it_predicts_with(cli):
    code, text, err = cli("gpus", "--json")
    assert code == 0, err
    rows = json.loads(text)
    assert [row["name"] for row in rows] == [row.name for row in PEAKS]
    for row in rows:
        device = named_gpu(row["name"])
        assert device.name == row["name"]
        assert row["memory_gib"] == (device.memory_bytes / 2**30 if device.memory_bytes else None)
        assert row["bf16_tflops"] == device.tflops.get("bf16") and row["tdp_w"] == device.tdp_w
        assert row["source"] == device.source
    code, text, _ = cli("gpus")
    assert code == 0 and "H100 SXM" in text and "79.65 GiB" in text and "989.5 TFLOP/s" in text
    assert "--gpu-spec" in " ".join(text.split())
