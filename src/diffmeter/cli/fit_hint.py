"""The `diffmeter fit` command `profile --gpu` points to when a generation does not fit: the same generation,
so fit answers for it and not for the catalog's default one."""

from __future__ import annotations

import shlex


def fit_command(spec, card: str, lora: str | None = None, tf32: bool = True) -> str:
    """The `diffmeter fit` command for the generation ``spec`` counts on ``card`` (its --gpu or --gpu-spec option):
    the settings the user gave that fit takes (the token counts, scheduler and ControlNet guidance it has no option
    for: fit counts them at the catalog's); ``lora``: the --lora file or folder given; ``tf32``: False for
    --no-tf32."""
    from diffmeter.spec import size_text

    given = [
        ("--height", spec.height),
        ("--width", spec.width),
        ("--steps", spec.steps),
        ("--batch-size", spec.batch_size if spec.batch_size != 1 else None),
        ("--guidance-scale", spec.guidance_scale),
        ("--true-cfg-scale", spec.true_cfg_scale),
        ("--num-frames", spec.num_frames),
        ("--dtype", spec.dtype),
        *(("--component-dtype", f"{name}={dtype}") for name, dtype in spec.component_dtypes),
        *(("--image-size", size_text(size)) for size in spec.image_sizes or ()),
        ("--controlnet", spec.controlnet),
        ("--lora", lora),
        ("--lora-rank", None if lora else spec.lora_rank),
        ("--lora-targets", ",".join(spec.lora_targets) or None),
    ]
    options = [f"{flag} {shlex.quote(str(value))}" for flag, value in given if value is not None]
    options += ["--no-image"] * (spec.image_sizes == ()) + ["--fuse-lora"] * spec.fuse_lora + ["--no-tf32"] * (not tf32)
    return " ".join(["diffmeter fit", shlex.quote(spec.model), card, *options])
