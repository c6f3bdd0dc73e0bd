"""The compute a card sustains under its board power: one die is sold at several TDPs (GA100 at 400 W in the A100
SXM, 250 W in the 40 GB PCIe card; AD102 at 450 W in the RTX 4090, 300-350 W in the L40 series, whose tensor cores
also run twice the 4090's rate per clock), and a card with less power per datasheet TFLOP than its die's reference
holds lower clocks than the boost clock its datasheet peak assumes.

Dynamic power is C V^2 f. Near the top of a GPU's voltage-frequency curve V rises about as f does, so power grows
about as f^3 (en.wikipedia.org/wiki/Dynamic_frequency_scaling: "dynamic power ... scales with the cube of the
frequency" when voltage scales with it); at the curve's voltage floor it grows as f alone. A card needing 1 / r of
the reference's power per datasheet TFLOP therefore sustains about r^k of its peak, k between 1/3 and 1. k is
fitted: ``benchmarks/calibrate_published.py`` chooses it among ``EXPONENTS`` (0: no power term; the grid stops at
2/3, which held out did as well as the 1/2 chosen) by the eager fit's error, inside each held-out fold for the
claims, and ships it with the calibrations it was fitted with (``Calibration.power_exponent``). Only the compute
peaks scale; the memory bandwidth does not. The expected time reads the sustained peaks (``roofline.expected_ranges``,
and the published runs it is fitted on); the lower bound keeps the datasheet's, so it stays a bound."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources

from diffmeter.predict.devices import Device, named_gpu

#: the exponents the fit chooses among: no power term, the cube law's 1/3, and steeper ones toward the voltage floor
EXPONENTS = (0.0, 1 / 3, 1 / 2, 2 / 3)
#: the precisions run on the tensor cores: one without a reference figure of its own takes the bf16 factor
TENSOR_KEYS = ("tf32", "bf16", "fp16", "fp8")


def exponent_text(exponent: float) -> str:
    """An exponent as the fraction it is meant as: "1/2", "2/3", "0"."""
    return str(Fraction(exponent).limit_denominator(12))


@dataclass(frozen=True)
class PowerLimit:
    """A card's sustained share of each datasheet peak (``factors``, per ``Device.tflops`` key, each <= 1), read
    against ``reference``, its ``die``'s full-power form (``data/gpu_dies.json``), to the power ``exponent``."""

    die: str
    reference: str
    factors: dict[str, float]
    exponent: float

    def describe(self) -> str:
        shares: dict[str, list[str]] = {}
        for key, factor in self.factors.items():
            if factor < 1:
                shares.setdefault(f"{factor:.2f}", []).append(key)
        said = ", ".join(f"{share} ({'/'.join(keys)})" for share, keys in shares.items())
        return (
            f"the expected time runs the compute at {said} of the datasheet peaks: what its TDP sustains, its power "
            f"per TFLOP against the {self.reference}'s (the same {self.die} die) to the "
            f"{exponent_text(self.exponent)} power"
        )


@functools.cache
def dies() -> dict[str, dict]:
    """Each die with its reference card and the table cards on it (``data/gpu_dies.json``, cited)."""
    text = resources.files("diffmeter.predict").joinpath("data/gpu_dies.json").read_text()
    return json.loads(text)["dies"]


def die_of(name: str) -> str | None:
    return next((die for die, entry in dies().items() if name in entry["cards"]), None)


def power_limit(device: Device, exponent: float | None) -> PowerLimit | None:
    """``device``'s power limit where its die's reference has more board power per TFLOP than it has at some
    precision, each share to ``exponent`` (the calibration's); None for a card at full power, a card of no listed
    die, without a TDP, or given by --gpu-spec, and for no exponent or 0 (no power term)."""
    die = None if not exponent or device.given or device.kind != "cuda" else die_of(device.name)
    if die is None or not device.tdp_w:
        return None
    reference = named_gpu(dies()[die]["reference"])
    if not reference.tdp_w or device.name == reference.name:
        return None
    factors = {
        key: min(1.0, (device.tdp_w / peak) / (reference.tdp_w / reference.tflops[key])) ** exponent
        for key, peak in device.tflops.items()
        if key in reference.tflops
    }
    if "bf16" in factors:  # a tensor precision the reference has no figure for: the bf16 factor
        factors |= {key: factors["bf16"] for key in TENSOR_KEYS if key in device.tflops and key not in factors}
    if all(factor == 1.0 for factor in factors.values()):
        return None
    return PowerLimit(die, reference.name, factors, exponent)


def sustained(device: Device, exponent: float | None) -> Device:
    """``device`` with each compute peak at the share its TDP sustains (``power_limit``); itself where none."""
    limit = power_limit(device, exponent)
    if limit is None:
        return device
    tflops = {key: peak * limit.factors.get(key, 1.0) for key, peak in device.tflops.items()}
    return device.model_copy(update={"tflops": tflops})
