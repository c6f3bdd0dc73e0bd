"""One GPU of a context-, tensor- or CFG-parallel group as the offline prediction takes it, for `profile --gpu` and
for the prediction a parallel bench run stores: each denoiser call replaced by the rank's (``rank_prediction``,
counted over a fake process group: before the run joins its real one), and the group's communication added to the
time over the card's link (``predict.parallel``)."""

from __future__ import annotations

from math import prod

from diffmeter.distributed.rank_prediction import rank_calls
from diffmeter.predict.bench_prediction import no_prediction
from diffmeter.predict.parallel import (
    LEFT_OUT,
    NOT_CALIBRATED,
    communication_fit,
    gpu_link,
    per_gpu_memory,
    per_gpu_work,
    summarize,
    with_communication,
)


def assumptions(ring: int, cfg: int, tp: int = 1) -> tuple[str, ...]:
    """What the parallel prediction assumes beyond diffusers' own split."""
    found = ["every rank runs the text encoders and the VAE decode whole, as diffusers' pipelines do"]
    if tp > 1:
        found.append(
            "tensor parallel: each rank holds its shard of the denoiser's planned layers (_tp_plan) and all-reduces "
            "each row-wise layer's output, timed as a ring all-reduce (2 (N - 1) / N of the output received)"
        )
    if ring > 1:
        found.append(
            "ring attention with PyTorch's flash kernel (it returns the log-sum-exp ring needs; bench: --opt "
            "attention:backend=flash)"
        )
    if cfg > 1:
        found.append(
            "CFG parallel: a rank runs half of each batched call, or one call of each guided pair (the time is the "
            "two ranks' mean where the pair's calls differ, as a prompt and a negative prompt of other lengths do)"
        )
    return tuple(found)


def parallel_left_out(group) -> list[str]:
    """What a parallel group's time leaves out: always ``LEFT_OUT``, and ``NOT_CALIBRATED`` without the fit."""
    return [LEFT_OUT] if group.communication_calibrated else [NOT_CALIBRATED, LEFT_OUT]


class RankSplit:
    """One GPU of the group with ``degrees`` (ulysses, ring, cfg, tp) of ``spec`` (a ProfileSpec): its denoiser
    calls counted at construction, which needs no process group joined (``rank_calls``). Raises DiffmeterError
    where diffusers refuses the split. ``bench_prediction.GroupSplit``."""

    def __init__(self, spec, degrees: tuple[int, int, int, int], on_cuda: bool) -> None:
        self.degrees = degrees
        self.ranks, self.received = rank_calls(spec, *degrees, on_cuda=on_cuda)

    def split(self, memory, work):
        """One GPU's memory and work: each denoiser call replaced by the rank's."""
        return per_gpu_memory(memory, self.ranks), per_gpu_work(work, memory.denoisers, self.ranks)

    def communicate(self, time, device, peaks: tuple[int, int]):
        """The time with the communication over ``device``'s link (where the table has one), the group's figures,
        and what the time leaves out."""
        link = gpu_link(device, prod(self.degrees))
        fit = communication_fit()
        group = summarize(self.degrees, peaks, self.ranks, link, self.received, assumptions(*self.degrees[1:]), fit)
        if group.communication_s is not None:
            time = time and with_communication(time, group.communication_s, group.communication_host_s)
            left_out = parallel_left_out(group)
        else:  # nothing timed, at the datasheet rate or the fit's
            left_out = [f"multi-GPU communication: no link figure for {device.name}, not timed", LEFT_OUT]
        return time, group, left_out


def bench_split(spec, on_cuda: bool) -> tuple[RankSplit | None, str | None]:
    """A parallel bench run's split for its stored prediction (``spec``: the settled BenchSpec), or why none:
    counted by rank 0 before it joins the group, as the offline communication count is."""
    if spec.pipefusion_degree > 1 or spec.engine != "diffusers":
        return None, "no prediction: PipeFusion and xDiT's engine are not modelled"
    degrees = (spec.ulysses_degree, spec.ring_degree, spec.cfg_degree, spec.tp_degree)
    if spec.data_parallel > 1 or prod(degrees) == 1:
        return None, "no prediction: a data-parallel group (each rank its own batches) is not modelled yet"
    try:
        return RankSplit(spec.profile_spec(), degrees, on_cuda), None
    except Exception as error:  # noqa: BLE001 - the measured run goes on whatever the count meets
        return None, no_prediction(error)
