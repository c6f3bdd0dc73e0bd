"""What a memory prediction is (pydantic), importable without torch: stored in profiles' caches and in
bench results. Every size is in bytes."""

from __future__ import annotations

from pydantic import BaseModel

TEXT_ENCODING, DENOISING_STEP, VAE_DECODE = "text encoding", "denoising step", "VAE decode"


class StageMemory(BaseModel):
    """The peak of one stage's heaviest call, as the pipeline runs it with every component loaded."""

    stage: str
    #: the component whose call peaks (its batch: CFG-doubled for a batched-CFG denoiser)
    component: str
    batch: int
    #: parameters and buffers of every loaded component, at the run's dtype
    resident_param_bytes: int
    #: of which this component's own
    component_param_bytes: int
    #: tensors held across the call: its inputs (latents, text embeddings) and outputs of earlier calls
    carried_bytes: int
    #: tensors the call itself allocated that are live at its peak (activations, temporaries, outputs)
    activation_bytes: int
    peak_bytes: int


class MemoryPrediction(BaseModel):
    """Peak memory of one generation, per stage and overall (bytes), from live-tensor tracking of
    every component run on fake tensors (``torch.distributed._tools.mem_tracker.MemTracker``)."""

    dtype: str
    stages: list[StageMemory]
    #: parameters and buffers per component, at the run's dtype
    component_param_bytes: dict[str, int]
    peak_bytes: int
    peak_stage: str
    #: every call's figures (``stages`` holds each stage's heaviest): what the techniques recombine
    calls: list[StageMemory] = []
    denoisers: list[str] = []
    #: per component: its largest single layer's parameters (what layer-wise offload keeps resident)
    largest_layer_bytes: dict[str, int] = {}
    #: "int8"/"fp8" -> per component: parameters with every nn.Linear weight quantized (torchao weight-only)
    quantized_bytes: dict[str, dict[str, int]] = {}
    #: the text encoders fp8-text-encoder stores in float8, and their parameters then
    large_text_encoders: list[str] = []
    fp8_storage_bytes: dict[str, int] = {}
    #: "vae-tiling"/"vae-slicing" -> the VAE decode's activations with it (None: the VAE has no such mode)
    vae_activation_bytes: dict[str, int | None] = {}
    #: the image/video decoder those figures are for (LTX-2 also decodes audio)
    decoder: str = ""
    method: str = "MemTracker under FakeTensorMode (CPU kernels' shapes; no allocator rounding)"
