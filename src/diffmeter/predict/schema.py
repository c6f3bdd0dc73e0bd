"""What a memory prediction is (pydantic), importable without torch: stored in profiles' caches and in
bench results. Every size is in bytes."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter.stages import STAGE_NAMES

TEXT_ENCODING, IMAGE_ENCODING, VAE_DECODE = (STAGE_NAMES[s] for s in ("text_encoding", "image_encoding", "vae_decode"))
DENOISING_STEP = "denoising step"  # a prediction's denoising stage is one step


class StageMemory(BaseModel):
    """The peak of one stage's heaviest call, as the pipeline runs it with every component loaded."""

    stage: str
    #: the component whose call peaks (its batch: CFG-doubled for a batched-CFG denoiser)
    component: str
    batch: int
    #: how many times per generation the call runs (a denoiser: once per step, twice with separate CFG calls)
    count: int = 1
    #: the dtype the pipeline casts the component to for this call alone (SDXL's float32 decode), else None
    cast_to: str | None = None
    #: parameters and buffers of every loaded component, at the run's dtype
    resident_param_bytes: int
    #: of which this component's own
    component_param_bytes: int
    #: tensors held across the call: its inputs (latents, text embeddings) and outputs of earlier calls
    carried_bytes: int
    #: tensors the call itself allocated that are live at its peak (activations, temporaries, outputs)
    activation_bytes: int
    peak_bytes: int
    #: per weight shape ("3072x3072"), the highest activations as a layer of it starts, with its output and with two
    #: outputs (``predict.layer_levels``): where a quantized layer's own allocations add to them
    layer_levels: dict[str, tuple[int, int, int]] = {}


class MemoryPrediction(BaseModel):
    """Peak memory of one generation, per stage and overall (bytes), from live-tensor tracking of
    every component run on fake tensors (``torch.distributed._tools.mem_tracker.MemTracker``)."""

    dtype: str
    #: the size the pipeline generates at (its rounding or resolution binning applied) and a video's frames: what
    #: every figure is of (0: a prediction stored before they were recorded)
    height: int = 0
    width: int = 0
    num_frames: int | None = None
    #: predicted for a CUDA device: with cuDNN's copies of a convolution's input, weight and output
    #: (``predict.convolution_copies.ConvolutionCopies``); False: for the CPU, without them
    on_cuda: bool = True
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
    #: per component: the weights a call reads at least (embedding tables left out): the ideal time bound's bytes
    weight_read_bytes: dict[str, int] = {}
    #: "int8"/"fp8" -> per component: parameters with every nn.Linear weight quantized (torchao weight-only); a
    #: ``--quantize BACKEND:TYPE`` technique ("quantize-bnb-nf4") -> the components it quantizes, as it stores them
    #: (``predict.quantized_memory``)
    quantized_bytes: dict[str, dict[str, int]] = {}
    #: such a technique -> per component: the most a layer allocates for its weight while it runs, on the device the
    #: prediction is for (its weight dequantized and what that takes; 0: none, ``predict.quantized_kernels``)
    dequantized_bytes: dict[str, dict[str, int]] = {}
    #: such a technique -> per component -> per weight shape: the most a layer of it allocates for its weight while it
    #: runs, what of that stays live beside its output, the outputs it holds at once and the bytes beside them
    #: (``Stored``); what ``stage_peaks_under`` adds where the call's layers of that shape run (``layer_levels``)
    dequantized_layers: dict[str, dict[str, dict[str, tuple[int, int, int, int]]]] = {}
    #: per component: a LoRA's weights at the run's dtype, already in ``component_param_bytes``; a quantized format
    #: stores the component's own weights, the adapter's beside them as they are (peft's layers wrap the quantized ones)
    adapter_bytes: dict[str, int] = {}
    #: the text encoders fp8-text-encoder stores in float8, and their parameters then
    large_text_encoders: list[str] = []
    fp8_storage_bytes: dict[str, int] = {}
    #: "vae-tiling"/"vae-slicing" -> the VAE decode's activations with it (None: the VAE has no such mode);
    #: only the modes the prediction was asked for (``predict_memory(vae_modes=...)``)
    vae_activation_bytes: dict[str, int | None] = {}
    #: the image/video decoder those figures are for (LTX-2 also decodes audio)
    decoder: str = ""
    #: how the family's prediction compared with a real run (``predict.memory_checks``)
    checked: str = ""
    method: str = "MemTracker under FakeTensorMode (CPU kernels' shapes; no allocator rounding)"


class OperatorGroup(BaseModel):
    """Operators of one kind with the same work: FLOPs and bytes moved (inputs read, outputs written)
    per call, and how many there are."""

    kind: str
    flops: int
    bytes: int
    calls: int
    #: attention scores per call (batch x heads x queries x keys) of a scaled-dot-product attention: each is a
    #: softmax exponential, which runs on the special-function units, not the tensor cores the FLOPs use
    scores: int = 0
    #: the dtype its operands are in where it differs from its call's (T5's ``wo`` kept in float32 in a float16
    #: run, charged float32's peak); None: the call's
    dtype: str | None = None


class CallWork(BaseModel):
    """One distinct component call of the plan and its operators; ``count`` such calls per generation."""

    stage: str
    component: str
    count: int
    operators: list[OperatorGroup]
    #: the dtype the call runs at (a float32 VAE, SDXL's float32 decode in a float16 run); None: the run's
    dtype: str | None = None
    #: what the host issues per call: every ATen operator dispatched (views, allocations and queries too, which
    #: ``operators`` leaves out), and the ``nn.Module`` calls
    dispatched: int
    modules: int
    #: chains of fusible operators (``compiled_time.FUSED_KINDS``) between library kernels, in the order they run:
    #: the kernels inductor makes of them (``compiled_time``); None: counted before diffmeter counted them
    fused_chains: int | None = None
    #: the bytes those chains move once each is one kernel (``fused_bytes``: what each reads from outside it and
    #: writes for use outside it, once); None: counted before diffmeter counted them
    fused_bytes: int | None = None
    #: run as torch.compile's generated code (``compiled_time``): a calibration with a compiled fit prices it so
    compiled: bool = False


class CacheSkip(BaseModel):
    """A cache's denoiser calls skipped in one generation (``predict.cache_time``): the share of the calls that
    skip, what a skipped call still runs, and how the share was obtained."""

    technique: str
    components: list[str]
    #: of the denoiser calls (lowest, highest): equal where the cache's config fixes the count (an interval cache)
    skipped_share: tuple[float, float]
    calls: int
    #: the share of a skipped call's work (multiply-accumulates) it still runs: the blocks the cache always computes
    #: and the work outside the blocks
    kept_share: float
    #: what the cache adds per call (the residual compare, the activations it stores or adds back), as operators
    overhead: list[OperatorGroup] = []
    how: str
    #: why the share is extrapolated (a threshold outside those of the published runs it comes from), or None
    extrapolated: str | None = None

    def share_text(self) -> str:
        """The skipped share as the outputs print it: "29% to 46% of the 28 denoiser calls"."""
        low, high = self.skipped_share
        share = f"{low:.0%}" if low == high else f"{low:.0%} to {high:.0%}"
        return f"{share} of the {self.calls} denoiser calls"

    def skips_text(self, extrapolated: str = "") -> str:
        """What the cache skips (``extrapolated``: said right after the share), and how much of a skipped call still
        runs where that is not nearly nothing: PAB's skipped calls reuse attention alone ("skips 0% to 50% of the 2
        denoiser calls, a skipped call still running 85% of its work"); none where no call skips."""
        skipping = self.skipped_share[1] > 0 and self.kept_share >= 0.05
        kept = f", a skipped call still running {self.kept_share:.0%} of its work" if skipping else ""
        return f"skips {self.share_text()}{extrapolated}{kept}"


def heaviest_calls(calls: list[StageMemory]) -> list[StageMemory]:
    """Each stage's heaviest call (the first of equal peaks), in the order a generation runs the stages."""
    heaviest: dict[str, StageMemory] = {}
    for call in calls:
        if call.stage not in heaviest or call.peak_bytes > heaviest[call.stage].peak_bytes:
            heaviest[call.stage] = call
    order = (TEXT_ENCODING, IMAGE_ENCODING, DENOISING_STEP, VAE_DECODE)
    return [heaviest[stage] for stage in order if stage in heaviest]


class OperatorWork(BaseModel):
    """Every operator of one generation, from fake-tensor execution of the profile's call plan."""

    dtype: str
    calls: list[CallWork]
    #: a cache on the denoiser: the time is predicted at both ends of its skipped share (``predict.cache_time``)
    cache: CacheSkip | None = None

    def dtypes(self) -> tuple[str, ...]:
        """The run's dtype and every other one a call or an operator runs at, sorted."""
        calls = {call.dtype for call in self.calls if call.dtype}
        operators = {group.dtype for call in self.calls for group in call.operators if group.dtype}
        return tuple(sorted({self.dtype} | calls | operators))


class StageTime(BaseModel):
    """A stage's predicted time (seconds): the roofline lower bound, and the range calibrated
    efficiencies give (None without a calibration for the device)."""

    stage: str
    operators: int
    flops: int
    bytes: int
    lower_s: float
    expected_s: tuple[float, float] | None = None
    #: the ideal bound: no implementation at the dtype, compiled or fused, is faster (None: no weights given)
    ideal_s: float | None = None
    #: the two sides ``expected_s`` is the longer of: the GPU's busy time and the host's issue time (None: no
    #: host term, as on a CPU)
    gpu_s: tuple[float, float] | None = None
    host_s: tuple[float, float] | None = None


class EnergyPrediction(BaseModel):
    """Joules per output of one generation (an image, or a video), and the board power they assume (watts)."""

    #: the card's TDP, with the datasheet it was read from (``data/gpu_power.json``)
    tdp_w: float
    #: the calibrated average board power while generating
    power_w: float
    outputs: int
    per_output_j: tuple[float, float]
    #: where the power share comes from, and how well it held on published runs left out of its fit
    calibration: str
    #: why the range's low end takes the host-wait at no power: the run waits longer than any fitted run (None: it
    #: does not, or the architecture's waiting power is fitted)
    waiting_unfitted: str | None = None


class OffloadTime(BaseModel):
    """An offload's host transfers in the expected time (``predict.offload_time``): the bytes it moves per
    generation over the card's host link at the achieved share of its datasheet rate fitted on published runs."""

    technique: str
    #: the host memory the copies read or write: "pageable" (accelerate's hooks) or "pinned" (group offload's)
    memory: str
    moved_bytes: int
    link: str | None = None
    link_bytes_per_s: float
    #: the achieved share of the datasheet rate (lowest, highest) the published runs of the mode imply
    achieved_share: tuple[float, float]
    #: seconds the transfers take at those shares (at the highest share first)
    transfer_s: tuple[float, float]
    #: whether they overlap the compute (the generation takes the longer of the two) or add to it
    overlapped: bool
    #: the runs the share was fitted on, and how well it held on them held out by source
    calibration: str


class TimePrediction(BaseModel):
    """Seconds per generation on one device: per stage (``text_encoding``, ``denoising``,
    ``vae_decode``) and whole, with the figures it used."""

    device: str
    dtype: str
    peak_tflops: float
    #: "tf32" when ``peak_tflops`` is not the dtype's own: a float32 run's matmuls on TF32 tensor cores
    peak_precision: str | None = None
    bandwidth_bytes_per_s: float
    stages: list[StageTime]
    lower_s: float
    expected_s: tuple[float, float] | None = None
    ideal_s: float | None = None
    #: the card's L2 cache (bytes): operators whose bytes fit in it are charged no memory time in ``lower_s``
    l2_bytes: int | None = None
    #: where the expected range's efficiencies come from, or why there is none
    calibration: str
    #: the stack the range is for: the torch version and the kernel SDPA's attention is timed on ("cudnn": SDPA's
    #: default on Hopper from torch 2.11, ``attention_kernels``), e.g. "torch 2.11.0, SDPA on cudnn"
    stack: str | None = None
    #: why the expected range may not hold for this run (smaller operators than any fitted run's), or None
    outside_calibration: str | None = None
    #: the pipeline call's own work outside its components' calls (latents, timesteps, postprocessing), seconds,
    #: included in ``expected_s``; None without a host term
    outside_stages_s: tuple[float, float] | None = None
    #: why the run is host-bound (the host issues its work slower than the GPU runs it), or None
    host_bound: str | None = None
    #: the share of the expected time the GPU is busy; None without a host term
    busy_share: float | None = None
    #: the energy per output the expected time implies at the calibrated board power (None: no TDP or no fit)
    energy: EnergyPrediction | None = None
    #: why ``energy`` is None: what is missing (the card's TDP, a fitted board power, an expected time)
    energy_left_out: str | None = None
    #: the peaks of operators charged another than ``peak_tflops``, as "component in dtype: TFLOP/s per kind"
    other_peaks: list[str] = []
    #: how the card's board power holds its compute under the datasheet peaks in the expected time
    #: (``power_limit``), or None: a card at full power, or the lower bound alone
    power_limit: str | None = None
    #: an offload's host transfers, included in ``expected_s`` and ``lower_s`` (not in the stages)
    offload: OffloadTime | None = None
    #: a cache's skipped denoiser calls: the range is the time at the most and at the least skipped share
    cache: CacheSkip | None = None
    method: str = (
        "lower bound (of the eager operators as dispatched): per operator max(FLOPs / peak, bytes moved / "
        "bandwidth), bytes that fit in L2 not charged, summed; ideal bound (of any implementation at the dtype, "
        "compiled or fused): per call max(FLOPs / the dtype's dense peak, weights read once / bandwidth); "
        "expected: each kind's time divided by its calibrated achieved fraction, plus a calibrated overhead per "
        "operator"
    )


class Link(BaseModel):
    """The GPU-to-GPU link the ranks' collectives cross: its name, rate per direction (bytes/s) and source."""

    name: str
    bytes_per_s: float
    source: str


class ParallelPrediction(BaseModel):
    """What one GPU of the group holds and receives, and what the time assumes (bytes, seconds)."""

    ulysses_degree: int
    ring_degree: int
    cfg_degree: int
    tp_degree: int = 1
    gpus: int
    #: the same generation on one GPU, for comparison
    one_gpu_peak_memory_bytes: int
    per_gpu_peak_memory_bytes: int
    bytes_received_per_gpu: int
    collectives_per_generation: int
    link: Link | None
    #: per kind of collective: bytes received and calls per generation
    received_by_collective: dict[str, int] = {}
    calls_by_collective: dict[str, int] = {}
    #: the communication's time over ``link``, added to the denoising stage (None: no link known)
    communication_s: float | None
    #: the host's time issuing the collectives, added to the denoising stage's host side
    communication_host_s: float = 0.0
    communication_calibrated: bool = False
    assumptions: list[str] = []

    def degrees_text(self) -> str:
        """ "ulysses 2 x ring 1 x CFG 1", with " x tensor parallel T" under tensor parallelism."""
        degrees = f"ulysses {self.ulysses_degree} x ring {self.ring_degree} x CFG {self.cfg_degree}"
        return degrees + (f" x tensor parallel {self.tp_degree}" if self.tp_degree > 1 else "")


class RunPrediction(BaseModel):
    """What ``bench`` stores beside its measurements: the offline prediction for the run's settings
    on the device it ran on (bytes, seconds per call)."""

    device: str
    #: peak memory of one generation, with the run's memory techniques where they are modelled
    peak_memory_bytes: int | None = None
    #: each stage's peak (text encoding, denoising step, VAE decode), with the same techniques
    stage_peak_memory_bytes: dict[str, int] = {}
    memory_techniques: list[str] = []
    #: each component's weights as the run's techniques store them (``techniques.stored_params``): bench's measured
    #: ``weights_bytes`` is their check
    weights_bytes: dict[str, int] = {}
    time: TimePrediction | None = None
    #: the run's techniques the time prediction leaves out: it is the time of a pipeline without them, not of what ran
    time_left_out: list[str] = []
    #: what the prediction leaves out of this run (techniques it does not model), or why a part is missing
    notes: list[str] = []
    #: a parallel run's group (``predict.parallel.summarize``): the memory and time above are one GPU's of it
    parallel: ParallelPrediction | None = None
