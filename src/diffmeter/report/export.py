"""CSV export: one row per component per profile, and with ``--depth`` one more per module
(``module`` names its path; a component's own row leaves it empty)."""

from __future__ import annotations

import csv
import io

from diffmeter.flops.schema import Profile

COLUMNS = (
    "model",
    "family",
    "height",
    "width",
    "num_frames",
    "input_images",
    "controlnet",
    "steps",
    "denoiser_steps",
    "batch_size",
    "guidance_scale",
    "cfg",
    "dtype",
    "component",
    "module",
    "role",
    "class",
    "params",
    "calls",
    "batch_per_call",
    "macs_per_call",
    "macs",
    "flops",
    "matmul_macs",
    "convolution_macs",
    "attention_macs",
    "share",
    "denoiser_macs_per_step",
    "total_macs",
    "total_flops",
)


def profiles_csv(profiles: list[Profile]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for p in profiles:
        for c in p.components:
            setting = {
                "model": p.model,
                "family": p.family,
                "height": p.height,
                "width": p.width,
                "num_frames": p.num_frames or "",
                # WxH each, as the command line writes them, ";" between several; empty: text-to-image
                "input_images": ";".join(f"{width}x{height}" for height, width in p.input_images),
                "controlnet": p.controlnet or "",
                "steps": p.steps,
                "denoiser_steps": p.denoiser_steps,  # the table's "(21 denoiser steps)": PNDM at 20 steps
                "batch_size": p.batch_size,
                "guidance_scale": p.guidance_scale,
                "cfg": p.cfg,
                "dtype": p.dtype,
                "component": c.name,
            }
            writer.writerow(
                {
                    **setting,
                    "role": c.role,
                    "class": c.class_name,
                    "params": c.params,
                    "calls": c.calls,
                    "batch_per_call": c.batch_per_call,
                    "macs_per_call": c.macs_per_call,
                    "macs": c.macs,
                    "flops": c.flops,
                    "matmul_macs": c.macs_by_kind["matmul"],
                    "convolution_macs": c.macs_by_kind["convolution"],
                    "attention_macs": c.macs_by_kind["attention"],
                    "share": round(c.share, 6),
                    "denoiser_macs_per_step": p.denoiser_macs_per_step,
                    "total_macs": p.total_macs,
                    "total_flops": p.total_flops,
                }
            )
            for path, macs in (c.modules_macs or {}).items():
                module = {"module": path, "macs": macs, "flops": 2 * macs, "share": round(macs / p.total_macs, 6)}
                writer.writerow({**setting, **module})
    return buffer.getvalue()
