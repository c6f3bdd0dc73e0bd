"""Per-stage timing of one pipeline call: text encoding, each denoising step, VAE decode.

Boundaries come from the pipeline's own components, so any diffusers pipeline is
covered without knowing its code: forward hooks on the text encoders, a pre-hook on
the denoiser (the first call opens step 0), a wrapper on ``scheduler.step`` (each call
closes a step) and one on the decoder's ``decode``. Steps are contiguous: step *i*
runs from the end of step *i-1* to the end of its own ``scheduler.step``. Whatever
lies outside these stages (tokenizing, latent preparation, post-processing) is
``other``, so the stages always add up to the device-timed total.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from diffmeter.measure.clock import CudaEventClock, HostClock


@dataclass
class StageTimes:
    """Seconds spent per stage in one call; ``steps_s`` has one entry per scheduler step."""

    total_s: float
    text_encoding_s: float
    steps_s: list[float]
    vae_decode_s: float
    other_s: float
    denoiser_calls: int

    @property
    def denoising_s(self) -> float:
        return sum(self.steps_s)


class StageTimer:
    """Install the stage boundaries on ``pipe`` while in a ``with`` block.

    ``begin()`` and ``end()`` bracket one pipeline call; ``end()`` synchronizes the
    device once and returns the call's :class:`StageTimes`.
    """

    def __init__(
        self,
        pipe,
        text_encoders: list[str],
        denoiser: str,
        decoder: str,
        clock: HostClock | CudaEventClock,
    ) -> None:
        self.pipe = pipe
        self.clock = clock
        self.text_encoders = [getattr(pipe, name) for name in text_encoders if getattr(pipe, name, None) is not None]
        self.denoiser = getattr(pipe, denoiser)
        self.decoder = getattr(pipe, decoder)
        self._handles: list = []
        self._marks: list[tuple[str, object]] = []
        self._depth = {"text": 0, "decode": 0}
        self._denoiser_calls = 0

    # ---- installing and removing the boundaries ---------------------------------------
    def __enter__(self) -> StageTimer:
        for encoder in self.text_encoders:
            self._handles.append(encoder.register_forward_pre_hook(lambda *_: self._enter("text")))
            self._handles.append(encoder.register_forward_hook(lambda *_: self._leave("text"), always_call=True))
        self._handles.append(self.denoiser.register_forward_pre_hook(lambda *_: self._denoiser_called()))
        self._wrap(self.pipe.scheduler, "step", after=lambda: self._marks.append(("step<", self.clock.mark())))
        self._wrap(self.decoder, "decode", before=lambda: self._enter("decode"), after=lambda: self._leave("decode"))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        for owner, name in ((self.pipe.scheduler, "step"), (self.decoder, "decode")):
            if name in vars(owner):
                delattr(owner, name)  # the class method shows through again
        self._handles.clear()

    @staticmethod
    def _wrap(owner, name: str, before=None, after=None) -> None:
        method = getattr(owner, name)

        @functools.wraps(method)
        def timed(*args, **kwargs):
            if before:
                before()
            try:
                return method(*args, **kwargs)
            finally:
                if after:
                    after()

        setattr(owner, name, timed)

    # ---- marks --------------------------------------------------------------------------
    def _enter(self, stage: str) -> None:
        self._depth[stage] += 1
        if self._depth[stage] == 1:
            self._marks.append((stage + ">", self.clock.mark()))

    def _leave(self, stage: str) -> None:
        self._depth[stage] -= 1
        if self._depth[stage] == 0:
            self._marks.append((stage + "<", self.clock.mark()))

    def _denoiser_called(self) -> None:
        self._denoiser_calls += 1
        if self._denoiser_calls == 1:
            self._marks.append(("step>", self.clock.mark()))

    # ---- one call -----------------------------------------------------------------------
    def begin(self) -> None:
        self._marks = [("begin", self.clock.mark())]
        self._denoiser_calls = 0

    def end(self) -> StageTimes:
        self._marks.append(("end", self.clock.mark()))
        self.clock.synchronize()
        return self._times()

    def _times(self) -> StageTimes:
        seconds = self.clock.seconds
        total = seconds(self._marks[0][1], self._marks[-1][1])
        spans = {"text": 0.0, "decode": 0.0}
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
        other = total - spans["text"] - sum(steps) - spans["decode"]
        return StageTimes(
            total_s=total,
            text_encoding_s=spans["text"],
            steps_s=steps,
            vae_decode_s=spans["decode"],
            other_s=other,
            denoiser_calls=self._denoiser_calls,
        )
