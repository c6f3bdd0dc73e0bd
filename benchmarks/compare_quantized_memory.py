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
allocations (``reserved_memory``; the blocks loading leaves cached are not, so a reserved figure after loading is
compared with the allocated bytes).

Where a source ran older libraries, fixed by its own words or its date, what they did differently is read from their
code at that version and added (``stack_difference``, ``old_decode``), its effect shown apart ('installed').

Writes benchmarks/results/quantized_memory_published.md. Run from the repo root (fake-tensor runs, cached on disk;
minutes cold):
    python benchmarks/compare_quantized_memory.py
"""

from __future__ import annotations

import importlib.metadata
import re
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import replay_cogvideox_decode
import reserved_memory
import yaml
from calibrate_quantized import TYPES as LATENCY_TYPES
from calibrate_quantized import named_format
from published_comparison import GB, GIB, UNITS, settings
from rich.console import Console
from rich.table import Table

from diffmeter.predict import quantized_layouts as layouts
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.memory import DTYPES, predict_memory, settled_plan
from diffmeter.predict.quantized_formats import stored_tensors
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
        "Quanto int4 is not explained (-16.8% after loading, 2.06 GiB; -8.4% at the peak): quanto int8 and float8 of "
        "the same table are within 2.2%, 0.2.7's int4 layout holds the same bytes on CUDA (tinygemm); its repacking "
        "on `.to('cuda')` allocates int32 transients (optimum/quanto/tensor/weights/tinygemm/packed.py:54-59) that a "
        "reserved counter would keep as cached blocks, which the generation then reuses (the peak misses by 0.7 GiB "
        "less), but loading's allocations are not simulated."
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
#: sources run on transformers 4.x, as their date says (no version stated): "Exploring Quantization Backends" is of
#: 2025-05-21 (huggingface/blog PR #2852), before transformers 5.0; its T5 is read under 4.51.3's rules (``legacy_t5``)
TRANSFORMERS_4 = ("Exploring Quantization Backends",)
#: "We always default to using the PyTorch nightly, updated diffusers and torchao codebases" (the diffusers-torchao
#: README's Environment section); its CogVideoX table was added 2024-09-04 (commit 18855c8): the mains of then
SEPTEMBER_2024 = "diffusers-torchao README"
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


def legacy_t5(module, backend: str, kind: str, dtype) -> int:
    """The bytes a transformers model quantized at load held under transformers 4.51.3, less what the installed one
    stores: 4.51.3 put its ``_keep_in_fp32_modules`` (T5's ``wo``) in every quantizer's ``modules_to_not_convert``
    (quantizers/base.py:261-277, called by quantizer_bnb_4bit.py:298-300, quantizer_bnb_8bit.py:255-257,
    quantizer_torchao.py:185-187 and its ``key + "."`` skip at :203, quantizer_quanto.py:184-186), so they stay whole,
    and upcast them to float32 under a quantizer with ``use_keep_in_fp32_modules`` (bitsandbytes':
    quantizer_bnb_4bit.py:58, quantizer_bnb_8bit.py:55; modeling_utils.py:4360-4366 builds the pattern, :698 casts);
    the installed 5.x upcasts only at float16 (modeling_utils.py:3851-3852) and its torchao quantizes ``wo``."""
    keep = module._keep_in_fp32_modules or ()
    if not keep:
        return 0
    pattern = re.compile("|".join(rf"((^|\.){name}($|\.))" for name in keep))  # modeling_utils.py:4364-4366
    installed = {t.name: t.bytes for t in stored_tensors(module, backend, kind, dtype)}
    size = 4 if backend == "bnb" else dtype.itemsize
    return sum(
        tensor.numel() * size - installed[name] for name, tensor in module.named_parameters() if pattern.search(name)
    )


def tiled_int4(module, dtype) -> int:
    """torchao of September 2024's int4 weights (v0.5.0, tagged 2024-09-09, as main of 2024-09-04) less the installed
    ``Int4Tensor``'s: ``int4_weight_only``'s ``TensorCoreTiledLayoutType`` padded each weight to in_features a
    multiple of 1024 and out_features of 8 (torchao/dtypes/affine_quantized_tensor.py:477-488) before choosing its
    scales and zero points (``from_hp_to_intx``, :257-279), so the packed weight and the bfloat16 scale and zero per
    128 (quantization/quant_api.py:509-553) are of the padded shape; 0.18's Int4Tensor pads nothing."""
    extra = 0
    for stored in stored_tensors(module, "torchao", "int4wo", dtype, after_loading=True):
        if stored.quantized:
            out_features, in_features = module.get_parameter(stored.name).shape
            padded = layouts.torchao_bytes("int4wo", -(-out_features // 8) * 8, -(-in_features // 1024) * 1024, dtype)
            extra += padded - stored.bytes
    return extra


def stack_difference(figure: dict, found: Format, spec: ProfileSpec) -> tuple[int, str]:
    """Bytes the source's own (older) libraries held resident beyond the installed ones', and which rule."""
    import transformers

    older = figure["source"].startswith(TRANSFORMERS_4) and not found.after_loading
    tiled = figure["source"].startswith(SEPTEMBER_2024) and (found.backend, found.type) == ("torchao", "int4wo")
    if not (older or tiled):
        return 0, ""
    entry, settled, _ = settled_plan(spec)
    total = 0
    for name in found.components:
        dtype = DTYPES[settled.dtype_of(name)]
        module = meta_module(entry.components[name], dtype)
        if older and isinstance(module, transformers.PreTrainedModel):
            total += legacy_t5(module, found.backend, found.type, dtype)
        if tiled:
            total += tiled_int4(module, dtype)
    rule = "transformers 4.51.3: T5's wo whole" if older else "torchao 0.5: int4 padded"
    return total, rule if total else ""


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
    cached = (
        reserved_slack(spec) if figure["compare_to"] == "peak" and RESERVED in figure["published"]["measures"] else 0
    )
    return Compared(figure, name, predicted + extra + cached, assumed, predicted + extra - installed, stack, cached)


def reserved_slack(spec: ProfileSpec) -> int:
    """What a reserved peak holds beyond the allocated one at ``spec``: the caching allocator replayed on one
    generation's allocations (``reserved_memory.generation``; one call, as the sources' examples run it)."""
    key = repr(spec)
    if key not in SLACKS:
        allocator = reserved_memory.generation(spec)
        SLACKS[key] = allocator.peak_reserved - allocator.peak_allocated
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
        return "reserved" + cached
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
        "- 'source's stack': what the source's own, older libraries did differently, read from their code at the "
        "version the source's date or its own words fix (below); 'installed': the prediction on the libraries above",
        "- unit: a figure in GiB is compared in GiB; 'GB (not stated)' is read as GiB (the sources divide by "
        "1024**3; see the script's docstring), its reading as decimal GB shown beside it",
        "- 'parameters': the parameters and buffers resident after loading; 'peak': the whole generation's peak. "
        "The prediction counts allocated bytes; a peak read with max_memory_reserved adds the caching allocator's "
        "cached blocks, simulated (benchmarks/reserved_memory.py; after loading not simulated)",
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
