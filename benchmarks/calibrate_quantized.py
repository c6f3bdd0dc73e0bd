"""The expected time of quantized runs (``--quantize BACKEND:TYPE``), validated on published ones a source at a time:
each backend's effect on the operator work (``diffmeter.predict.quantized_time``: the quantized linear layers'
matmuls replaced by what the backend's eager forward runs), timed by the eager calibration
(``diffmeter.predict.fit_published``) refitted without the held-out source, its own unquantized runs included, so
nothing of the source reaches its prediction. No factor is fitted on the quantized runs.

Runs: the latency figures of benchmarks/published_quantized.yaml that are usable, eager (no torch.compile), of a
modelled backend and type, and predictable on their GPU's figures; beside them, the unquantized runs of the same
sources (benchmarks/published_figures.yaml) held out the same way. Writes benchmarks/results/calibration_quantized.md:
every run with its held-out range, and per backend and for all the coverage, the midpoint's median error and the
range's width hi/lo (target, as issue 46's: >= 80%, <= 15%, <= 1.6). Run from the repo root (a few minutes: the
eager fit per held-out source; the fake-tensor runs are cached on disk):
    python benchmarks/calibrate_quantized.py
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml
from calibrate_techniques import TARGET, gpu_for, section
from published_comparison import load_figures, settings
from published_runs import published_run, run_of, source_of
from published_tables import left_out_lines

from diffmeter.predict.fit_holdout import HeldOut, summary
from diffmeter.predict.fit_published import PublishedRun, fit
from diffmeter.predict.quantized_memory import Format
from diffmeter.predict.quantized_modelled import HELD_OUT, why_not_modelled
from diffmeter.predict.quantized_work import quantized_work
from diffmeter.spec import ProfileSpec

ROOT = Path(__file__).resolve().parent.parent
QUANTIZED = ROOT / "benchmarks" / "published_quantized.yaml"
OUT = ROOT / "benchmarks" / "results" / "calibration_quantized.md"
#: the yaml's backend names -> ``--quantize``'s
BACKENDS = {"bitsandbytes": "bnb", "torchao": "torchao", "quanto": "quanto", "gguf": "gguf"}
#: the yaml's quant types (their first word) -> ``--quantize``'s, per backend
TYPES = {
    "bnb": {"nf4": "nf4", "int8": "int8"},
    "torchao": {
        "int8_weight_only": "int8wo",
        "int8wo": "int8wo",
        "float8_weight_only": "float8wo",
        "fp8wo": "float8wo",
        "fp8dq": "float8dq-tensor",
        "fp8dqrow": "float8dq-row",
        "int4_weight_only": "int4wo",
        "int4wo": "int4wo",
    },
    "quanto": {
        "int8": "int8",
        "qint8": "int8",
        "float8": "float8",
        "qfloat8": "float8",
        "int4": "int4",
        "qint4": "int4",
    },
}


def named_format(figure: dict, types: dict = TYPES, after_loading: bool = False) -> tuple[Format | None, str]:
    """The figure's ``--quantize`` format on its quantized components (the yaml's names read through ``types``), or
    None and why it names none."""
    backend = BACKENDS.get(figure["backend"])
    if backend is None:
        return None, f"backend {figure['backend']}: not a --quantize backend"
    word = str(figure["quant_type"]).split(" ")[0]
    kind = word if backend == "gguf" else types[backend].get(word)
    if kind is None:
        return None, f"{backend} {figure['quant_type']}: not a --quantize type"
    return Format(backend, kind, tuple(figure["quantized_components"]), after_loading=after_loading), ""


def format_of(figure: dict) -> tuple[Format | None, str]:
    """The figure's ``--quantize`` format, or None and why it is left out: none named, or its time not modelled."""
    found, why = named_format(figure)
    if found is not None and (untimed := why_not_modelled(found.backend, found.type)):
        return None, f"{found.backend}:{found.type}: its time is not modelled ({untimed})"
    return found, why


def as_published(figure: dict) -> dict:
    """A quantized figure in published_figures.yaml's form (its source a title, its techniques a list)."""
    compiled = (figure.get("techniques_as_published") or {}).get("torch_compile")
    return {
        **figure,
        "source": {"title": figure["source"], "url": figure["url"]},
        "techniques": ["compile"] * bool(compiled),
        "stack": {},
    }


def quantized_run(figure: dict) -> tuple[tuple[str, PublishedRun] | None, str]:
    """(technique, run) of a quantized latency figure, or None and why it is left out."""
    if not figure.get("usable", True):
        return None, "not usable: " + figure.get("note", "")
    found, why = format_of(figure)
    if found is None:
        return None, why
    figure = as_published(figure)
    if figure["techniques"]:
        return None, "compiled: the compiled quantized kernels are not modelled"
    spec = ProfileSpec(model=figure["model"], **{k: v for k, v in settings(figure)[0].items() if v is not None})
    run, why = run_of(figure, lambda work: quantized_work(work, spec, [found]))
    return (None, why) if run is None else ((f"{found.backend}:{found.type}", run), "")


def held_out(eager: list[PublishedRun], runs: list[tuple[str, PublishedRun]], fitter=fit):
    """Each run predicted by the eager fit (``fitter``) of every source but its own."""
    found = []
    for source in sorted({run.source for _, run in runs}):
        fitted = fitter([run for run in eager if run.source != source])
        for technique, run in runs:
            if run.source != source or (gpu := gpu_for(fitted, run.architecture)) is None:
                continue
            found.append((technique, HeldOut(run, fitted.midpoint(run, gpu), *fitted.range(run, gpu))))
    return found


def same_run(figure: dict) -> tuple:
    """What makes a quantized run and an unquantized one of the same source comparable (on a GPU of the same
    architecture): the harness, the model, the dtype and the settings predicted with."""
    chosen = settings(figure)[0]
    return source_of(figure), figure["model"], *(chosen[key] for key in ("dtype", "height", "steps", "batch_size"))


def slowdown_section(held, keys: dict[str, tuple]) -> list[str]:
    """Each quantized run's time over its source's unquantized run at the same settings, published and predicted
    (held-out midpoints): the backend's effect apart from how well the eager fit times that source."""

    def key(h: HeldOut) -> tuple:
        return *keys[h.run.id], h.run.architecture

    base = {key(h): h for name, h in held if name.startswith("unquantized")}
    rows = [(name, h, base[key(h)]) for name, h in held if not name.startswith("unquantized") and key(h) in base]
    if not rows:
        return []
    errors = [(h.midpoint / b.midpoint) / (h.run.published_s / b.run.published_s) - 1 for _, h, b in rows]
    return [
        "## Slowdown against the same source's unquantized run",
        "",
        f"{len(rows)} quantized runs whose source published the unquantized run at the same settings: the predicted "
        "slowdown (held-out midpoints' ratio) against the published one; median error of the ratio "
        f"**{statistics.median(abs(e) for e in errors):.1%}**.",
        "",
        "| run | backend | unquantized run | published slowdown | predicted | error |",
        "|---|---|---|---|---|---|",
        *(
            f"| {h.run.id} | {name} | {b.run.id} | {h.run.published_s / b.run.published_s:.2f}x | "
            f"{h.midpoint / b.midpoint:.2f}x | {e:+.1%} |"
            for (name, h, b), e in zip(rows, errors, strict=True)
        ),
        "",
    ]


def figures(held: list[HeldOut]) -> dict:
    """What ``profile --gpu`` quotes of held-out runs: how many, inside, the midpoint's median error, the misses
    predicted too fast (published slower than the range's top)."""
    return {
        "runs": len(held),
        "inside": int(sum(h.inside for h in held)),
        "median_error": float(summary(held)["median_error"]),
        "too_fast": int(sum(h.run.published_s > h.high for h in held)),
    }


def write_claims(held: list[tuple[str, HeldOut]], when: str) -> None:
    """Each format's held-out figures and all quantized runs' into the shipped data (``quantized_modelled``)."""
    quantized = [(name, h) for name, h in held if not name.startswith("unquantized")]
    found = {
        "written_by": f"benchmarks/calibrate_quantized.py, {when}",
        "all": figures([h for _, h in quantized]),
        "formats": {
            name: figures([h for n, h in quantized if n == name]) for name in sorted({n for n, _ in quantized})
        },
    }
    HELD_OUT.write_text(json.dumps(found, indent=1) + "\n")


def main() -> int:
    figures = [f for f in yaml.safe_load(QUANTIZED.read_text())["figures"] if f["kind"] == "latency"]
    quantized, left_out, keys = [], [], {}
    for figure in figures:
        chosen, why = quantized_run(figure)
        if chosen is None:
            left_out.append((figure["id"], why))
            continue
        quantized.append(chosen)
        keys[figure["id"]] = same_run(as_published(figure))
        print(figure["id"], chosen[0], chosen[1].architecture, chosen[1].published_s, flush=True)
    eager = []
    for figure in load_figures():
        if figure["kind"] == "latency" and (run := published_run(figure)[0]) is not None:
            eager.append(run)
            keys[run.id] = same_run(figure)
    sources = {run.source for _, run in quantized}
    baselines = [("unquantized (same sources)", run) for run in eager if run.source in sources]
    held = held_out(eager, quantized + baselines)
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    lines = [
        "# The expected time of quantized runs, validated on published runs",
        "",
        f"- date: {when}; {len(quantized)} published quantized runs (benchmarks/published_quantized.yaml), each "
        "backend's effect on the operator work (`predict.quantized_time`) timed by the eager calibration "
        f"(`predict.fit_published`, {len(eager)} eager runs) refitted without the held-out source's runs, its "
        "unquantized ones included, at the power limit's exponent the shipped calibration was fitted with (chosen on "
        "all eager runs, these sources' included); no factor fitted on the quantized runs",
        f"- sources: {', '.join(sorted(sources))}; their unquantized runs are predicted the same way, for reference",
        f"- target (issue 46): coverage >= {TARGET['coverage']:.0%}, midpoint median error <= "
        f"{TARGET['median_error']:.0%}, hi/lo <= {TARGET['median_width']}",
        "",
    ]
    for technique in sorted({name for name, _ in held}):
        lines += section(technique, [h for name, h in held if name == technique])
    lines += section("all quantized runs", [h for name, h in held if not name.startswith("unquantized")])
    lines += slowdown_section(held, keys)
    lines += ["## Left out", "", *left_out_lines(left_out), ""]
    OUT.write_text("\n".join(lines))
    write_claims(held, when)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
