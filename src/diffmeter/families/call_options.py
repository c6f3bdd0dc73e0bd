"""``__call__`` options only some pipelines take (FLUX.1's ``true_cfg_scale``, Lumina 2's ``cfg_trunc_ratio``):
refused in one line where the family's pipeline takes none."""

from __future__ import annotations

from diffmeter.errors import DiffmeterError


def refuse_unsupported(family, entry, spec) -> None:
    """Refuse an option ``family``'s pipeline does not take (``Family.true_cfg``, ``Family.truncates_cfg``)."""
    if spec.true_cfg_scale is not None and not family.true_cfg:
        if "true_cfg_scale" in family.guidance_arguments(entry, 1.0):  # Qwen-Image: its one guidance is true CFG
            raise DiffmeterError(
                f"{entry.pipeline_class}'s true_cfg_scale is what --guidance-scale sets for {entry.name} (1: no CFG): "
                f"use --guidance-scale {spec.true_cfg_scale:g} instead of --true-cfg-scale"
            )
        raise DiffmeterError(
            f"--true-cfg-scale is FLUX.1's true CFG beside its embedded guidance; {entry.name} guides with "
            "--guidance-scale alone: drop --true-cfg-scale"
        )
    if spec.cfg_trunc_ratio is not None and not family.truncates_cfg:
        raise DiffmeterError(
            f"--cfg-trunc-ratio is Lumina2Pipeline's (CFG on the first steps only); {entry.name} "
            f"({entry.pipeline_class}) takes none: drop it"
        )
