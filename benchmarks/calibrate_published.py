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
import sys
from datetime import datetime, timezone
from pathlib import Path

from power_exponents import power_section
from published_comparison import load_figures
from published_runs import energy_run, published_run
from published_tables import card_claims, left_out_lines, per_source, table

from diffmeter.predict.attention_kernels import CUDNN_OVER_FLASH
from diffmeter.predict.calibration import neighbours_of
from diffmeter.predict.fit_energy import EnergyRun, fit_power, leave_one_model_out
from diffmeter.predict.fit_holdout import (
    HeldOut,
    borrowed_test,
    borrowed_width,
    chosen_fit,
    leave_one_out,
    nested_leave_one_out,
    summary,
    widened_test,
)
from diffmeter.predict.fit_published import (
    REFERENCE_ERA,
    PublishedRun,
    as_calibration,
    fit,
    full_model,
    lender_of,
)
from diffmeter.predict.power_limit import EXPONENTS, exponent_text

ROOT = Path(__file__).resolve().parent.parent
EFFICIENCY = ROOT / "src" / "diffmeter" / "predict" / "data" / "efficiency.json"
OUT = ROOT / "benchmarks" / "results" / "calibration_published.md"
#: the least runs of an architecture, from two sources or more, whose own fit ships
LEAST_SHIPPED_RUNS = 8


def energy_lines(architecture: str, energy: list[EnergyRun], timed: list[PublishedRun], found) -> tuple[list, dict]:
    """The power fit of ``architecture`` on its energy runs, validated a model at a time (the time refitted
    without the model too): (lines, calibration fields)."""
    if len({e.run.model for e in energy}) < 2:
        return [], {}
    power = fit_power(energy, [found.midpoint(e.run) for e in energy], [found.busy_share(e.run) for e in energy])
    held = leave_one_model_out(energy, timed)
    stats = summary(held)
    idle = f", {power.idle:.2f} x TDP while it waits for the host" if power.idle is not None else ""
    if power.idle is not None and power.idle < 0.005:  # at the least-squares bound: a waiting card draws some
        idle += (
            " (the fit's bound: these runs' energy is explained by their busy time alone; a waiting card draws "
            "some, so a host-bound run's may be predicted low)"
        )
    said = (
        f"average board power {power.fraction:.2f} x TDP while the GPU is busy{idle}, fitted on {len(energy)} "
        f"published runs' energy ({', '.join(sorted({e.run.source for e in energy}))}); held out a model at a time: "
        f"{stats['coverage']:.0%} inside their range, midpoint median error {stats['median_error']:.0%}"
    )
    lines = [
        f"### {architecture}: energy per output, {len(energy)} runs",
        "",
        f"Fit on all: board power {power.fraction:.3f} x TDP busy{idle}, range factor w "
        f"{power.width:.3f} (hi/lo {power.width**2:.2f}). Leave one model out (its time and power both fitted without "
        f"it): coverage **{stats['coverage']:.0%}** ({sum(h.inside for h in held)} of {len(held)}), midpoint median "
        f"error **{stats['median_error']:.1%}**, median width hi/lo **{stats['median_width']:.2f}**",
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
    fields = {"power_fraction": power.fraction, "idle_power_fraction": power.idle, "energy_width": power.width}
    return lines, {**fields, "energy_source": said}


def stack_section(runs: list[PublishedRun], held: list[HeldOut]) -> list[str]:
    """The software stack's effect: each torch era's factor on the GPU's time, fitted where two sources state it,
    and the held-out test with those factors beside the shipped fit's (which has none)."""
    eras = fit(runs, eras=True).eras
    with_eras = leave_one_out(runs, eras=True)
    counts = {era or "not stated": sum(run.era == era for run in runs) for era in sorted({run.era for run in runs})}
    factors = ", ".join(f"{era} x{factor:.3f}" for era, factor in eras.items()) or "none"
    lines = [
        "## The software stack",
        "",
        f"Runs per torch era (the version their sources state): {', '.join(f'{e} {n}' for e, n in counts.items())}. "
        f"Each era two sources state fitted a factor on the GPU's time, relative to {REFERENCE_ERA}: {factors}.",
        "",
        "The attention kernel is part of the stack, not fitted: a run whose source states torch 2.11 or later on a "
        "Hopper card ran SDPA's default there, cuDNN's attention, timed at its published "
        f"{CUDNN_OVER_FLASH:.2f}x the flash kernel's speed at head dimension 128 "
        "(`diffmeter.predict.attention_kernels`); every other run, and every other head dimension, on the flash "
        "kernel the fit's attention is for.",
        "",
        "| held out | coverage without eras | with | midpoint median error without | with |",
        "|---|---|---|---|---|",
    ]
    for name in ["all", *sorted({run.architecture for run in runs})]:
        mine = [h for h in held if name in ("all", h.run.architecture)]
        theirs = [h for h in with_eras if name in ("all", h.run.architecture)]
        if mine and theirs:
            a, b = summary(mine), summary(theirs)
            lines.append(
                f"| {name} | {a['coverage']:.0%} | {b['coverage']:.0%} | {a['median_error']:.1%} | "
                f"{b['median_error']:.1%} |"
            )
    a, b = summary(held), summary(with_eras)
    lines += [
        "",
        f"Held out, the era factors take all runs' coverage from {a['coverage']:.0%} to {b['coverage']:.0%} and "
        f"the midpoint median error from {a['median_error']:.1%} to {b['median_error']:.1%}. The shipped fit has "
        "none (its ranges are for the stacks of its runs, whose torch versions each calibration states).",
        "",
    ]
    return lines


def stack_range(mine: list[PublishedRun], stacks: dict[str, dict]) -> str:
    """The torch versions the runs were measured with, where their sources say: the stacks a range is for."""
    versions = sorted(
        {str(stacks[run.id]["torch"]) for run in mine if stacks[run.id].get("torch")},
        key=lambda text: tuple(int(part) for part in text.split("+")[0].split(".")[:2] if part.isdigit()),
    )
    stated = sum(bool(stacks[run.id].get("torch")) for run in mine)
    if not versions:
        return "; no run states its torch version"
    span = versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"
    return f"; measured on torch {span} ({stated} of {len(mine)} runs state it)"


def shipped_fit(mine: list[PublishedRun], held: list[HeldOut]) -> bool:
    """Whether an architecture's own fit ships: a multiplier per kind group, or at least ``LEAST_SHIPPED_RUNS`` runs
    from two sources or more; and some of its runs were held out (else it borrows a neighbour's, widened)."""
    enough = full_model(mine) or (len(mine) >= LEAST_SHIPPED_RUNS and len({run.source for run in mine}) > 1)
    return enough and any(h.run in mine for h in held)


def closer_than_borrowed(runs: list[PublishedRun], held: list[HeldOut], shipped: set[str]) -> set[str]:
    """The architectures short of ``shipped_fit``'s runs whose own fit, held out a source at a time (two sources or
    more), is closer on their runs than the neighbour's widened range they would borrow (``widened_test``, midpoint
    median error): T4's 7 runs from 3 sources are 15% off under turing's own fit held out, 50% under Ampere's
    (the 70 W card reaches half of its datasheet's roofline)."""
    widened = widened_test(runs, shipped)
    closer = set()
    for architecture in sorted({run.architecture for run in runs} - shipped):
        own = [h for h in held if h.run.architecture == architecture]
        lent = [h for h in widened if h.run.architecture == architecture]
        if len({h.run.source for h in own}) > 1 and lent:
            if summary(own)["median_error"] < summary(lent)["median_error"]:
                closer.add(architecture)
    return closer


def shape(architecture: str, runs: list[PublishedRun]) -> str:
    """How ``architecture``'s GPU fit is made where its runs are too few for a multiplier per kind group."""
    mine = [run for run in runs if run.architecture == architecture]
    if full_model(mine):
        return ""
    full = {a for a in {run.architecture for run in runs} if full_model([r for r in runs if r.architecture == a])}
    lender = lender_of(architecture, full)
    return f" (one factor on {lender}'s fit: too few runs for each kind's own)" if lender else " (one multiplier)"


def lend_power(shipped: dict) -> None:
    """An architecture whose runs published no energy takes the board power of the nearest that did
    (``calibration.NEIGHBOURS``), said in its energy source."""
    for name, calibration in shipped.items():
        if not name.startswith("cuda:") or calibration.get("power_fraction") is not None:
            continue
        lenders = neighbours_of(name.removeprefix("cuda:"))
        powered = (a for a in lenders if shipped.get(f"cuda:{a}", {}).get("power_fraction") is not None)
        if lender := next(powered, None):
            found = shipped[f"cuda:{lender}"]
            fields = ("power_fraction", "idle_power_fraction", "energy_width")
            calibration.update({field: found[field] for field in fields})
            # a lender that borrowed itself passes on its own lender's fit: name that one, not a chain
            base, _, chain = found["energy_source"].partition("; borrowed from ")
            origin = chain.split(" ")[0] if chain else lender
            also = f", as {lender} borrows it (no {name} nor cuda:{lender} run" if chain else f" (no {name} run"
            calibration["energy_source"] = f"{base}; borrowed from {origin}{also} published energy)"


def main() -> int:
    by_exponent, left_out, stacks, gpus, kept = {exponent: [] for exponent in EXPONENTS}, [], {}, {}, []
    for figure in load_figures():
        if figure["kind"] != "latency":
            continue
        built = {exponent: published_run(figure, exponent) for exponent in EXPONENTS}
        run, why = built[EXPONENTS[0]]
        if run is None:
            left_out.append((figure["id"], why))
        else:
            for exponent, (same, _) in built.items():
                by_exponent[exponent].append(same)
            kept.append(figure)
            stacks[run.id] = figure.get("stack") or {}
            gpus[run.id] = figure["gpu"]
            print(run.id, run.architecture, run.published_s, flush=True)
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    exponent, found = chosen_fit(by_exponent)
    runs = by_exponent[exponent]
    energy = [e for figure, run in zip(kept, runs, strict=True) if (e := energy_run(figure, run))]
    test = nested_leave_one_out(by_exponent)  # the exponent chosen again inside each fold: the claims' test
    held = test.nested
    stats = summary(held)
    by_card = card_claims(held, gpus)
    print(f"held out, all: {stats}", flush=True)
    architectures = sorted({run.architecture for run in runs}, key=lambda name: (name != "hopper", name))
    shipped_names = {a for a in architectures if shipped_fit([r for r in runs if r.architecture == a], held)}
    closer = closer_than_borrowed(runs, held, shipped_names)
    shipped_names |= closer
    borrowed = borrowed_test(runs, shipped_names)
    widened = widened_test(runs, shipped_names)
    wide = summary(widened) if widened else None
    borrowed_claim = (
        f"held out an architecture at a time, as a card that borrows sees it (its runs under its neighbour's "
        f"calibration fitted without them, widened by a factor measured without them, at the power limit's exponent "
        f"chosen on all runs): "
        f"{sum(h.inside for h in widened)} of {len(widened)} runs ({wide['coverage']:.0%}) inside their range, "
        f"midpoint median error {wide['median_error']:.1%}, median hi/lo "
        f"{wide['median_width']:.2f} (benchmarks/calibrate_published.py, {when})"
        if wide
        else None
    )
    borrowed_by = {}
    for name in sorted({h.run.architecture for h in widened}):
        mine = [h for h in widened if h.run.architecture == name]
        stats_mine = summary(mine)
        borrowed_by[name] = (
            f"{name}'s own {len(mine)} runs in that test: {sum(h.inside for h in mine)} inside "
            f"({stats_mine['coverage']:.0%}), midpoint median error {stats_mine['median_error']:.1%}"
        )
    shipped = json.loads(EFFICIENCY.read_text())
    host = found.host
    lines = [
        "# The expected time and energy of eager runs, fitted on published runs",
        "",
        f"- date: {when}; {len(runs)} published eager runs (benchmarks/published_figures.yaml) on "
        f"{len(architectures)} GPU architectures from {len({r.source for r in runs})} sources, fitted together "
        "(`diffmeter.predict.fit_published`): per stage the longer of the GPU's time (per architecture) and the "
        "host's issue time (one host term for all)",
        "- validation: each source held out in turn (every architecture refitted without it) and predicted by the "
        "fit of the others; an architecture one source measured alone, a model at a time; the power limit's "
        "exponent (`diffmeter.predict.power_limit`) chosen again in each fold by the other runs' fit, as the shipped "
        f"one ({exponent_text(exponent)}) is chosen by all runs' (`## The power limit`); the "
        "borrowed tests below and the software stack's use the shipped exponent",
        "- target (issue 50): per architecture and for all, coverage >= 80% with hi/lo <= 1.5, midpoint median "
        "error <= 12%",
        "",
        f"Host, fitted on all: {host.op_s * 1e6:.2f} us per dispatched operator, {host.module_s * 1e6:.2f} us per "
        f"module call, {host.step_s * 1e3:.3f} ms per denoiser call, {host.call_s * 1e3:.1f} ms per pipeline call.",
        "",
        *table(held, "## All architectures, held out by source"),
        "Per source:",
        "",
        *per_source(held),
    ]
    for architecture in architectures:
        mine = [run for run in runs if run.architecture == architecture]
        gpu = found.gpus[architecture]
        sources = sorted({run.source for run in mine})
        own = [h for h in held if h.run.architecture == architecture]
        by = "source" if len(sources) > 1 else "model"
        lines += [
            f"## {architecture}: {len(mine)} runs, {len(sources)} sources",
            "",
            "Fit on all: "
            + ", ".join(f"a_{group} {a:.3f} ({1 / a:.3f} of its roofline)" for group, a in gpu.multipliers.items())
            + f", {gpu.score_s * 1e12:.3f} ps per attention score, {gpu.gap_s * 1e6:.2f} us per kernel; range factor "
            f"w {gpu.width:.3f} (hi/lo {gpu.width**2:.2f}; in sample "
            f"{sum(found.range(run)[0] <= run.published_s <= found.range(run)[1] for run in mine)} of {len(mine)} "
            "runs inside). "
            + (
                f"Shipped as `cuda:{architecture}`"
                + (
                    f" (under {LEAST_SHIPPED_RUNS} runs, but closer held out than the neighbour's range it would "
                    "borrow: `closer_than_borrowed`)."
                    if architecture in closer
                    else "."
                )
                if architecture in shipped_names
                else f"Not shipped (under {LEAST_SHIPPED_RUNS} runs from two sources, or nothing held out, and not "
                "closer held out than the range it borrows): "
                f"{architecture} GPUs borrow a "
                "neighbour's calibration (`calibration.NEIGHBOURS`)."
            ),
            "",
            *(table(own, f"Leave one {by} out") if own else ["Nothing held out.", ""]),
        ]
        if architecture in shipped_names:
            stats_own = summary(own)
            claim = (
                f"held out a {by} at a time (the power limit's exponent chosen again without it): "
                f"{stats_own['coverage']:.0%} of runs inside their range, midpoint median error "
                f"{stats_own['median_error']:.0%} (benchmarks/calibrate_published.py, {when})"
            )
            calibration = as_calibration(
                found,
                architecture,
                f"fitted on {len(mine)} published eager runs on {architecture} GPUs from {len(sources)} sources "
                f"({', '.join(sources)}){shape(architecture, runs)}{stack_range(mine, stacks)}, each peak at its "
                f"card's share of its die's power per TFLOP to the power {exponent_text(exponent)} "
                f"(`power_limit`, chosen by the fit), with "
                f"{len(runs) - len(mine)} runs of other architectures for the host; {claim}",
                runs,
            )
            power_lines, power = energy_lines(architecture, [e for e in energy if e.run in mine], runs, found)
            widen = borrowed_width(borrowed, gpu.width) if borrowed else None
            calibration = calibration.model_copy(
                update={
                    **power,
                    "held_out": claim,
                    "held_out_by_card": by_card.get(architecture),
                    "borrowed_width": widen,
                    "borrowed_held_out": borrowed_claim,
                    "borrowed_held_out_by": borrowed_by or None,
                    "power_exponent": exponent,
                }
            )
            shipped[f"cuda:{architecture}"] = calibration.model_dump(mode="json")
            lines += power_lines
        else:
            shipped.pop(f"cuda:{architecture}", None)
    lend_power(shipped)
    if borrowed:
        lines += table(borrowed, "## Each architecture predicted by its neighbour's fit, fitted without it")
    if widened:
        lines += [
            *table(
                widened, "## Each architecture predicted by its neighbour's calibration, widened, fitted without it"
            ),
            "The range a card that borrows is given: the fit above's, widened by `calibration.borrowed` (the factor "
            "puts 80% of the runs above inside, in sample). Here that factor is measured without the architecture "
            "too (its neighbour's fit and the widening both fitted without its runs): the figure a borrowed "
            "calibration claims. Per architecture held out:",
            "",
            "| architecture | runs | inside | midpoint median error | median hi/lo |",
            "|---|---|---|---|---|",
            *(
                f"| {name} | {len(mine)} | {stats['coverage']:.0%} | {stats['median_error']:.1%} | "
                f"{stats['median_width']:.2f} |"
                for name in sorted({h.run.architecture for h in widened})
                for mine in [[h for h in widened if h.run.architecture == name]]
                for stats in [summary(mine)]
            ),
            "",
        ]
    lines += stack_section(runs, test.fixed[exponent])
    lines += power_section(kept, test, exponent)
    lines += ["## Left out", "", *left_out_lines(left_out), ""]
    EFFICIENCY.write_text(json.dumps(shipped, indent=2) + "\n")
    OUT.write_text("\n".join(lines))
    print(f"written to {OUT} and {EFFICIENCY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
