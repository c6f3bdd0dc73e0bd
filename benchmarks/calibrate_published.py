"""Fit the expected time range of eager runs per GPU architecture on published, measured runs, and validate it by
leaving one source out at a time (``diffmeter.predict.fit_published``).

Runs: the latency figures of benchmarks/published_figures.yaml that are usable, eager (no compile), on the GPU
alone (no offload: its host transfers are outside the roofline), and predictable (the GPU's figures have the
dtype's peak and a bandwidth). Each run's predicted work is ``predict_memory_and_work`` at the figure's settings
(those the source does not state take its ``predict_with``), its eager bound per operator kind from
``roofline.lower_bounds`` on the figure's GPU and its attention scores (``--gpu-spec`` figures where the table row
covers several cards).

Writes the fitted calibrations into src/diffmeter/predict/data/efficiency.json ("cuda:hopper", ...), and
benchmarks/results/calibration_published.md: every run with its held-out range, and per architecture the
leave-one-source-out coverage, the midpoint's median error and the range's width. Run from the repo root:
    python benchmarks/calibrate_published.py   (a few minutes: fake-tensor runs, cached on disk)
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

from published_comparison import load_figures, settings

from diffmeter.predict.devices import chosen_gpu
from diffmeter.predict.fit_energy import EnergyRun, fit_power, leave_one_model_out
from diffmeter.predict.fit_published import (
    FULL_MODEL_ROWS,
    GROUP_OF_KIND,
    GROUPS,
    HeldOut,
    PublishedRun,
    as_calibration,
    fit,
    leave_one_out,
    summary,
)
from diffmeter.predict.operators import operator_work
from diffmeter.predict.roofline import NEIGHBOURS, TORCH_FP32, flop_rates, lower_bounds, missing_figures
from diffmeter.predict.vae_decode import VAE_MODES
from diffmeter.spec import ProfileSpec

ROOT = Path(__file__).resolve().parent.parent
EFFICIENCY = ROOT / "src" / "diffmeter" / "predict" / "data" / "efficiency.json"
OUT = ROOT / "benchmarks" / "results" / "calibration_published.md"
#: techniques whose time is not the eager operators on the GPU
LEFT_OUT = {"compile": "compiled", "offload-model": "offloaded: host transfers are outside the roofline"}


def source_of(figure: dict) -> str:
    """The harness a figure was measured by: its source's title up to the first parenthesis."""
    return figure["source"]["title"].split(" (")[0]


def energy_run(figure: dict, run: PublishedRun) -> EnergyRun | None:
    """The run's published energy per output with its card's TDP, where the figure stores one."""
    energy, tdp = figure.get("published_energy"), chosen_gpu(figure["gpu"], None).tdp_w
    if not energy or tdp is None:
        return None
    return EnergyRun(run, energy["value"], settings(figure)[0]["batch_size"] or 1, tdp)


def energy_lines(architecture: str, energy: list[EnergyRun], mine: list[PublishedRun], found) -> tuple[list, dict]:
    """The power fit of ``architecture`` on its energy runs, validated a model at a time: (lines, calibration
    fields)."""
    if len({e.run.model for e in energy}) < 2:
        return [], {}
    power = fit_power(energy, [found.midpoint(e.run) for e in energy])
    held = leave_one_model_out(energy, mine)
    stats = summary(held)
    said = (
        f"average board power {power.fraction:.2f} x TDP fitted on {len(energy)} published runs' energy "
        f"({', '.join(sorted({e.run.source for e in energy}))}); held out a model at a time: {stats['coverage']:.0%} "
        f"inside their range, midpoint median error {stats['median_error']:.0%}"
    )
    lines = [
        f"### {architecture}: energy per output, {len(energy)} runs",
        "",
        f"Fit on all: average board power {power.fraction:.3f} x TDP, range factor w {power.width:.3f} (hi/lo "
        f"{power.width**2:.2f}). Leave one model out (its time and power both fitted without it): coverage "
        f"**{stats['coverage']:.0%}** ({sum(h.inside for h in held)} of {len(held)}), midpoint median error "
        f"**{stats['median_error']:.1%}**, median width hi/lo **{stats['median_width']:.2f}**",
        "",
        "| run | published (J per output) | held-out midpoint (J) | range (J) | error | inside |",
        "|---|---|---|---|---|---|",
        *(
            f"| {h.run.run.id} | {h.run.published_j:.4g} | {h.midpoint:.4g} | {h.low:.4g} to {h.high:.4g} | "
            f"{h.error:+.1%} | {'yes' if h.inside else '**no**'} |"
            for h in held
        ),
        "",
    ]
    return lines, {"power_fraction": power.fraction, "energy_width": power.width, "energy_source": said}


def published_run(figure: dict) -> tuple[PublishedRun | None, str]:
    """The run, or None and why it is left out."""
    if not figure.get("usable", True):
        return None, "not usable"
    if figure.get("left_out_of_fit"):
        return None, figure["left_out_of_fit"]
    for technique in figure["techniques"]:
        if technique in LEFT_OUT:
            return None, LEFT_OUT[technique]
    chosen, _ = settings(figure)
    spec_text = figure.get("gpu_spec")
    device = chosen_gpu(None if spec_text else figure["gpu"], spec_text)
    table = chosen_gpu(figure["gpu"], None)  # the architecture of the row the figures are of
    spec = ProfileSpec(model=figure["model"], **{k: v for k, v in chosen.items() if v is not None})
    modes = tuple(t for t in figure["techniques"] if t in VAE_MODES)
    work = operator_work(spec, modes)  # a tiled or sliced decode: its own operators, the rest the plain run's
    fp32 = figure["source"].get("fp32", TORCH_FP32)  # how the run did float32 work: PyTorch's defaults unless said
    if missing_figures(device, work, fp32):
        return None, "the GPU's figures lack a peak of a dtype the run uses, or the bandwidth"
    rates = flop_rates(device, work, fp32)
    bounds = lower_bounds(work, rates, device.bandwidth_bytes_per_s, device.l2_bytes)

    groups = dict.fromkeys(GROUPS, 0.0)
    for kinds in bounds.values():
        for kind, (seconds, _) in kinds.items():
            groups[GROUP_OF_KIND[kind]] += seconds
    run = PublishedRun(
        id=figure["id"],
        source=source_of(figure),
        architecture=table.architecture,
        model=figure["model"],
        published_s=figure["published"]["value"],
        bounds=groups,
        scores=sum(group.scores * group.calls * call.count for call in work.calls for group in call.operators),
        operators=int(sum(count for kinds in bounds.values() for _, count in kinds.values())),
    )
    return run, ""


def borrowed_lines(runs: list[PublishedRun], fits: dict) -> list[str]:
    """How an architecture without a shipped fit fares with the neighbour's it borrows (``roofline.NEIGHBOURS``):
    a test on another GPU generation, none of its runs in the fit."""
    lines = []
    for architecture in sorted({run.architecture for run in runs} - set(fits)):
        lender = NEIGHBOURS.get(architecture)
        while lender and lender not in fits:
            lender = NEIGHBOURS.get(lender)
        if lender is None:
            continue
        held = [
            HeldOut(run, fits[lender].midpoint(run), *fits[lender].range(run))
            for run in runs
            if run.architecture == architecture
        ]
        stats = summary(held)
        lines += [
            f"## {architecture} with {lender}'s fit (borrowed, none of these runs fitted)",
            "",
            f"Coverage **{stats['coverage']:.0%}** ({sum(h.inside for h in held)} of {len(held)}), midpoint median "
            f"error **{stats['median_error']:.1%}**, signed {statistics.median(h.error for h in held):+.1%}",
            "",
            "| run | published (s) | midpoint (s) | range (s) | error | inside |",
            "|---|---|---|---|---|---|",
            *(
                f"| {h.run.id} | {h.run.published_s:.3g} | {h.midpoint:.3g} | {h.low:.3g} to {h.high:.3g} | "
                f"{h.error:+.1%} | {'yes' if h.inside else '**no**'} |"
                for h in held
            ),
            "",
        ]
    return lines


def main() -> int:
    runs, energy, left_out = [], [], []
    for figure in load_figures():
        if figure["kind"] != "latency":
            continue
        run, why = published_run(figure)
        if run is None:
            left_out.append(f"- {figure['id']}: {why}")
        else:
            runs.append(run)
            energy += [found] if (found := energy_run(figure, run)) else []
            print(run, flush=True)
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    shipped = json.loads(EFFICIENCY.read_text())
    lines = [
        "# The expected time and energy of eager runs, fitted on published runs",
        "",
        f"- date: {when}; {len(runs)} published eager runs (benchmarks/published_figures.yaml), fitted per GPU "
        "architecture (`diffmeter.predict.fit_published`); each source held out in turn and predicted by the "
        "fit of the others",
        "- target (issue 27): coverage >= 80% with hi/lo <= 1.5, midpoint median error <= 12%",
        "",
    ]
    shipped_fits: dict = {}
    for architecture in sorted({run.architecture for run in runs}, key=lambda name: (name != "hopper", name)):
        mine = [run for run in runs if run.architecture == architecture]
        found = fit(mine)
        by = "source" if len({run.source for run in mine}) > 1 else "model"
        held = leave_one_out(mine, by)
        sources = sorted({run.source for run in mine})
        stats = summary(held) if held else None
        shipped_here = len(mine) >= FULL_MODEL_ROWS and bool(held)
        if shipped_here:
            shipped_fits[architecture] = found
            calibration = as_calibration(
                found,
                f"fitted on {len(mine)} published eager runs on {architecture} GPUs from {len(sources)} sources "
                f"({', '.join(sources)}); held out a {by} at a time: {stats['coverage']:.0%} of runs inside their "
                f"range, midpoint median error {stats['median_error']:.0%} (benchmarks/calibrate_published.py, {when})",
                mine,
            )
            power_lines, power = energy_lines(architecture, [e for e in energy if e.run in mine], mine, found)
            calibration = calibration.model_copy(update=power)
            shipped[f"cuda:{architecture}"] = calibration.model_dump(mode="json")
        else:
            shipped.pop(f"cuda:{architecture}", None)
        lines += [
            f"## {architecture}: {len(mine)} runs, {len(sources)} sources",
            "",
            "Fit on all: "
            + ", ".join(f"a_{group} {a:.3f} ({1 / a:.3f} of its roofline)" for group, a in found.multipliers.items())
            + f", {found.score_s * 1e12:.3f} ps per attention score, {found.overhead_s * 1e6:.2f} us per operator; "
            f"range factor w {found.width:.3f} (hi/lo {found.width**2:.2f}; in sample "
            f"{sum(found.range(run)[0] <= run.published_s <= found.range(run)[1] for run in mine)} of {len(mine)} "
            "runs inside). "
            + (
                f"Shipped as `cuda:{architecture}`."
                if shipped_here
                else f"Not shipped: under {FULL_MODEL_ROWS} runs; {architecture} GPUs borrow a neighbour's calibration "
                "(`roofline.NEIGHBOURS`)."
            ),
            "",
        ]
        if held:
            lines += [
                f"Leave one {by} out: coverage **{stats['coverage']:.0%}** ({sum(h.inside for h in held)} of "
                f"{len(held)}), midpoint median error **{stats['median_error']:.1%}**, median width hi/lo "
                f"**{stats['median_width']:.2f}**",
                "",
                "| run | source | published (s) | held-out midpoint (s) | range (s) | error | inside |",
                "|---|---|---|---|---|---|---|",
                *(
                    f"| {h.run.id} | {h.run.source} | {h.run.published_s:.3g} | {h.midpoint:.3g} | "
                    f"{h.low:.3g} to {h.high:.3g} | {h.error:+.1%} | {'yes' if h.inside else '**no**'} |"
                    for h in held
                ),
                "",
            ]
        else:
            lines += ["One source only: nothing to hold out.", ""]
        lines += power_lines if shipped_here else []
    lines += borrowed_lines(runs, shipped_fits)
    lines += ["## Left out", "", *left_out, ""]
    EFFICIENCY.write_text(json.dumps(shipped, indent=2) + "\n")
    OUT.write_text("\n".join(lines))
    print(f"written to {OUT} and {EFFICIENCY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
