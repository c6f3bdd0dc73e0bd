"""What ``diffmeter fit MODEL --json`` prints (pydantic, importable without torch): the settings that fit a card,
ranked as the table ranks them, with what the command could not time and why. Exported as docs/fit.schema.json,
which forbids keys it does not name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

#: the unit of each kind of figure, by its key ("*_bytes": every key ending so)
FIT_UNITS = {
    "*_bytes": "bytes (the table prints them in GiB, 2^30 bytes)",
    "*_s": "seconds per generation; a pair is a range [low, high]",
    "cache_skipped_share": "a fraction of the denoiser calls, [low, high]",
}


class FitSetting(BaseModel):
    """One setting that fits, a row of the table."""

    model_config = ConfigDict(extra="forbid")

    #: its techniques, as bench's stored prediction names them
    techniques: list[str]
    #: its speed-ups as bench's --opt values (compile:mode=default, first-block-cache:threshold=0.05)
    optimizations: list[str]
    #: the bench options that run it ("" for the plain pipeline)
    bench: str
    #: the predicted peak under its techniques
    peak_bytes: int
    #: the peak within the memory prediction's checked error of what is left: a real run may not fit (ranked after
    #: the settings with room to spare)
    borderline: bool
    #: the card's memory less what is held back for CUDA, less the peak
    left_bytes: int
    #: the lower bound of its time; null: see ``time_left_out``
    lower_s: float | None
    #: the calibrated range with every technique of it (the rows are ranked by its geometric midpoint, those with
    #: room to spare first); null: see ``not_ranked``
    expected_s: tuple[float, float] | None
    #: why it has no expected range: a technique the time does not model
    not_ranked: str | None
    #: a cache's share of the denoiser calls skipped, [low, high]
    cache_skipped_share: tuple[float, float] | None
    #: why that share is an extrapolation beyond the published runs, or null
    cache_extrapolated: str | None
    #: a quantization whose time is not modelled (timed as the unquantized pipeline)
    time_note: str | None
    #: "lossless", a measured cost, or "not measured"
    quality: str


class Refusal(BaseModel):
    """A setting that would fit but bench refuses, with why."""

    model_config = ConfigDict(extra="forbid")

    techniques: list[str]
    reason: str


class FitAnswer(BaseModel):
    """The settings bench can run whose predicted peak fits the card once the CUDA context is held back."""

    model_config = ConfigDict(extra="forbid")

    model: str
    #: the table's GPU, or the --memory given
    device: str
    #: the generation fitted as asked (null: the model's default applies)
    settings: dict[str, Any]
    #: the same with those defaults filled in
    resolved: dict[str, Any]
    #: the card's memory as its driver reports it
    memory_bytes: int | None
    #: kept for the CUDA context and libraries
    held_back_bytes: int
    #: the link offloading's transfers cross ("PCIe Gen4 x16"), null where the card has none known
    host_link: str | None
    #: every setting that fits, ranked (the table shows the first)
    fits: list[FitSetting]
    #: the pipeline's peak without techniques: why it does not fit, where it does not
    plain_peak_bytes: int
    refused_by_bench: list[Refusal]
    #: how the memory prediction was checked
    memory_checked: str | None
    #: why a setting has no lower_s
    time_left_out: str | None
    #: the held-out figure of each expected range given (the eager calibration's, each technique's)
    held_out: list[str] | None
    #: the card's compute under its TDP, where limited
    power_limit: str | None
    #: what to do when nothing fits
    next_step: str | None
    units: dict[str, str] = FIT_UNITS
