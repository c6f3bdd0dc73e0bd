"""What a profile is (pydantic), importable without torch: a cached profile is read and printed
without loading any library."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}
UNITS = {
    "macs": "multiply-accumulate operations (1 MAC = 1 multiply + 1 add)",
    "flops": "floating-point operations, 2 per MAC",
    "params": "parameters (count)",
    "param_bytes": "bytes of parameters at the profile's dtype",
}


#: how the JSON Schema describes a list of image sizes
HEIGHT_WIDTH = "each [height, width] in pixels (the reverse of the WxH the command line and folder names write)"


class CallProfile(BaseModel):
    """``count`` identical calls of a component at one batch size."""

    batch: int
    count: int
    macs_per_call: int
    note: str = ""


class ComponentProfile(BaseModel):
    """Compute of one component over the whole generation."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    role: str
    class_name: str = Field(serialization_alias="class", validation_alias=AliasChoices("class", "class_name"))
    params: int
    param_bytes: int
    calls: int
    batch_per_call: int
    #: ``macs`` / ``calls``: the mean where the calls differ (``invocations`` holds each)
    macs_per_call: int
    macs: int
    flops: int
    macs_by_kind: dict[str, int]
    share: float = 0.0
    invocations: list[CallProfile]
    modules_macs: dict[str, int] | None = None


def weights_of(components: list[ComponentProfile]) -> list[ComponentProfile]:
    """One row per component for its weights: a VAE that encodes an input image and decodes the output is two rows
    (one per role) holding one set of weights."""
    return list({c.name: c for c in components}.values())


class Profile(BaseModel):
    """Compute of one generation; every count names its unit (see ``units``)."""

    model: str
    name: str
    family: str
    origin: str
    #: the size generated at (pixels): after the pipeline's resolution binning or rounding
    height: int
    width: int
    #: the size asked for, when the pipeline generates at another one (None otherwise)
    requested_height: int | None = None
    requested_width: int | None = None
    num_frames: int | None
    #: the input images (height, width) as the pipeline resized them before encoding; empty: text-to-image
    input_images: list[tuple[int, int]] = Field(default=[], description=HEIGHT_WIDTH)
    #: the input image sizes asked for (height, width), when the pipeline resized any (None otherwise)
    requested_images: list[tuple[int, int]] | None = Field(default=None, description=HEIGHT_WIDTH)
    #: the ControlNet steering the denoiser (its hub id; its calls are the ``controlnet`` rows); None: none
    controlnet: str | None = None
    steps: int
    #: the denoiser loop's iterations: the timesteps the pipeline's scheduler gives at ``steps`` (PNDM: steps + 1)
    denoiser_steps: int | None = None
    #: the scheduler that sets them, and how many (``families.schedule.described``)
    scheduler: str | None = None
    batch_size: int
    guidance_scale: float
    #: components at another dtype than ``dtype`` (a float32 VAE under a bfloat16 pipeline)
    component_dtypes: dict[str, str] = {}
    #: FLUX.1's true CFG scale when it runs (a second, unconditional denoiser call per step); None: off
    true_cfg_scale: float | None = None
    #: Lumina 2's cfg_trunc_ratio: the unconditional call runs on the first steps only (None: every guided step)
    cfg_trunc_ratio: float | None = None
    cfg: bool
    dtype: str
    components: list[ComponentProfile]
    denoiser_macs_per_step: int
    total_macs: int
    total_flops: int
    params: int
    param_bytes: int
    notes: list[str] = []
    units: dict[str, str] = UNITS

    def weights(self) -> list[ComponentProfile]:
        return weights_of(self.components)

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)
