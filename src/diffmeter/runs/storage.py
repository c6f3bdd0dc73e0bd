"""Run directories on disk: named from the spec, written atomically, read back with one clear line when they
cannot be (the staging and swap of a run's folder: ``runs.run_directory``).

    <out>/model-<id>+batch-1+width-512+height-512+steps-20+guidance-7.5+seed-0+float16+cuda/
        requests.json   prompts, seeds and call settings
        results.json    the BenchResult (written last, atomically)
        bench.log       what happened, line by line
        images/         the generated images (PNG; videos as animated PNG)
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

from pydantic import ValidationError

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError, validation_problem
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec
from diffmeter.spec import size_text

RESULTS = "results.json"
REQUESTS = "requests.json"
LOG = "bench.log"
IMAGES = "images"


def run_name(spec: BenchSpec, entry: PipelineEntry, optimizations: list[str] | tuple[str, ...] = ()) -> str:
    """``model-black-forest-labs-FLUX_1-dev+batch-1+width-1024+height-1024+steps-28+...``: every
    setting that changes what is generated, so two different runs never share a folder."""
    # a local directory is named by its folder; catalog names and hub ids stay whole
    model = Path(entry.id).name if entry.origin == "local" and Path(entry.id).expanduser().is_dir() else entry.id
    parts = [
        f"model-{slug(model)}",
        f"batch-{spec.batch_size}",
        f"width-{spec.width}",
        f"height-{spec.height}",
        *([f"frames-{spec.num_frames}"] if spec.num_frames else []),
        f"steps-{spec.steps}",
        f"guidance-{spec.guidance_scale:g}",
        *_true_cfg(spec),
        *_conditions(spec),
        f"seed-{spec.seed}",
        spec.dtype,
        *_component_dtypes(spec),
        spec.device.replace(":", ""),
        *(["random-weights"] if spec.random_weights else []),
        *_call_options(spec),
        *_prompts(spec),
        *parallel_parts(spec),
        *(f"opt-{slug(name)}" for name in optimizations),
    ]
    return "+".join(parts)


def other_settings(spec: BenchSpec) -> list[str]:
    """``run_name``'s parts that a table's columns do not show (``true-cfg-4``, ``lora-r8``, ``prompt-...``)."""
    return [*_true_cfg(spec), *_conditions(spec), *_component_dtypes(spec), *_call_options(spec), *_prompts(spec)]


def _true_cfg(spec: BenchSpec) -> list[str]:
    return [f"true-cfg-{spec.true_cfg_scale:g}"] if spec.true_cfg_scale is not None else []


def _conditions(spec: BenchSpec) -> list[str]:
    """Input images, a ControlNet and its options, a LoRA."""
    controlnet = [f"controlnet-{slug(spec.controlnet, 40)}"] if spec.controlnet else []
    return [*_images(spec), *controlnet, *_control(spec), *_lora(spec)]


def _component_dtypes(spec: BenchSpec) -> list[str]:
    return [f"{slug(name)}-{dtype}" for name, dtype in sorted(spec.component_dtypes.items())]


def _call_options(spec: BenchSpec) -> list[str]:
    """The text length, Lumina's CFG truncation and resolution binning, where given."""
    return [
        *([f"max-sequence-length-{spec.max_sequence_length}"] if spec.max_sequence_length else []),
        *([f"cfg-trunc-{spec.cfg_trunc_ratio:g}"] if spec.cfg_trunc_ratio is not None else []),
        *(["no-binning"] if spec.resolution_binning is False else []),
    ]


#: the settings of how a run was measured, which its folder's name does not hold: a stored result measured otherwise
#: is not the run a spec asks for
MEASURED_BY = (
    "warmup",
    "iterations",
    "min_duration_s",
    "target_precision",
    "max_iterations",
    "num_prompts",
    "compare_baseline",
    "trace",
    "peak_tflops",
)


def measured_otherwise(stored_spec: dict, spec: BenchSpec) -> list[str]:
    """Where a stored result's spec (its results.json's) was measured otherwise than ``spec`` asks: "iterations 4 ->
    8" per setting of ``MEASURED_BY`` (one the stored spec predates is not compared)."""
    new = spec.model_dump(mode="json")
    return [
        f"{key} {stored_spec[key]!r} -> {new[key]!r}"
        for key in MEASURED_BY
        if key in stored_spec and stored_spec[key] != new[key]
    ]


def _control(spec: BenchSpec) -> list[str]:
    """``control-0.2-0.8`` (the ControlNet's step range) and ``control-scale-0.5``, where given: they change the
    images, not the MACs."""
    parts = []
    if spec.control_guidance_start is not None or spec.control_guidance_end is not None:
        start, end = spec.control_guidance_start, spec.control_guidance_end
        parts.append(f"control-{'-' if start is None else f'{start:g}'}-{'-' if end is None else f'{end:g}'}")
    if spec.controlnet_conditioning_scale is not None:
        parts.append(f"control-scale-{spec.controlnet_conditioning_scale:g}")
    return parts


def _images(spec: BenchSpec) -> list[str]:
    """``image-1024x768`` per input image (seeded noise), ``image-file-cat-1024x768`` per ``--image`` file."""
    files = [f"file-{slug(Path(path).stem, 24)}-" for path in spec.images] or [""] * len(spec.image_sizes)
    return [f"image-{file}{size_text(size)}" for file, size in zip(files, spec.image_sizes, strict=True)]


def _lora(spec: BenchSpec) -> list[str]:
    """``lora-r16`` (a fresh adapter; with its targets when named), ``lora-file-NAME``; ``-fused`` when fused."""
    if spec.lora is not None:
        name = f"lora-file-{slug(Path(spec.lora).expanduser().name, 32)}"
    elif spec.lora_rank is not None:
        name = f"lora-r{spec.lora_rank}" + (f"-{slug('-'.join(spec.lora_targets), 32)}" if spec.lora_targets else "")
    else:
        return []
    return [name + ("-fused" if spec.fuse_lora else "")]


def parallel_parts(spec: BenchSpec) -> list[str]:
    """The parallel degrees above 1 as the run folder names them: ``ulysses-2``, ``data-parallel-2``."""
    degrees = {
        "ulysses": spec.ulysses_degree,
        "ring": spec.ring_degree,
        "tp": spec.tp_degree,
        "cfg": spec.cfg_degree,
        "data-parallel": spec.data_parallel,
    }
    return [f"{name}-{value}" for name, value in degrees.items() if value > 1]


def _prompts(spec: BenchSpec) -> list[str]:
    """Where the prompts come from, when not the shipped set: the text or file, with a hash of its content."""
    if spec.prompt is not None:
        return [f"prompt-{slug(spec.prompt, 24)}-{_digest(spec.prompt)}"]
    if spec.prompts_file is not None:
        path = Path(spec.prompts_file).expanduser()
        content = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else str(path)
        return [f"prompts-{slug(path.stem, 24)}-{_digest(content)}"]
    return []


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:8]


def slug(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text.replace("/", "-").replace(".", "_")).strip("_")[:limit]


def write_json(path: Path, data) -> None:
    """Atomically, as :func:`write_text`."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """Atomically, as :func:`write_file`."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    write_file(path, write)


def writable(path: str | Path) -> Path:
    """``path`` (``~`` expanded) if a file can be written there, checked by making one beside it; else one line
    saying why and what to do."""
    path = _file_path(path)
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:  # a folder one may not write in (/sys), or none a file can be made in (/proc)
        raise _cannot_write(path, error) from None
    return path


def writable_folder(folder: Path) -> None:
    """``folder`` made where missing and written to once; else one line saying why and what to do."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise DiffmeterError(
            f"cannot write results under {folder}: {error.strerror or error}; pass --out DIR"
        ) from None


def write_file(path: Path, write) -> None:
    """``write(temporary path)`` into a temporary file in the same folder, renamed over ``path``: never half a
    file; the file gets the permissions of an ordinary one (mkstemp makes it private)."""
    path = _file_path(path)
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:  # the temporary file is the check ``writable`` makes
        raise _cannot_write(path, error) from None
    os.close(descriptor)
    try:
        os.chmod(temporary, 0o666 & ~_umask())
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _file_path(path: str | Path) -> Path:
    """``path`` (``~`` expanded) if it names a file in an existing folder; else one line saying why."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DiffmeterError(f"{path} is a folder: name a file in it")
    if not path.parent.is_dir():
        problem = "is not a folder" if path.parent.exists() else "does not exist"
        raise DiffmeterError(f"cannot write {path}: {path.parent} {problem}; name a file in an existing folder")
    return path


def _cannot_write(path: Path, error: OSError) -> DiffmeterError:
    return DiffmeterError(f"cannot write {path}: {error.strerror or error}; name a file in a folder you can write")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def read_result(path: str | Path) -> BenchResult:
    """A stored result from its run folder or its results.json; one clear line if it is not one."""
    path = Path(path).expanduser()
    file = path / RESULTS if path.is_dir() else path
    if not file.is_file():
        runs = sorted(path.glob(f"*/{RESULTS}")) if path.is_dir() else []
        if runs:  # the --out folder of several runs
            raise DiffmeterError(
                f"{path} holds {len(runs)} run folders, not one run: point at one of them ({runs[0].parent}), or "
                f"see them all with `diffmeter table {path}`"
            )
        hint = " (an interrupted run leaves none)" if path.is_dir() else ""
        raise DiffmeterError(f"no {RESULTS} at {file}{hint}; point at a run folder written by `diffmeter bench`")
    return read_model(file, BenchResult, "result", "re-run the benchmark").stored_in(file.parent)


def read_model(file: Path, model, what: str, fix: str):
    """``file`` validated as the pydantic ``model``; one clear line naming ``what`` and the ``fix`` if not, and
    a refusal of a file a newer diffmeter wrote (its fields may mean what this version does not know)."""
    try:
        text = file.read_text(encoding="utf-8")
        found = model.model_validate_json(text)
        version = getattr(found, "schema_version", None)
    except ValidationError as error:
        problem = error.errors()[0]
        reason = (
            problem["msg"] if problem["type"] == "json_invalid" else validation_problem(error, "the file as a whole")
        )
        found, version = None, _schema_in(text)  # a newer file may fail on fields this version does not know
    except (ValueError, OSError) as error:
        reason = str(error).splitlines()[0]
        raise DiffmeterError(f"{file} is not a readable diffmeter {what} ({reason}); {fix}") from None
    current = getattr(model.model_fields.get("schema_version"), "default", None)
    if isinstance(version, int) and isinstance(current, int) and version > current:
        raise DiffmeterError(
            f"{file} is not a readable diffmeter {what} (written by a newer diffmeter: schema {version}, this one "
            f"reads {current}); upgrade diffmeter to read it"
        )
    if found is None:
        raise DiffmeterError(f"{file} is not a readable diffmeter {what} ({reason}); {fix}")
    return found


def _schema_in(text: str) -> int | None:
    """The ``schema_version`` a JSON text states, read without validating the rest; None if none."""
    try:
        found = json.loads(text).get("schema_version")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, int) else None


def file_logger(folder: Path) -> logging.Logger:
    """A logger writing to ``folder/bench.log`` (closed by ``close_logger``)."""
    logger = logging.getLogger(f"diffmeter.runs.{folder.name}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(folder / LOG, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger


def add_log_file(logger: logging.Logger, path: Path) -> None:
    """``logger`` (from ``file_logger``) also written to ``path``."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logger.handlers[0].formatter)
    logger.addHandler(handler)


def close_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)
