"""The time an offloading setting adds to a generation: the weights it moves between the host and the GPU over the
card's host link (PCIe or NVLink-C2C, ``devices.Device.host_link``): at its datasheet rate a lower bound like the
roofline's (``lower_s``, what ``fit`` orders by); at the share of that rate published runs of the mode achieved, a range
inside the expected time (``with_offload``).

What each offload moves per generation (``optimize/offload.py`` applies diffusers' own):

* ``offload-model`` (``enable_model_cpu_offload``): each component in when it is called off the GPU, out when the
  next in the pipeline's ``model_cpu_offload_seq`` is called (accelerate 1.15 hooks.py:748-763: the previous model's
  ``offload()`` only if it is on the GPU, ``module.to(device)`` only if the module is not), the last out at the end of
  ``__call__`` (diffusers 0.42.1 pipeline_utils.py:1270-1292 ``maybe_free_model_hooks`` re-enables the offload,
  whose ``self.to("cpu")`` is :1231); serially with the compute. A pipeline that encodes the negative prompt
  through every encoder after the prompt (SD3: pipeline_stable_diffusion_3.py:436-460, then :466-510) moves every
  encoder but the last in and out twice (``model_offload_moves``).
* ``offload-sequential`` (``enable_sequential_cpu_offload``): every layer in at every call of its
  component (accelerate's ``AlignDevicesHook`` drops the GPU copy afterwards: nothing moves out), serially.
* ``offload-group`` (``enable_group_offload``, leaf level, ``use_stream=True``): the same bytes in, prefetched
  on a side stream, so the transfers overlap the compute: the generation takes at least the longer of the two.

The host memory each copies (read in accelerate 1.15 and diffusers 0.42.1): model offload moves whole modules with
``module.to(...)`` both ways (accelerate/hooks.py:744-745 ``init_hook``, :748-763 ``pre_forward`` offloading the
previous model): pageable memory, nothing pinned. Sequential offload copies each tensor from ``cpu_offload``'s
``weights_map`` (accelerate/big_modeling.py:210, ``p.to("cpu")``: pageable) in ``AlignDevicesHook.pre_forward``
(hooks.py:359-395). Group offload with a stream pins every tensor's CPU copy
(diffusers/hooks/group_offloading.py:173-177, only with a stream :179-182) and offloads by pointing back at it, no copy
(:317-333): pinned, host to device only. The achieved share of the link per mode is measured on published runs against
the same runs without offload, held out by source, by ``benchmarks/calibrate_offload.py`` (``data/offload_rates.json``);
a mode with no published run on a named GPU is not timed, and is named as left out.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

from diffmeter import units
from diffmeter.predict.schema import TEXT_ENCODING, VAE_DECODE, MemoryPrediction, OffloadTime, TimePrediction
from diffmeter.predict.techniques import stored_params

OFFLOADS = ("offload-model", "offload-sequential", "offload-group")
#: the host memory each mode copies from and to (the module's docstring)
MEMORY = {"offload-model": "pageable", "offload-sequential": "pageable", "offload-group": "pinned"}


def call_order(prediction: MemoryPrediction) -> list[str]:
    """The components in the order one generation calls them: the text encoders a pass per prompt (the prompt
    through each, then the negative prompt: SD3's ``encode_prompt``), then every other call in plan order."""
    text = [call for call in prediction.calls if call.stage == TEXT_ENCODING]
    passes = max((call.count for call in text), default=0)
    order = [call.component for done in range(passes) for call in text if call.count > done]
    return order + [call.component for call in prediction.calls if call.stage != TEXT_ENCODING]


def model_offload_moves(prediction: MemoryPrediction) -> list[str]:
    """The components model offload moves onto the GPU per generation, once per move (each comes back out once):
    ``call_order`` through accelerate's chain, each component's predecessor the one before it in the pipeline's
    ``model_cpu_offload_seq`` (SD3's, pipeline_stable_diffusion_3.py:186: the encoders, the denoiser, the VAE): the
    plan's order of first calls with the decoder last (an image-to-image VAE encodes first, yet its hook follows the
    denoiser's); an absent component is skipped, as pipeline_utils.py:1238-1255 keeps the previous hook."""
    first = list(dict.fromkeys(call.component for call in prediction.calls))
    decoders = [name for name in first if any(c.stage == VAE_DECODE and c.component == name for c in prediction.calls)]
    chain = [name for name in first if name not in decoders] + decoders
    on_gpu: set[str] = set()
    moved = []
    for name in call_order(prediction):
        place = chain.index(name)
        if place:
            on_gpu.discard(chain[place - 1])  # the previous model's hook offloads it (a no-op when off the GPU)
        if name not in on_gpu:
            on_gpu.add(name)
            moved.append(name)
    return moved


def moved_bytes(
    prediction: MemoryPrediction, techniques: tuple[str, ...], computing: dict[str, float] | None = None
) -> int:
    """Bytes the setting moves between host and GPU per generation, both directions (0 without offload);
    ``computing``: per cached component, the least share of its calls that run every layer (``computing_shares``):
    sequential and group offload move only its weights of those (a skipped call loads only the blocks it runs)."""
    params = stored_params(prediction, techniques)
    if "offload-model" in techniques:
        return 2 * sum(params[name] for name in model_offload_moves(prediction))
    if "offload-sequential" in techniques or "offload-group" in techniques:
        share = computing or {}
        return round(sum(c.count * params[c.component] * share.get(c.component, 1.0) for c in prediction.calls))
    return 0


def computing_shares(time: TimePrediction) -> dict[str, float]:
    """Per component a cache skips calls of, the least share of its calls that compute in full: 1 - the most
    skipped share (``CacheSkip.skipped_share``); empty without a cache."""
    if time.cache is None:
        return {}
    return dict.fromkeys(time.cache.components, 1.0 - time.cache.skipped_share[1])


def lower_s(
    compute_s: float,
    prediction: MemoryPrediction,
    techniques: tuple[str, ...],
    link_bytes_per_s: float | None,
    computing: dict[str, float] | None = None,
) -> float:
    """A lower bound of the generation's seconds under ``techniques``: ``compute_s`` (the roofline's bound)
    plus the host-link transfers (a cached component's of its computing calls alone, ``moved_bytes``), or the longer
    of the two where they overlap (group offload). A setting that moves nothing needs no link (a card whose host link
    is not in the table)."""
    moved = moved_bytes(prediction, techniques, computing)
    transfer = moved / link_bytes_per_s if moved else 0.0
    return max(compute_s, transfer) if "offload-group" in techniques else compute_s + transfer


def untimed_lower_s(
    time: TimePrediction, prediction: MemoryPrediction, techniques: tuple[str, ...], link_bytes_per_s: float
) -> float:
    """The lower bound of a setting whose offload has no fitted link rate: ``time``'s bound with the transfers at
    ``link_bytes_per_s`` (``lower_s``), a cache's skipped calls moving none of their weights."""
    return lower_s(time.lower_s, prediction, techniques, link_bytes_per_s, computing_shares(time))


@functools.cache
def rates() -> dict[str, dict]:
    """Per offload mode fitted on published runs: the achieved share of the host link's datasheet rate ("low",
    "high", "midpoint") and "calibration", the runs and how well they held out (``data/offload_rates.json``)."""
    return json.loads(resources.files("diffmeter.predict").joinpath("data", "offload_rates.json").read_text())["modes"]


def offload_of(techniques: tuple[str, ...]) -> str | None:
    return next((t for t in techniques if t in OFFLOADS), None)


def why_untimed(techniques: tuple[str, ...], link_bytes_per_s: float | None) -> str | None:
    """Why the setting's offload is not in the expected time, or None where it is (or there is none)."""
    mode = offload_of(techniques)
    if mode is None:
        return None
    if mode not in rates():
        memory = MEMORY[mode]
        return f"{mode}: no published run of it on a named GPU to fit its achieved host-link rate ({memory} copies)"
    if not link_bytes_per_s:
        return f"{mode}: no host link figure for this device (predict/data/host_links.json)"
    return None


def with_offload(
    time: TimePrediction, prediction: MemoryPrediction, techniques: tuple[str, ...], link: str | None, link_rate: float
) -> TimePrediction:
    """``time`` with the setting's host transfers inside: the expected range widened by the transfers at the fitted
    shares of ``link_rate`` (bytes/s), added to the compute or, for group offload, the longer of the two; the lower
    bound at the datasheet rate (``lower_s``). The energy is dropped: the board power while the GPU waits on the
    link is not fitted."""
    mode = offload_of(techniques)
    fitted, moved = rates()[mode], moved_bytes(prediction, techniques)
    fast, slow = moved / (link_rate * fitted["high"]), moved / (link_rate * fitted["low"])
    overlapped = mode == "offload-group"
    expected, busy = time.expected_s, time.busy_share
    if expected is not None:
        low, high = expected
        expected = (max(low, fast), max(high, slow)) if overlapped else (low + fast, high + slow)
        if busy is not None:  # the GPU's busy time over a longer generation
            busy *= math.sqrt(time.expected_s[0] * time.expected_s[1] / (expected[0] * expected[1]))
    offload = OffloadTime(
        technique=mode,
        memory=MEMORY[mode],
        moved_bytes=moved,
        link=link,
        link_bytes_per_s=link_rate,
        achieved_share=(fitted["low"], fitted["high"]),
        transfer_s=(fast, slow),
        overlapped=overlapped,
        calibration=fitted["calibration"],
    )
    return time.model_copy(
        update={
            "expected_s": expected,
            "lower_s": lower_s(time.lower_s, prediction, techniques, link_rate),
            "busy_share": busy,
            "energy": None,
            "energy_left_out": f"{mode}: the board power while the GPU waits on the host link is not fitted",
            "offload": offload,
        }
    )


def with_transfer_bound(
    time: TimePrediction,
    prediction: MemoryPrediction,
    techniques: tuple[str, ...],
    link: str | None,
    link_rate: float,
) -> TimePrediction:
    """``time`` of a setting whose offload has no fitted link rate (no expected range): its lower bound still holds
    the transfers at ``link_rate``, the datasheet's, as ``fit`` bounds the same setting (``untimed_lower_s``); with a
    cache, those of the denoiser calls that compute in full at the most skipped share."""
    computing = computing_shares(time)
    bound = lower_s(time.lower_s, prediction, techniques, link_rate, computing)
    mode, moved = offload_of(techniques), moved_bytes(prediction, techniques, computing)
    how = "the longer of them and the compute" if mode == "offload-group" else "added to the compute"
    cached = (
        f", the {', '.join(computing)}'s of the {min(computing.values()):.0%} of its calls that compute in full "
        "alone (a skipped call loads only the blocks it runs)"
        if computing and min(computing.values()) < 1
        else ""
    )
    said = (
        f"; the whole generation's lower bound holds {mode}'s {units.gib(moved)} moved per generation "
        f"({DIRECTIONS[mode]}){cached} at the "
        f"{link or 'host link'}'s datasheet {link_rate / 1e9:g} GB/s ({how})"
    )
    return time.model_copy(update={"lower_s": bound, "calibration": time.calibration + said})


#: which way each mode's bytes cross the link (the module docstring's reading of accelerate and diffusers)
DIRECTIONS = {
    "offload-model": "each component to the GPU for its calls and back to the host after",
    "offload-sequential": "each layer to the GPU at every call, nothing back",
    "offload-group": "each layer to the GPU at every call, nothing back",
}


def offload_line(offload: OffloadTime) -> str:
    """What the expected time holds of an offload's transfers, in one line."""
    low, high = offload.achieved_share
    how = "the longer of them and the compute" if offload.overlapped else "added to the compute"
    return (
        f"{offload.technique}: {units.gib(offload.moved_bytes)} moved per generation "
        f"({DIRECTIONS[offload.technique]}) over the "
        f"{offload.link or 'host link'} ({offload.link_bytes_per_s / 1e9:g} GB/s per direction on its datasheet) at "
        f"{low:.1%} to {high:.1%} of that rate ({offload.memory} host memory): "
        f"{units.seconds_range(*offload.transfer_s)}, {how} in the expected time; {offload.calibration}"
    )
