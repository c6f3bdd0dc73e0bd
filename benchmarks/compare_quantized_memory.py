"""diffmeter's memory prediction of quantized runs beside the published figures (issue 47: "published quantized
figures, memory after loading and peak, in the sources' units, within 5%").

Each memory figure of benchmarks/published_quantized.yaml is predicted from its setting: its model at its dtype,
size, steps, batch and frames (a setting the source does not state takes the figure's ``predict_with``, marked
assumed), its backend and type on each component it names (``predict.quantized_memory.with_formats``, as
``profile --gpu --quantize NAME=BACKEND:TYPE`` does), and compared as the figure says: the parameters resident after
loading (``predict.techniques.stored_params``) or the whole generation's peak (``peak_under``). A figure whose setting
the prediction cannot reproduce (a backend or type diffmeter does not predict, torch.compile's or fused projections'
memory, a figure its own note marks unusable) is listed as excluded with the reason, never dropped.

Units: a figure in "GiB" is compared in GiB. "GB (not stated)" is read as GiB (2**30 bytes), because every such
source divides by 1024**3: the quantization blog's example prints ``torch.cuda.max_memory_reserved() / 1024**3``
and its BF16 row (31.447) is the torchao README's 31.438 GiB of ``memory_allocated()`` within 0.03%; the quanto
blog's unquantized rows equal the predicted parameters in GiB within 0.8% (docs/prediction-vs-published.md). The
reading as decimal GB is shown beside it. The prediction counts allocated bytes; a peak a source reads with
``max_memory_reserved`` also holds the caching allocator's cached blocks, simulated on the generation's traced
allocations (``reserved_memory``). The blocks loading leaves cached are simulated where loading is replayed: a
pipeline quanto quantized at load, whose ``pipe.to('cuda')`` rebuilds its weights on the GPU (``quanto_loading``),
its generation continuing on the same allocator; other backends' reserved figures after loading are compared with the
allocated bytes.

Where a source ran older libraries or its code set something other than it names, fixed by its own words or its date,
what they did differently is read from their code at that version and added (``source_stacks``, ``old_decode``), its
effect shown apart ('installed').

Writes benchmarks/results/quantized_memory_published.md. Run from the repo root (fake-tensor runs, cached on disk;
minutes cold):
    python benchmarks/compare_quantized_memory.py
"""

from __future__ import annotations

import importlib.metadata
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import quanto_loading
import replay_cogvideox_decode
import reserved_memory
import yaml
from calibrate_quantized import TYPES as LATENCY_TYPES
from calibrate_quantized import named_format
from published_comparison import GB, GIB, UNITS, settings
from rich.console import Console
from rich.table import Table
from source_stacks import SEPTEMBER_2024, source_kinds, stack_difference

from diffmeter.predict.memory import predict_memory
from diffmeter.predict.quantized_memory import Format, with_formats
from diffmeter.predict.schema import VAE_DECODE, MemoryPrediction
from diffmeter.predict.techniques import peak_under, stored_params
from diffmeter.spec import ProfileSpec

ROOT = Path(__file__).resolve().parent.parent
QUANTIZED = ROOT / "benchmarks" / "published_quantized.yaml"
OUT = ROOT / "benchmarks" / "results" / "quantized_memory_published.md"
#: issue 47's bound on a memory figure
WITHIN = 0.05
#: the yaml's names -> ``--quantize``'s, as the latency check reads them, and the types only memory figures use
TYPES = {**LATENCY_TYPES, "bnb": {**LATENCY_TYPES["bnb"], "fp4": "fp4"}}
#: how ``settings_from`` names a quantization applied to loaded modules
AFTER_LOADING = ("quantize_ on", "quanto quantize(")
#: why a source's figures miss where they do, read from the sources and the libraries (the result's last section)
MISSES = {
    "Exploring Quantization Backends": (
        "After loading: the post (2025-05-21) ran transformers 4.x, whose bitsandbytes quantizers kept T5's `wo` "
        "whole in float32 and whose torchao quantizer left it whole (``legacy_t5``, cited there). Peaks: both "
        "columns are `torch.cuda.max_memory_reserved()` (the post's example prints it after `pipe.to('cuda')` and "
        "after the call); peak minus loaded is 3.9-5.2 GiB in every row where the allocated peak grows 2.38: the "
        "caching allocator's cached blocks, simulated on the generation's allocations (2.21 GiB; diffmeter's H200 "
        "run of FLUX.1-dev at 1024 px held 2.22 GiB reserved beyond allocated: results/reserved_memory_h200.md). "
        "Quanto at load (int4, int8): `pipe.to('cuda')` moves weights diffusers and transformers quantized on the CPU "
        "and 0.2.7 rebuilds each int4 one for tinygemm on the GPU (unpacked to a byte per weight, then int32 "
        "temporaries of 4 and 2 bytes per weight: tensor/weights/tinygemm/packed.py:54-59); replayed through the "
        "caching allocator (benchmarks/quanto_loading.py), the blocks loading leaves cached are 0.39 GiB (int4) and "
        "0.35 GiB (int8), and the generation continues on them. Quanto int4's main cause is the post's code: its INT8 "
        "example passes `weights_dtype` to `TransformersQuantoConfig`, which reads `weights` (default int8) and drops "
        "the rest, so written alike for INT4 (that code is not shown) T5 ran in int8, 1.58 GiB over int4 "
        "(``source_kinds``). Int4 after "
        "loading: -16.8% before, -13.4% with the replay alone, -3.9% with T5 int8 alone, -0.7% with both; its peak "
        "-8.4% before, +0.3% now. The float8 rows (quanto 0.2.4 applied after loading) are not replayed."
    ),
    "diffusers-torchao README": (
        "Run on 'the PyTorch nightly, updated diffusers and torchao codebases' (its Environment section), the "
        "CogVideoX table added 2024-09-04: diffusers then decoded with each causal convolution's frame cache held on "
        "the module (until diffusers bd4df2856a, 2024-09-28); replayed on fake tensors (benchmarks/"
        "replay_cogvideox_decode.py) the decode takes 11.94 GiB where 0.42.1's takes 14.74, and the table's peaks grow "
        "11.98 GiB over the parameters in every row: with it the four peaks are within 1%. torchao of then padded int4 "
        "weights (``tiled_int4``): CogVideoX-5B int4wo after loading -8.6% on the installed torchao, -2.3% with it."
    ),
    "Memory-efficient Diffusion Transformers with Quanto": (
        "quantize() + freeze() after loading: every nn.Linear and nn.Conv2d, T5's float32 `wo` (float16 runs) too. "
        "The SD3 row with all three text encoders quantized is excluded: the table's own rows show quantizing "
        "text_encoder_2 changed nothing (its note in the yaml)."
    ),
}
#: CogVideoX's VAE decode activations at replay_cogvideox_decode.SETTING on diffusers 2ee3215949 (main of 2024-09-04),
#: bytes, replayed by benchmarks/replay_cogvideox_decode.py (the installed 0.42.1's, replayed alike: 15821568000, the
#: prediction's own figure)
DECODE_2024_09 = {"cogvideox-5b": 12816005632, "cogvideox-2b": 12816005632}
#: the packages whose versions the result names
VERSIONS = ("diffmeter", "torch", "diffusers", "transformers", "torchao", "optimum-quanto", "bitsandbytes", "gguf")
#: what a figure's counter holds beyond the prediction's allocated bytes
RESERVED = "max_memory_reserved"
#: the simulated cached blocks of each setting (``reserved_slack``), once per run of the script
SLACKS: dict[str, int] = {}


@dataclass(frozen=True)
class Compared:
    """One published figure and its prediction, in the figure's unit."""

    figure: dict
    quantize: str
    #: on the source's stack (the installed one's figure plus ``stack_bytes``)
    predicted_bytes: int
    assumed: tuple[str, ...]
    #: what the source's older libraries did differently, in bytes (0: none known), and what it was
    stack_bytes: int = 0
    stack: str = ""
    #: of ``predicted_bytes``, the caching allocator's cached blocks a reserved peak holds (``reserved_memory``)
    cached_bytes: int = 0
    #: whether loading's allocations were replayed too (``quanto_loading``)
    loading_replayed: bool = False

    @property
    def per_unit(self) -> int:
        return UNITS[self.figure["published"]["unit"]][0]

    @property
    def published(self) -> float:
        return self.figure["published"]["value"]

    @property
    def predicted(self) -> float:
        return self.predicted_bytes / self.per_unit

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= WITHIN

    @property
    def installed_error(self) -> float:
        """The error of the installed stack's prediction (the source's older libraries' differences left out)."""
        return (self.predicted_bytes - self.stack_bytes) / self.per_unit / self.published - 1


def format_of(figure: dict) -> tuple[Format | None, str]:
    """The figure's ``--quantize`` format on the components it names, or None and why it is not predicted."""
    return named_format(figure, TYPES, after_loading(figure))


def after_loading(figure: dict) -> bool:
    """Whether the source quantized the loaded modules (torchao's ``quantize_``, quanto's ``quantize`` + ``freeze``),
    as its ``settings_from`` says, rather than at load through diffusers' quantization configs."""
    return any(call in figure["settings_from"] for call in AFTER_LOADING)


def why_excluded(figure: dict) -> str:
    """Why the figure's setting cannot be predicted ('' when it can)."""
    if figure.get("usable") is False:
        return "marked not usable in the yaml: " + " ".join(str(figure.get("note", "")).split())
    found, why = format_of(figure)
    if found is None:
        return why
    published = figure.get("techniques_as_published") or {}
    if published.get("fuse_qkv"):
        return "fuse_qkv: diffusers' fuse_projections adds fused weights beside the unfused ones; not predicted"
    if figure["compare_to"] == "peak" and (published.get("torch_compile") or published.get("compile_vae")):
        return "torch.compile: the compiled graphs' allocations are not predicted (the memory prediction is eager's)"
    return ""


def spec_of(figure: dict) -> tuple[ProfileSpec, tuple[str, ...]]:
    """The figure's generation as a ProfileSpec, and the settings assumed (not stated by the source)."""
    chosen, assumed = settings(figure)
    values = {key: value for key, value in chosen.items() if value is not None}
    return ProfileSpec(model=figure["model"], batch_size=values.pop("batch_size", 1), **values), tuple(assumed)


def old_decode(figure: dict, spec: ProfileSpec, prediction: MemoryPrediction) -> tuple[MemoryPrediction, str]:
    """The prediction with the VAE decode's activations as the source's diffusers ran it, where replayed."""
    replayed = DECODE_2024_09.get(figure["model"]) if figure["source"].startswith(SEPTEMBER_2024) else None
    setting = {key: getattr(spec, key) for key in replay_cogvideox_decode.SETTING}
    if replayed is None or setting != replay_cogvideox_decode.SETTING:
        return prediction, ""
    calls = [
        call.model_copy(update={"activation_bytes": replayed})
        if call.stage == VAE_DECODE and call.component == prediction.decoder
        else call
        for call in prediction.calls
    ]
    return prediction.model_copy(update={"calls": calls}), "diffusers of 2024-09-04: CogVideoX decode replayed"


def predict(figure: dict) -> Compared:
    """The figure's counterpart predicted from its setting."""
    found, _ = format_of(figure)
    spec, assumed = spec_of(figure)
    prediction = with_formats(predict_memory(spec, True, ()), spec, [found])
    techniques = (found.technique,)
    if figure["compare_to"] == "parameters":
        installed = sum(stored_params(prediction, techniques).values())
        predicted, decoded = installed, ""
    else:
        installed = peak_under(prediction, techniques)
        older, decoded = old_decode(figure, spec, prediction)
        predicted = peak_under(older, techniques)
    name = ", ".join(f"{c}={found.backend}:{found.type}" for c in found.components)
    name += " after loading" if found.after_loading else " at load"
    extra, stack = stack_difference(figure, found, spec)  # resident from loading on: the peak holds it too
    stack = "; ".join(part for part in (stack, decoded) if part)
    reserved = RESERVED in figure["published"]["measures"]
    replayed = reserved and found.backend == "quanto" and not found.after_loading
    if replayed:  # pipe.to('cuda') replayed: the blocks loading leaves cached, and the generation after it
        cached = quanto_cached(spec, source_kinds(figure, found, spec), figure["compare_to"] == "peak")
    else:
        cached = reserved_slack(spec) if figure["compare_to"] == "peak" and reserved else 0
    total = predicted + extra + cached
    return Compared(figure, name, total, assumed, predicted + extra - installed, stack, cached, replayed)


def reserved_slack(spec: ProfileSpec) -> int:
    """What a reserved peak holds beyond the allocated one at ``spec``: the caching allocator replayed on one
    generation's allocations (``reserved_memory.generation``; one call, as the sources' examples run it)."""
    key = repr(spec)
    if key not in SLACKS:
        allocator = reserved_memory.generation(spec)
        SLACKS[key] = allocator.peak_reserved - allocator.peak_allocated
    return SLACKS[key]


def quanto_cached(spec: ProfileSpec, kinds: dict[str, str], peak: bool) -> int:
    """What a reserved counter holds beyond the allocated bytes of a pipeline quanto quantized at load as ``kinds``:
    ``pipe.to('cuda')`` replayed (``quanto_loading``), after it (the reserved bytes less those kept) or, ``peak``, at
    the peak of one generation continuing on the same allocator (reserved less allocated peak)."""
    key = repr((spec, sorted(kinds.items()), peak))
    if key not in SLACKS:
        allocator, kept = quanto_loading.loaded(spec, kinds)
        if peak:
            allocator = reserved_memory.generation(spec, allocator=allocator)
            SLACKS[key] = allocator.peak_reserved - allocator.peak_allocated
        else:
            SLACKS[key] = allocator.peak_reserved - kept
    return SLACKS[key]


def compare(figures: list[dict]) -> tuple[list[Compared], list[tuple[dict, str]]]:
    """Every memory figure predicted, or excluded with its reason."""
    compared, excluded = [], []
    for figure in figures:
        if figure["kind"] != "memory":
            continue
        why = why_excluded(figure)
        if why:
            excluded.append((figure, why))
            continue
        print("predicting", figure["id"], flush=True)
        compared.append(predict(figure))
    return compared, excluded


def counter_note(compared: Compared) -> str:
    """The counter behind the figure, as its source's code reads it: reserved blocks, allocated bytes, or not stated."""
    measures = compared.figure["published"]["measures"]
    if RESERVED in measures:
        cached = f": +{compared.cached_bytes / GIB:.2f} GiB cached blocks simulated" if compared.cached_bytes else ""
        return "reserved" + cached + (", loading replayed" if compared.loading_replayed else "")
    return "allocated" if "memory_allocated" in measures else "not stated"


def rich_table(compared: list[Compared]) -> Table:
    table = Table(title="published quantized memory vs predicted")
    for column in ("figure", "quantize", "what", "published", "predicted", "error", "counter"):
        table.add_column(column, justify="right" if column in ("published", "predicted", "error") else "left")
    for row in compared:
        unit = row.figure["published"]["unit"].split(" ")[0]
        unit = "GiB" if unit == "GB" and row.per_unit == GIB else unit
        table.add_row(
            row.figure["id"],
            row.quantize,
            row.figure["compare_to"],
            f"{row.published:.3f} {unit}",
            f"{row.predicted:.3f} {unit}",
            f"[{'green' if row.within else 'red'}]{row.error:+.1%}[/]",
            counter_note(row),
        )
    return table


def versions() -> str:
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in VERSIONS)


def markdown(compared: list[Compared], excluded: list[tuple[dict, str]]) -> str:
    within = sum(row.within for row in compared)
    median = statistics.median(abs(row.error) for row in compared) if compared else float("nan")
    as_installed = sum(abs(row.installed_error) <= WITHIN for row in compared)
    median_installed = statistics.median(abs(row.installed_error) for row in compared) if compared else float("nan")
    lines = [
        "# Published quantized memory figures vs diffmeter's prediction",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}",
        f"- {len(compared) + len(excluded)} memory figures in benchmarks/published_quantized.yaml: "
        f"{len(compared)} predicted, {len(excluded)} excluded (below, with the reason)",
        f"- **{within} of {len(compared)} within {WITHIN:.0%}**; median absolute error **{median:.1%}** (on the "
        f"installed libraries alone, without the sources' older libraries' differences: {as_installed} within, "
        f"median {median_installed:.1%})",
        "- 'source's stack': what the source's own, older libraries (or its own code) did differently, read from "
        "their code at the version the source's date or its own words fix (below); 'installed': the prediction on "
        "the libraries above",
        "- unit: a figure in GiB is compared in GiB; 'GB (not stated)' is read as GiB (the sources divide by "
        "1024**3; see the script's docstring), its reading as decimal GB shown beside it",
        "- 'parameters': the parameters and buffers resident after loading; 'peak': the whole generation's peak. "
        "The prediction counts allocated bytes; a peak read with max_memory_reserved adds the caching allocator's "
        "cached blocks, simulated (benchmarks/reserved_memory.py); after loading, quanto's at-load rows replay "
        "pipe.to('cuda') (benchmarks/quanto_loading.py), the others' loading is not simulated",
        "",
        "| figure | quantized as | what | setting | published | predicted (GiB) | error | as GB | counter | installed "
        "| source's stack |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in compared:
        spec, _ = spec_of(row.figure)
        setting = f"{spec.width}x{spec.height}" if spec.height else "default size"
        setting += f"x{spec.num_frames}f" if spec.num_frames else ""
        setting += f", {spec.steps} steps, batch {spec.batch_size}, {spec.dtype}"
        setting += f" (assumed: {', '.join(row.assumed)})" if row.assumed else ""
        unit = row.figure["published"]["unit"]
        as_gb = (
            f"{row.predicted_bytes / GB / row.published - 1:+.1%}"
            if unit.startswith("GB") and row.per_unit == GIB
            else ""
        )
        lines.append(
            f"| [{row.figure['id']}]({row.figure['url']}) | {row.quantize} | {row.figure['compare_to']} | {setting} "
            f"| {row.published} {unit} | {row.predicted:.3f} | {row.error:+.1%}{' ✓' if row.within else ''} "
            f"| {as_gb} | {counter_note(row)} | {row.installed_error:+.1%} | {row.stack} |"
        )
    lines += ["", "## Where the misses come from", ""]
    lines += [f"- {source}: {why}" for source, why in MISSES.items()]
    lines += ["", "## Excluded", ""]
    lines += [f"- {figure['id']}: {why}" for figure, why in excluded] or ["none"]
    return "\n".join(lines) + "\n"


def main() -> int:
    figures = yaml.safe_load(QUANTIZED.read_text())["figures"]
    compared, excluded = compare(figures)
    Console(width=200).print(rich_table(compared))
    text = markdown(compared, excluded)
    OUT.write_text(text)
    print(text.split("\n\n")[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
