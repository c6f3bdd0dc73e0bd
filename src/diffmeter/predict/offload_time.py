"""The time an offloading setting adds to a generation: the weights it moves between the host and the GPU,
over the card's host link (PCIe or NVLink-C2C, ``devices.Device.host_link``) at its datasheet rate, so a
lower bound like the roofline's.

What each offload moves per generation (``optimize/offload.py`` applies diffusers' own):

* ``offload-model`` (``enable_model_cpu_offload``): every component in once and out once (accelerate's
  hook moves the previous model back to the CPU when the next one runs), serially with the compute.
* ``offload-sequential`` (``enable_sequential_cpu_offload``): every layer in at every call of its
  component (accelerate's ``AlignDevicesHook`` drops the GPU copy afterwards: nothing moves out), serially.
* ``offload-group`` (``enable_group_offload``, leaf level, ``use_stream=True``): the same bytes in, prefetched
  on a side stream, so the transfers overlap the compute: the generation takes at least the longer of the two.
"""

from __future__ import annotations

from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.techniques import stored_params

OFFLOADS = ("offload-model", "offload-sequential", "offload-group")


def moved_bytes(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> int:
    """Bytes the setting moves between host and GPU per generation (0 without offload)."""
    params = stored_params(prediction, techniques)
    called = {call.component for call in prediction.calls}
    if "offload-model" in techniques:
        return 2 * sum(params[name] for name in called)
    if "offload-sequential" in techniques or "offload-group" in techniques:
        return sum(call.count * params[call.component] for call in prediction.calls)
    return 0


def lower_s(
    compute_s: float, prediction: MemoryPrediction, techniques: tuple[str, ...], link_bytes_per_s: float | None
) -> float:
    """A lower bound of the generation's seconds under ``techniques``: ``compute_s`` (the roofline's bound)
    plus the host-link transfers, or the longer of the two where they overlap (group offload). A setting that
    moves nothing needs no link (a card whose host link is not in the table)."""
    moved = moved_bytes(prediction, techniques)
    transfer = moved / link_bytes_per_s if moved else 0.0
    return max(compute_s, transfer) if "offload-group" in techniques else compute_s + transfer
