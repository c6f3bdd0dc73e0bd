"""Rich tables for profiles (laid out to the terminal's width, see ``layout``)."""

from __future__ import annotations

from rich.markup import escape

from diffmeter import units
from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.flops.schema import Profile
from diffmeter.report.layout import Column, FittedTable
from diffmeter.spec import sizes_text
from diffmeter.stages import DENOISER, IMAGE_ENCODER, STAGE_OF_ROLE, TEXT_ENCODER, VAE_DECODER


def size(profile: Profile, unit: str = " px (WxH)") -> str:
    """``WxH px``, the size asked for when the pipeline made another, and a video's frames (not inside the px);
    ``unit`` empty where a column's header names it."""
    made = f"{profile.width}x{profile.height}{unit}"
    if profile.requested_width is not None:
        made += f" (asked {profile.requested_width}x{profile.requested_height})"
    return made + (f", {profile.num_frames} frames" if profile.num_frames else "")


def _setting(profile: Profile) -> str:
    if profile.true_cfg_scale is not None:
        guidance = f"guidance {profile.guidance_scale:g} (embedded), true CFG {profile.true_cfg_scale:g}"
    else:
        guidance = f"guidance {profile.guidance_scale:g} ({'CFG' if profile.cfg else 'no CFG'})"
    own = ", ".join(f"{name} {dtype}" for name, dtype in profile.component_dtypes.items())
    dtype = f"{profile.dtype} ({own})" if own else profile.dtype
    images = ""
    if profile.input_images:
        made, asked = sizes_text(profile.input_images), sizes_text(profile.requested_images or [])
        images = f", input image{'s' if len(profile.input_images) > 1 else ''} {made}" + (
            f" (given {asked})" if asked else ""
        )
    if profile.controlnet:
        images += f", ControlNet {profile.controlnet}"
    steps = units.steps(profile.steps) + _denoiser_steps(profile)
    return f"{size(profile)}{images}, {steps}, batch {profile.batch_size}, {guidance}, {dtype}"


def _denoiser_steps(profile: Profile) -> str:
    """ " (21 denoiser steps)" where the scheduler calls the denoiser other than once per step (PNDM, Heun)."""
    return f" ({profile.denoiser_steps} denoiser steps)" if profile.denoiser_steps not in (None, profile.steps) else ""


def profile_table(profile: Profile) -> FittedTable:
    """One generation: a row per component, then the totals."""
    table = FittedTable(
        escape(f"{profile.name} ({profile.model}): {_setting(profile)}"),
        [
            Column("component", justify="left"),
            Column("role", justify="left", drop=2),
            Column("class", justify="left", drop=3),
            Column("params", drop=5),
            Column("calls x batch", drop=4),
            Column("MACs / call", drop=1),
            Column("MACs total"),
            Column("matmul / conv / attn", drop=0),
            Column("share", drop=6),
        ],
    )
    shown = set()
    for component in profile.components:
        shared = component.name in shown  # the VAE's second role: its weights are on its first row
        shown.add(component.name)
        split = _kind_split(component.macs_by_kind, component.macs)
        table.add_row(
            escape(component.name),
            component.role,
            component.class_name,
            "(above)" if shared else units.params(component.params),
            f"{component.calls} x {component.batch_per_call}",
            _per_call(component),
            units.macs(component.macs),
            split,
            f"{100 * component.share:.1f}%",
        )
        for path, value in (component.modules_macs or {}).items():
            table.add_row(
                escape(f"  .{path.removeprefix(component.name + '.')}"),
                *[""] * 5,
                units.macs(value),
                "",
                f"{100 * value / profile.total_macs:.1f}%",
                style="dim",
            )
    table.add_row("denoiser / step", *[""] * 5, units.macs(profile.denoiser_macs_per_step), "", "", section=True)
    table.add_row(
        "total",
        "",
        "",
        units.params(profile.params),
        "",
        "",
        f"{units.macs(profile.total_macs)} ({units.flops(profile.total_flops)})",
        _kind_split(_summed_kinds(profile.components), profile.total_macs),
        "100%",
        style="bold",
    )
    table.caption = "\n".join(
        [
            f"parameters: {units.gib(profile.param_bytes)} at {parameter_dtypes(profile)} (buffers not counted). "
            "1 MAC = 1 multiply-add = 2 FLOPs. Calls include classifier-free guidance as the pipeline runs it.",
            *([f"scheduler: {escape(profile.scheduler)}"] if profile.scheduler else []),
            *(f"note: {escape(note)}" for note in profile.notes),
        ]
    )
    return table


def run_dtypes(profile: Profile) -> str:
    """The run's dtype and each component kept at another ("bfloat16, vae float32")."""
    others = {name: dtype for name, dtype in profile.component_dtypes.items() if dtype != profile.dtype}
    return ", ".join([profile.dtype, *(f"{name} {dtype}" for name, dtype in others.items())])


def parameter_dtypes(profile: Profile) -> str:
    """The dtypes the profile's parameters are counted at: the run's, and each component kept at another
    ("the run's dtypes: bfloat16, vae float32")."""
    dtypes = run_dtypes(profile)
    return dtypes if dtypes == profile.dtype else f"the run's dtypes: {dtypes}"


def _kind_split(kinds: dict[str, int], macs: int) -> str:
    """The shares of matmul, convolution and attention MACs: "93% / 0% / 7%"."""
    return " / ".join(
        f"{100 * kinds.get(kind, 0) / macs:.0f}%" if macs else "-" for kind in ("matmul", "convolution", "attention")
    )


def _summed_kinds(components) -> dict[str, int]:
    summed: dict[str, int] = {}
    for component in components:
        for kind, macs in component.macs_by_kind.items():
            summed[kind] = summed.get(kind, 0) + macs
    return summed


def summary_table(profiles: list[Profile]) -> FittedTable:
    """Many generations (sizes, steps, models): a row each."""
    conditioned = any(p.input_images for p in profiles)
    table = FittedTable(
        "compute per generation",
        [
            Column("model", justify="left"),
            Column("size (WxH px)"),
            *([Column("input images (WxH)", drop=2)] if conditioned else []),
            Column("steps", drop=4),
            Column("CFG", drop=1),
            Column("denoiser MACs / step", drop=5),
            Column("text enc. MACs", drop=2),
            *([Column("image enc. MACs", drop=2)] if conditioned else []),
            Column("VAE dec. MACs", drop=3),
            Column("total MACs"),
            Column("total FLOPs", drop=6),
        ],
    )
    for p in profiles:
        by_role = {role: sum(c.macs for c in p.components if c.role == role) for role in STAGE_OF_ROLE}
        images = sizes_text(p.input_images) or "none"
        table.add_row(
            escape(p.name),
            size(p, unit=""),
            *([images] if conditioned else []),
            f"{p.steps}{_denoiser_steps(p)}",
            "yes" if p.cfg else "no",
            units.macs(p.denoiser_macs_per_step),
            units.macs(by_role[TEXT_ENCODER]),
            *([units.macs(by_role[IMAGE_ENCODER])] if conditioned else []),
            units.macs(by_role[VAE_DECODER]),
            units.macs(p.total_macs),
            units.flops(p.total_flops),
        )
    table.caption = "1 MAC = 1 multiply-add = 2 FLOPs. Denoiser per step includes the CFG batch."
    if any(p.requested_width is not None for p in profiles):
        table.caption += " asked: the size requested; the pipeline binned or rounded it and made the size shown."
    return table


def conditioning_line(edit: Profile, plain: Profile) -> str:
    """What the input images and the ControlNet add, against the same generation from text alone (``plain``)."""
    denoising = sum(c.macs for c in edit.components if c.role == DENOISER)
    plain_denoising = sum(c.macs for c in plain.components if c.role == DENOISER)
    encoding = sum(c.macs for c in edit.components if c.role == IMAGE_ENCODER)
    subjects = ([f"the input image{'s' if len(edit.input_images) > 1 else ''}"] if edit.input_images else []) + (
        ["the ControlNet"] if edit.controlnet else []
    )
    verb = "add" if len(subjects) > 1 or len(edit.input_images) > 1 else "adds"
    steered = sum(c.macs for c in edit.components if c.name == CONTROLNET)
    controlnet = f", the ControlNet {units.macs(steered // edit.steps)} per step" if steered else ""
    encoded = f"{units.macs(encoding)} of image encoding and " if encoding else ""
    text_to = "text-to-video" if edit.num_frames else "text-to-image"
    return (
        f"against {text_to} at the same settings ({units.macs(plain.total_macs)}): this generation "
        f"{units.macs(edit.total_macs)}, {edit.total_macs / plain.total_macs:.2f}x; {' and '.join(subjects)} {verb} "
        f"{encoded}{units.macs(denoising - plain_denoising)} of denoising ({denoising / plain_denoising:.2f}x its "
        f"MACs{controlnet})"
    )


def _per_call(component) -> str:
    """MACs of one call, or the least and most where its calls differ (a prompt and a shorter negative prompt):
    their mean would be no call's figure."""
    distinct = sorted({call.macs_per_call for call in component.invocations})
    if len(distinct) > 1:
        return f"{units.macs(distinct[0])} to {units.macs(distinct[-1])}"
    return units.macs(component.macs_per_call)
