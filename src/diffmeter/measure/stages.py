"""Per-stage timing of one pipeline call: text encoding, image encoding, each denoising step, VAE decode.

Boundaries come from the pipeline's own components, so any diffusers pipeline is
covered without knowing its code: forward hooks on the text encoders, a pre-hook on
the denoiser (the first call opens step 0), a wrapper on ``scheduler.step`` (each call
closes a step) and ones on the VAE's ``encode`` (an input image) and ``decode``. Steps are contiguous: step *i*
runs from the end of step *i-1* to the end of its own ``scheduler.step``. Whatever
lies outside these stages (tokenizing, latent preparation, post-processing) is
``other``, so the stages always add up to the device-timed total.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:  # annotations only: a stored run's stages are read without torch
    from diffmeter.measure.clock import CudaEventClock, HostClock
    from diffmeter.measure.stage_memory import StagePeaks

_NOTHING = object()


class _Timed:
    """A method wrapped with stage marks. A deep copy of its owner (LTX2Pipeline copies its scheduler for the
    audio latents) gets the plain method bound to the copy, not this wrapper stepping the original."""

    def __init__(self, method, before, after) -> None:
        functools.update_wrapper(self, method)
        self.method, self.before, self.after = method, before, after

    def __call__(self, *args, **kwargs):
        if self.before:
            self.before()
        try:
            return self.method(*args, **kwargs)
        finally:
            if self.after:
                self.after()

    def __deepcopy__(self, memo):
        copied = memo.get(id(getattr(self.method, "__self__", None)))
        plain = getattr(self.method, "__func__", None)
        return self if copied is None or plain is None else plain.__get__(copied)


class Stages(BaseModel):
    """Seconds per stage of one call; ``steps_s`` has one entry per scheduler step, and the
    stages add up to the call's device-timed total."""

    text_encoding_s: float
    #: the VAE encoding input images (editing, image-to-video); 0 for text-to-image and results stored before
    image_encoding_s: float = 0.0
    denoising_s: float
    steps_s: list[float]
    vae_decode_s: float
    other_s: float


@dataclass
class StageTimes:
    """One call: its device-timed total, its stages and how often the denoiser ran."""

    total_s: float
    stages: Stages
    denoiser_calls: int


class StageTimer:
    """Install the stage boundaries on ``pipe`` while in a ``with`` block.

    ``begin()`` and ``end()`` bracket one pipeline call; ``end()`` synchronizes the
    device once and returns the call's :class:`StageTimes`.
    """

    def __init__(
        self,
        pipe,
        text_encoders: list[str],
        denoiser: str | list[str],
        decoder: str,
        clock: HostClock | CudaEventClock,
        memory: StagePeaks | None = None,
    ) -> None:
        self.pipe = pipe
        self.clock = clock
        #: CUDA's peak allocated bytes per stage, read at every mark
        self.memory = memory
        self.text_encoders = [getattr(pipe, name) for name in text_encoders if getattr(pipe, name, None) is not None]
        #: the denoiser, and the experts a pipeline switches to between steps (Wan 2.2's transformer_2)
        names = [denoiser] if isinstance(denoiser, str) else denoiser
        self.denoisers = [getattr(pipe, name) for name in names if getattr(pipe, name, None) is not None]
        self.decoder = getattr(pipe, decoder)
        self._handles: list = []
        #: (owner, method name, what the owner's own __dict__ held before wrapping, if anything)
        self._wrapped: list[tuple[object, str, object]] = []
        self._marks: list[tuple[str, object]] = []
        self._depth = {"text": 0, "encode": 0, "decode": 0}
        self._denoiser_calls = 0
        #: called with each mark's label right after it is taken (``bench --trace`` opens its ranges there)
        self.listener: Callable[[str], None] | None = None

    # ---- installing and removing the boundaries ---------------------------------------
    def __enter__(self) -> StageTimer:
        for encoder in self.text_encoders:
            self._handles.append(encoder.register_forward_pre_hook(lambda *_: self._enter("text")))
            self._handles.append(encoder.register_forward_hook(lambda *_: self._leave("text"), always_call=True))
        for denoiser in self.denoisers:
            self._handles.append(denoiser.register_forward_pre_hook(lambda *_: self._denoiser_called()))
        self._wrap(self.pipe.scheduler, "step", after=lambda: self._mark("step<"))
        self._wrap(self.decoder, "decode", before=lambda: self._enter("decode"), after=lambda: self._leave("decode"))
        if callable(getattr(self.decoder, "encode", None)):
            self._wrap(
                self.decoder, "encode", before=lambda: self._enter("encode"), after=lambda: self._leave("encode")
            )
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        for owner, name, previous in reversed(self._wrapped):
            if previous is _NOTHING:
                delattr(owner, name)  # the class method shows through again
            else:
                setattr(owner, name, previous)  # e.g. a compiled decode
        self._handles.clear()
        self._wrapped.clear()

    def _wrap(self, owner, name: str, before=None, after=None) -> None:
        method = getattr(owner, name)
        self._wrapped.append((owner, name, vars(owner).get(name, _NOTHING)))

        setattr(owner, name, _Timed(method, before, after))

    # ---- marks --------------------------------------------------------------------------
    def _mark(self, label: str) -> None:
        self._marks.append((label, self.clock.mark()))
        if self.memory is not None:
            self.memory.mark(label)
        if self.listener is not None:
            self.listener(label)

    def _enter(self, stage: str) -> None:
        self._depth[stage] += 1
        if self._depth[stage] == 1:
            self._mark(stage + ">")

    def _leave(self, stage: str) -> None:
        self._depth[stage] -= 1
        if self._depth[stage] == 0:
            self._mark(stage + "<")

    def _denoiser_called(self) -> None:
        self._denoiser_calls += 1
        if self._denoiser_calls == 1:
            self._mark("step>")

    # ---- one call -----------------------------------------------------------------------
    def begin(self) -> None:
        self._marks = []
        self._denoiser_calls = 0
        self._mark("begin")

    def end(self) -> StageTimes:
        self._mark("end")
        self.clock.synchronize()
        return self._times()

    def _times(self) -> StageTimes:
        seconds = self.clock.seconds
        total = seconds(self._marks[0][1], self._marks[-1][1])
        spans = {"text": 0.0, "encode": 0.0, "decode": 0.0}
        opened: dict[str, object] = {}
        steps, step_start = [], None
        for label, mark in self._marks[1:-1]:
            stage, edge = label[:-1], label[-1]
            if stage == "step":
                if edge == ">":
                    step_start = mark
                elif step_start is not None:
                    steps.append(seconds(step_start, mark))
                    step_start = mark
            elif edge == ">":
                opened[stage] = mark
            else:
                spans[stage] += seconds(opened.pop(stage), mark)
        other = total - spans["text"] - spans["encode"] - sum(steps) - spans["decode"]
        stages = Stages(
            text_encoding_s=spans["text"],
            image_encoding_s=spans["encode"],
            denoising_s=sum(steps),
            steps_s=steps,
            vae_decode_s=spans["decode"],
            other_s=other,
        )
        return StageTimes(total_s=total, stages=stages, denoiser_calls=self._denoiser_calls)
