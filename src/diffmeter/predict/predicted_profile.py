"""What ``diffmeter profile MODEL --gpu GPU --json`` prints (pydantic, importable without torch): the profile's
counts with the card's memory and time prediction beside them. Exported as docs/profile.schema.json, so every key
the command writes is in the schema a user validates against, with its unit (unknown top-level keys refused)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from diffmeter.flops.schema import UNITS, Profile
from diffmeter.predict.devices import Device
from diffmeter.predict.schema import MemoryPrediction, ParallelPrediction, TimePrediction

#: the unit of each kind of figure a prediction adds, by its key ("*_bytes": every key ending so)
PREDICTION_UNITS = {
    "*_bytes": "bytes (every table prints them in GiB, 2^30 bytes)",
    "bytes": "bytes moved by the stage's operators",
    "*_bytes_per_s": "bytes per second",
    "*_s": "seconds; a pair is a range [low, high]",
    "*_w": "watts",
    "*_j": "joules; a pair is a range [low, high]",
    "*tflops": "TFLOP/s (10^12 floating-point operations per second), dense",
    "*_share, share": "a fraction, 0 to 1 (of what, its key's description in the schema says)",
    "operators, calls, count, outputs": "counts",
}
#: with --gpu: only there, so only then are they in the printed object
ONLY_WITH_GPU = "present with --gpu (--gpu-spec) only"


class PredictedProfile(Profile):
    """A profile, and with --gpu the named card's prediction for it: the keys below are absent without --gpu."""

    model_config = ConfigDict(extra="forbid")

    #: the card predicted for, as the GPU table gives it (memory as its driver reports it)
    gpu: Device | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the peak memory of each stage without any memory technique
    memory: MemoryPrediction | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the memory techniques asked for (--opt, --quantize, --offload) that the peaks below apply
    memory_techniques: list[str] | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the techniques the time applies and memory leaves as without them (compile, attention kernels, caches)
    time_techniques: list[str] | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the largest stage's peak under ``memory_techniques``
    peak_memory_bytes: int | None = Field(default=None, description=ONLY_WITH_GPU)
    #: each stage's peak under ``memory_techniques`` (``memory`` is without them)
    stage_peak_memory_bytes: dict[str, int] | None = Field(default=None, description=ONLY_WITH_GPU)
    #: whether that peak fits the card's memory less the CUDA context held back; null: the card has no one size
    fits: bool | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the bytes the card lacks for it; null: it fits (or no one size)
    short_of_bytes: int | None = Field(default=None, description=ONLY_WITH_GPU)
    #: the expected time, its bounds and energy; null: see ``no_time``
    time: TimePrediction | None = Field(default=None, description=ONLY_WITH_GPU)
    #: why ``time`` is null
    no_time: str | None = Field(default=None, description=ONLY_WITH_GPU)
    #: each timed quantized format's own held-out figure (null: no quantized format timed)
    quantized_time_held_out: str | None = Field(default=None, description=ONLY_WITH_GPU)
    #: what the time leaves out, "label: why" each: the time is then of the pipeline without it
    time_left_out: list[str] | None = Field(default=None, description=ONLY_WITH_GPU)
    #: one GPU of a parallel group (--ulysses-degree, --ring-degree, --cfg-degree, --tp-degree): memory and time
    #: above are that GPU's
    parallel: ParallelPrediction | None = Field(default=None, description=ONLY_WITH_GPU)

    #: without --gpu, a context- or CFG-parallel group's split of one denoising step per GPU: its compute, the
    #: bytes each GPU receives, the collectives per denoiser call (``distributed.communication.per_gpu_step``)
    context_parallel_per_gpu_step: dict[str, Any] | None = Field(
        default=None, description="present with --ulysses-degree, --ring-degree or --cfg-degree and no --gpu"
    )

    def to_json_dict(self) -> dict:
        """The printed object: a profile's keys, and the prediction's where one was made (a key left unset is
        absent; inside the objects every key is written, defaults included)."""
        return {k: v for k, v in self.model_dump(mode="json", by_alias=True).items() if k in self.model_fields_set}


class Profiles(BaseModel):
    """Several profiles (models, sizes or step counts asked at once)."""

    model_config = ConfigDict(extra="forbid")

    profiles: list[PredictedProfile]


class ProfileOutput(RootModel[PredictedProfile | Profiles]):
    """What ``profile --json`` prints: one profile's object, or ``{"profiles": [...]}`` for several."""


def with_prediction(profile: Profile, **prediction) -> dict:
    """``profile``'s JSON object with ``prediction``'s keys (``PredictedProfile``'s fields), checked against the
    schema, and the units of the figures they add."""
    # the profile's fields as they are (its components already validated), not dumped and parsed again
    found = PredictedProfile.model_validate({**dict(profile), **prediction, "units": {**UNITS, **PREDICTION_UNITS}})
    return found.to_json_dict()
