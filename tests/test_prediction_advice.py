"""What `fit`, `profile --gpu-spec` and bench's memory check tell a user to do: the figure actually missing, an
option the command has, a next step when nothing fits (issue 49, item 7)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from diffmeter import units
from diffmeter.predict.calibration import calibrations
from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, of_row
from diffmeter.predict.memory import predict_memory
from diffmeter.predict.peaks import PEAKS
from diffmeter.predict.techniques import peak_under, settings
from diffmeter.spec import ProfileSpec


def test_fit_on_a_card_without_the_runs_dtype_peak_names_it_and_the_dtype_that_times_it(cli):
    """The V100 has no bfloat16 peak: fit said "no figures for this GPU (name one with --gpu ...)" to a user who had
    named it. The reason given now names the peak, and the option it suggests does give every setting a time."""
    code, out, err = cli("fit", "tiny-flux", "--gpu", "v100 sxm2", "--memory", "16GB", "--dtype", "bfloat16", "--json")
    found = json.loads(out)
    assert code == 0, err
    assert all(row["lower_s"] is None for row in found["fits"])
    said = found["time_left_out"]
    assert "V100 SXM2 no bfloat16 peak" in said and said.endswith("--dtype float16")
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "v100 sxm2", "--memory", "16GB", "--dtype", "float16", "--json")
    timed = json.loads(out)
    assert timed["time_left_out"] is None and all(row["lower_s"] > 0 for row in timed["fits"])
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "v100 sxm2", "--memory", "16GB", "--dtype", "bfloat16")
    assert "No time: the table gives the V100 SXM2 no bfloat16 peak" in " ".join(out.split())
    assert "name one with --gpu" not in out


def test_fit_without_a_gpu_says_only_the_memory_was_given(cli):
    code, out, _ = cli("fit", "tiny-flux", "--memory", "24GB", "--json")
    assert code == 0 and json.loads(out)["time_left_out"].startswith("no GPU named, only its memory")


def test_fit_takes_gpu_spec_with_its_memory_and_host_link(cli):
    """`fit --gpu rtx9090` suggested --gpu-spec, which fit did not take."""
    memory = f"{CUDA_HOLDBACK_BYTES / 2**30 + 0.004:.6f}GB"  # 4 MiB once CUDA's share is held back: offloading fits
    args = ("fit", "tiny-flux", "--steps", "4", "--json", "--gpu-spec")
    code, out, err = cli(*args, f"{memory},100TFLOPS,1TB/s,link=32GB/s")
    found = json.loads(out)
    assert code == 0, err
    assert found["memory_bytes"] == int(float(memory[:-2]) * 2**30) and found["host_link"] == "32 GB/s host link"
    assert found["fits"] and all(any("offload" in t for t in row["techniques"]) for row in found["fits"])
    assert found["time_left_out"] is None
    assert all(row["lower_s"] > 0 for row in found["fits"])
    code, out, _ = cli(*args, f"{memory},100TFLOPS,1TB/s")  # no host link: offloading is not timed, and it says why
    found = json.loads(out)
    assert code == 0 and found["fits"] and all(row["lower_s"] is None for row in found["fits"])
    assert found["time_left_out"].endswith("--gpu-spec gives no host link; add link=64GB/s (its rate per direction)")
    code, _, err = cli("fit", "tiny-flux", "--gpu-spec", "100TFLOPS")
    assert code == 2 and "--gpu-spec gives no memory" in err


@pytest.mark.parametrize("command", [["profile", "tiny-sd"], ["fit", "tiny-sd"], ["fit", "--all"]])
def test_an_unknown_gpus_suggestions_are_options_of_the_command(cli, command):
    code, _, err = cli(*command, "--gpu", "rtx9090")
    assert code == 2 and "unknown GPU 'rtx9090'" in err and len(err.strip().splitlines()) == 1
    _, help_text, _ = cli(*[word for word in command if word != "tiny-sd" and word != "--all"], "--help")
    suggested = set(re.findall(r"--[a-z][a-z0-9-]+", err))
    assert "--gpu-spec" in suggested
    assert all(option in help_text for option in suggested)


def test_nothing_fits_names_the_least_peak_what_lowers_it_and_the_smallest_card(cli):
    code, out, err = cli("fit", "tiny-flux", "--memory", "1.28GB", "--json")
    found = json.loads(out)
    assert code == 0, err
    assert found["fits"] == []
    prediction = predict_memory(ProfileSpec(model="tiny-flux"))
    least = min(peak_under(prediction, chosen) for chosen in settings(prediction))
    cards = [device for device in map(of_row, PEAKS) if device.memory_bytes]
    smallest = min(cards, key=lambda device: device.memory_bytes)  # any card holds a tiny pipeline
    step = found["next_step"]
    assert f"the least any setting reaches is {units.gib(least)}" in step
    assert f"{units.gib(least + CUDA_HOLDBACK_BYTES)} of GPU memory" in step
    assert "a smaller size (--height/--width, 32x32 px now)" in step and "--num-frames" not in step
    assert f"the smallest card of the table it fits is the {smallest.name}" in step
    code, out, _ = cli("fit", "tiny-flux", "--memory", "1.28GB")
    assert "Nothing fits: the least any setting reaches" in " ".join(out.split())


def test_nothing_fits_for_a_video_names_fewer_frames(cli):
    code, out, err = cli("fit", "tiny-wan", "--memory", "1.28GB", "--steps", "1", "--json")
    assert code == 0, err
    assert (
        "fewer frames (--num-frames, 9 now) or a smaller size (--height/--width, 16x16 px now)"
        in (json.loads(out)["next_step"])
    )


def _time(cli, spec: str) -> dict:
    code, out, err = cli("profile", "tiny-sd", "--gpu-spec", spec, "--json")
    assert code == 0, err
    return json.loads(out)["time"]


def test_gpu_spec_without_an_architecture_says_so_and_keeps_the_lower_bound(cli):
    time = _time(cli, "80GB,989TFLOPS,3.35TB/s")
    assert time["expected_s"] is None and time["lower_s"] > 0
    assert time["calibration"].startswith("no expected range: --gpu-spec names no architecture; add arch=hopper|")
    assert time["calibration"].endswith("the lower bound is shown")


def test_gpu_spec_with_an_architecture_has_its_expected_range_and_with_a_tdp_its_energy(cli):
    time = _time(cli, "80GB,989TFLOPS,3.35TB/s,arch=hopper")
    assert time["calibration"] == calibrations()["cuda:hopper"].source
    assert time["expected_s"][0] >= time["lower_s"] and time["energy"] is None
    assert time["energy_left_out"] == "--gpu-spec gives no TDP: add the card's board power, e.g. 700W"
    as_json = '{"memory_gib": 80, "tflops": 989, "bandwidth_gb_s": 3350, "tdp_w": 700, "architecture": "hopper"}'
    time = _time(cli, as_json)
    assert time["expected_s"] is not None and time["energy"]["tdp_w"] == 700
    code, _, err = cli("profile", "tiny-sd", "--gpu-spec", "80GB,arch=hoper")
    assert code == 2 and "arch= takes hopper|" in err and len(err.strip().splitlines()) == 1


def _refusal(monkeypatch, device: str, available, **fields) -> str:
    """bench's memory check of FLUX.1-dev (512 px unless ``fields`` say otherwise) on ``device`` with
    ``available(profile)`` bytes: the card is a number, the one input."""
    from diffmeter import profile
    from diffmeter.catalog import resolve
    from diffmeter.errors import DoesNotFit
    from diffmeter.runs import memory_check
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(model="flux-dev", steps=1, device=device, **{"height": 512, "width": 512, **fields})
    counted = profile("flux-dev", height=spec.height, width=spec.width, steps=1)
    monkeypatch.setattr(memory_check, "available_bytes", lambda device: available(counted))
    with pytest.raises(DoesNotFit) as refused:
        memory_check.check_fits(spec, resolve("flux-dev"), "vae", counted, torch.device(device))
    return str(refused.value)


def test_benchs_refusal_when_the_weights_alone_do_not_fit_suggests_lighter_weights(monkeypatch):
    said = _refusal(monkeypatch, "cuda", lambda counted: counted.param_bytes - 2**30, dtype="bfloat16")
    assert "the weights alone do not fit" in said and "--offload model" in said and "--quantize int8" in said
    assert "diffmeter fit flux-dev --gpu NAME" in said and "--vae-tiling" not in said
    said = _refusal(monkeypatch, "cpu", lambda counted: counted.param_bytes - 2**30, dtype="float32")
    assert "--dtype bfloat16" in said and "--offload" not in said and "--vae-tiling" not in said


def test_benchs_refusal_when_the_decode_tips_it_over_suggests_the_decode_modes(monkeypatch):
    said = _refusal(monkeypatch, "cuda", lambda counted: counted.param_bytes + 2**20, dtype="bfloat16", height=2048)
    assert "--vae-tiling" in said and "--offload" not in said


def test_a_card_without_a_bandwidth_names_it_and_the_option_that_gives_it():
    from diffmeter.predict.devices import named_gpu
    from diffmeter.predict.roofline import missing_figures
    from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork

    matmul = OperatorGroup(kind="matmul", flops=10**12, bytes=1, calls=1)
    work = OperatorWork(
        dtype="bfloat16",
        calls=[
            CallWork(
                stage="denoising",
                component="transformer",
                count=1,
                operators=[matmul],
                dtype="bfloat16",
                dispatched=1,
                modules=1,
            )
        ],
    )
    card = named_gpu("h100").model_copy(update={"bandwidth_bytes_per_s": None})
    assert missing_figures(card, work) == (
        'the table gives the H100 SXM no memory bandwidth; give its figures with --gpu-spec (e.g. "80GB,989TFLOPS,'
        '3.35TB/s")'
    )
    assert missing_figures(named_gpu("h100"), work) is None


def test_a_leaderboard_cell_without_a_time_says_why():
    """An offloading setting on a card without a host link has no lower bound: its cell said "time: lower bound
    only"."""
    from diffmeter.predict.gpu_spec import spec_gpu
    from diffmeter.runs.leaderboard import model_cells

    card = spec_gpu(f"{CUDA_HOLDBACK_BYTES / 2**30 + 0.004:.6f}GB,100TFLOPS,1TB/s")  # tiny-flux fits offloaded only
    [cell] = model_cells("tiny-flux", [card])
    assert any("offload" in technique for technique in cell.setting) and cell.lower_s is None
    assert "no time: offloading's weight transfers are not timed: --gpu-spec gives no host link" in " ".join(cell.notes)
