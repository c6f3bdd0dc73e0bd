"""The one life of a measured run, whoever executes it (this process, a rank of a parallel group, a sweep
cell's process): place, check, open, load, apply, warm up, measure, summarize, combine, compare, predict,
store. :class:`MeasuredRun` holds the phases as methods and ``run()`` calls them in that order.

What a parallel group adds is a :class:`Group` (``distributed.group.RankGroup``): which batches this process
generates, the split of the model after the techniques, the barriers before the measured loop and before
each measured call, the merge of every rank's result, and the stop of every rank when one fails. A run
alone uses :data:`ALONE`, which adds nothing. The choice between the two is made above (``execute``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

from diffmeter.catalog import entry_of
from diffmeter.catalog.controlnets import controlnet_of
from diffmeter.errors import DiffmeterError
from diffmeter.families import lora
from diffmeter.loading import attach_lora, load_pipeline, loaded_dtypes
from diffmeter.measure.clock import clock_for, device_scope
from diffmeter.measure.compilation import watch_compilation
from diffmeter.measure.conditions import ConditionsMonitor
from diffmeter.measure.energy import Energy, EnergyMeter
from diffmeter.measure.environment import collect as collect_environment
from diffmeter.measure.environment import speed_differences, speed_settings
from diffmeter.measure.host_link import link_line
from diffmeter.measure.host_link import measure as measure_link
from diffmeter.measure.memory import loaded_bytes, out_of_memory, read_peaks, release, reset_peaks
from diffmeter.measure.stage_memory import StagePeaks
from diffmeter.measure.stages import StageTimer
from diffmeter.measure.stored_weights import component_weights_bytes
from diffmeter.optimize import build
from diffmeter.optimize.tf32 import fp32_math, fp32_precision
from diffmeter.runs import baseline, calls, speedups, storage
from diffmeter.runs.group import ALONE, Group
from diffmeter.runs.placement import Placement
from diffmeter.runs.prepared import prepare, result_fields, run_name
from diffmeter.runs.prompt_profile import profile_of_the_prompts
from diffmeter.runs.results import BenchResult, Speedup
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.summary import measurement_notes, summarize_run
from diffmeter.runs.workload import Workload, outputs

#: how the run's log begins the line it writes as each of its pipeline calls starts (a cell stopped in one names it)
CALL_STARTS = "call starts: "


class MeasuredRun:
    """One measured run in this process, phase by phase."""

    def __init__(self, spec: BenchSpec, out, force=False, progress=None, place=None, group: Group = ALONE) -> None:
        self.spec, self.out, self.force = spec, out, force
        self.progress = progress or (lambda *_: None)
        self.place = place or Placement.alone(spec)
        self.group = group

    def run(self) -> tuple[BenchResult, Path] | None:
        """Every phase in its order; returns (result, folder) where this process stored it, else None."""
        self.place.enter()  # before anything asks the device a question
        self.run_ = run = prepare(self.spec, device=self.place.device)  # every check on the run's own device
        self.workload = self.group.workload(run.spec, run.entry)  # reads the prompts file: a refusal, too
        speed = speed_settings(collect_environment(), str(self.place.device))  # threads etc.: not in the folder name
        self.directory = RunDirectory(self.out, run.name, self.force, run.spec, speed)
        self.directory.check()
        earlier = self.baseline()
        self.group.join(run)
        self.staging, own = self.group.open(self.directory, self.requests)
        self.log = storage.file_logger(own)
        self.group.copy_log(self.log)
        self.log.info("%s on %s", self.group.describe(), self.place.device)
        try:
            with warnings.catch_warnings():
                warnings.showwarning = self._log_warning  # the libraries' warnings go to the run's log
                return self.measured_to_stored(earlier)
        except BaseException:
            self.log.exception("interrupted")
            self.directory.discard()  # nothing half-written stays behind
            raise
        finally:
            storage.close_logger(self.log)
            self.pipe = self.timer = self.meter = self.contexts = None  # the next run starts from free memory
            release(self.place.device)

    def measured_to_stored(self, earlier) -> tuple[BenchResult, Path] | None:
        """Measure, combine over the group, compare, predict, store."""
        run = self.run_
        result = self.measure()
        if result.status == "failed":
            self.group.abandon(result.error)
        result = self.group.combine(result, run, self.staging)
        if result is None:
            return None
        if result.status == "complete":
            self.compare(result, earlier)
            self.predict(result)
        return self.store(result)

    def _log_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.log.warning("%s: %s (%s:%d)", category.__name__, message, filename, lineno)

    def requests(self, calls: int | None):
        return Workload(self.run_.spec, self.run_.entry).requests(calls or self.run_.spec.iterations)

    def baseline(self):
        """``--compare-baseline``: the unoptimized run of the same spec, stored or measured first."""
        spec = self.run_.spec
        self.began = datetime.now(timezone.utc).replace(microsecond=0)  # a baseline stored before it was reused
        if not spec.compare_baseline:  # settled: set only where the run applies a technique
            return None
        return stored_or_run(spec.baseline(), self.out, self.progress, replace=self.force)

    def measure(self) -> BenchResult:
        """Load, apply, warm up, measure, summarize; running out of memory is a failed result."""
        run = self.run_
        spec, device = run.spec, self.place.device
        self.device, self.base, self.applied, self.pipe, self.figures = device, result_fields(run), [], None, {}
        calling = False  # in the pipeline's own calls: an error there is the run's failure, stored with its reason
        self.base["spec"] = spec.model_copy(update={"device": str(device)})  # a rank's own GPU, whatever spec says
        self.log.info("spec %s", spec.model_dump_json())
        self.log.info("weights: %s", run.source.describe())
        try:
            with device_scope(device), _strict_fp32(device):
                self.link()
                self.load()
                self.apply()
                calling = True
                with self.timer:
                    self.warm_up()
                    self.measure_calls()
                summary = self.summarize()
                if spec.trace:  # after the measured calls and their peaks: it changes neither
                    with self.timer:
                        self.figures["trace"] = calls.traced_call(
                            self.pipe, self.timer, self.workload, self.staging, self.contexts, device
                        )
        except Exception as error:
            # an AssertionError is a broken invariant (the fake CUDA device's checks in the tests): never a result
            exhausted = out_of_memory(error)
            if not exhausted and (not calling or isinstance(error, DiffmeterError | AssertionError)):
                raise
            first = (str(error) or type(error).__name__).splitlines()[0]
            message = f"out of memory on {device}: {first}" if exhausted else calls.call_failure(error, device, spec)
            self.log.exception(message)
            return BenchResult(status="failed", error=message, load_s=self.figures.get("load_s"), **self.base)
        finally:
            for optimization in reversed(self.applied):
                optimization.restore(self.pipe, run.target)
        self.base["notes"] += measurement_notes(summary, self.shape_warmups, bool(spec.num_frames))
        return BenchResult(status="complete", summary=summary, **self.figures, **self.base)

    def link(self) -> None:
        """The host link's copy rates, once per CUDA run, before anything loads (stored with the environment)."""
        environment = self.base["environment"]
        if self.device.type == "cuda":
            environment.host_link = measure_link(self.device)
        self.log.info(link_line(environment.host_link, self.device.type == "cuda"))

    def load(self) -> None:
        """The pipeline, on the run's device (on the CPU when a technique places it, and the components a
        parallel layer or a technique places itself)."""
        run, spec = self.run_, self.run_.spec
        self.progress("loading", 0, None)
        self.started = time.perf_counter()
        placed = any(o.places_pipeline for o in run.optimizations)
        device = torch.device("cpu") if placed else self.device
        target = self.place.target(run.target)  # the techniques' target on this process's device
        # components a parallel layer or a technique places itself, loaded on the CPU (nothing when all is)
        held = self.group.holds_back(run) + tuple(n for o in run.optimizations for n in o.holds_back(target))
        self.target = dataclasses.replace(target, held=() if placed else held)
        quantization = {name: config for o in run.optimizations for name, config in o.load_configs(target).items()}
        self.pipe = load_pipeline(
            run.entry, run.source, device, spec.dtype, spec.seed, self.target.held, spec.component_dtypes, quantization
        )
        family = run.target.family
        if spec.image_sizes and not controlnet_of(run.entry):  # a ControlNet's control image needs no other class
            self.pipe = family.conditioned_pipeline(self.pipe)
        targets = lora.target_names(family, run.entry, spec.lora_targets)
        attach_lora(self.pipe, family.denoiser, targets, spec.lora_rank, spec.lora, spec.fuse_lora)
        self.base["component_dtypes"] = loaded_dtypes(self.pipe)
        family.prepare_pipeline(self.pipe, spec.guidance_scale, spec.batch_size)

    def apply(self) -> None:
        """The techniques in their order, then the group's split of the model."""
        for optimization in self.run_.optimizations:
            self.log.info("applying %s", optimization.label())
            optimization.apply(self.pipe, self.target)
            self.applied.append(optimization)
        self.group.apply(self.pipe)
        _synchronize(self.device)
        self.figures["load_s"] = time.perf_counter() - self.started
        self.log.info("loaded and optimized in %.3f s", self.figures["load_s"])
        run, family = self.run_, self.run_.target.family
        self.base["profile"], note, self.profiled = profile_of_the_prompts(
            run.spec, family, self.pipe, self.workload, run.profile
        )
        self.base["notes"] += [note] if note else []
        self.loaded = loaded_bytes(self.device)
        self.weights = component_weights_bytes(self.pipe)
        self.meter = EnergyMeter(self.device)
        self.stage_peaks = StagePeaks(self.device) if self.device.type == "cuda" else None
        self.timer = StageTimer(
            self.pipe,
            list(family.text_encoders),
            list(family.step_components(run.entry)),
            family.decoder,
            clock_for(self.device),
            self.stage_peaks,
        )
        self.contexts = [o.call_context for o in run.optimizations]

    def warm_up(self) -> None:
        """The cold call and the other warm-up calls (plus one per unseen input shape when compiling)."""
        spec = self.run_.spec
        compiling = any(o.kind == "compile" for o in self.run_.optimizations)
        graphs = any(getattr(o, "cuda_graphs", False) for o in self.run_.optimizations)
        indices, self.shape_warmups = calls.warm_up_indices(spec, self.pipe, self.workload, compiling, graphs)
        if graphs and spec.warmup < calls.CUDA_GRAPH_WARMUPS:
            self.base["notes"].append(
                f"{calls.CUDA_GRAPH_WARMUPS} warm-up calls, not --warmup {spec.warmup}: CUDA graphs are recorded on a "
                "function's second call, and a component called once per generation would record in a measured one"
            )
        self.planned = len(indices) + spec.iterations
        warmup = []
        for done, index in enumerate(indices):
            self.progress("warm-up", done, self.planned)
            compiles = " (torch.compile compiles on it)" * (compiling and done == 0)
            self.log.info("%swarm-up call %d of %d%s", CALL_STARTS, done + 1, len(indices), compiles)
            arguments = self.workload.call_arguments(self.pipe, self.workload.batch(index))
            with watch_compilation() as compiled:
                iteration = calls.timed_call(self.pipe, self.timer, arguments, index, None, self.contexts)[0]
            warmup.append(iteration.total_s)
            if done == 0:
                self.figures.update(first_call=iteration, first_call_s=iteration.total_s, first_compiled=compiled)
                self.log.info("first call %.3f s", iteration.total_s)
        self.figures["warmup_s"] = warmup
        with contextlib.ExitStack() as stack:
            for context in self.contexts:
                stack.enter_context(context())
            self.figures["fp32_precision"] = fp32_precision() if self.device.type == "cuda" else None

    def measure_calls(self) -> None:
        """Measured calls until the count, the minimum duration and any target precision are reached, each
        after the group's barrier, inside one energy window, the conditions monitor and the compilation watch."""
        spec, device = self.run_.spec, self.device
        self.group.barrier()
        self.rss_was_reset = reset_peaks(device)
        if self.stage_peaks is not None:
            self.stage_peaks.reset()
        iterations, energy, images, elapsed = [], [], [], 0.0
        monitor = ConditionsMonitor(device.index or 0 if device.type == "cuda" else None)
        monitor.start()
        with watch_compilation() as compilation:
            loop = self.meter.begin()
            while calls.keep_measuring(spec, iterations, elapsed):
                index = len(iterations)
                planned = self.planned if index < spec.iterations else None
                self.progress("measuring", len(self.figures["warmup_s"]) + index, planned)
                self.log.info("%smeasured call %d", CALL_STARTS, index + 1)
                batch = self.workload.batch(index)
                arguments = self.workload.call_arguments(self.pipe, batch)
                self.group.barrier()
                iteration, output = calls.timed_call(self.pipe, self.timer, arguments, index, self.meter, self.contexts)
                iterations.append(iteration)
                energy.append(iteration.energy)
                elapsed += iteration.wall_s
                self.log.info(calls.call_line(iteration))
                if spec.save_images:
                    images += calls.save_images(outputs(output), batch, index, self.staging)
            energy_loop = self.meter.end(loop)
        self.conditions = monitor.stop()
        done = len(self.figures["warmup_s"]) + len(iterations)  # more than planned where --target-precision asked
        self.progress("measuring", done, done)
        self.compilation, self.energy = compilation, (energy if self.meter.available else [], energy_loop)
        self.figures.update(iterations=iterations, images=images)

    def summarize(self):
        """The measured calls' statistics, peaks, energy, FLOPs and rates."""
        iterations = self.figures["iterations"]
        images = sum(iteration.images for iteration in iterations)
        return summarize_run(
            self.run_.spec,
            iterations,
            read_peaks(self.device, self.loaded, self.rss_was_reset, self.stage_peaks, self.weights),
            Energy.of(*self.energy, images, self.meter),
            self.base["profile"],
            self.figures["first_call_s"],
            self.compilation,
            self.conditions,
            self.figures["first_compiled"],
        )

    def compare(self, result: BenchResult, earlier) -> None:
        """Against the unoptimized run (``--compare-baseline``): the images at the same seeds and the speed."""
        if earlier is None:
            return
        stored, folder = earlier
        result.quality = baseline.compare_with_baseline(result, self.staging, stored, folder)
        result.speedup = Speedup.of(speedups.between(stored, result), str(folder))
        result.notes += baseline.notes(stored, folder, self.began)

    def predict(self, result: BenchResult) -> None:
        """The offline prediction beside the measurements; one that cannot be made is a note."""
        from diffmeter.predict.bench_prediction import predict_or_note

        spec = result.spec
        if not spec.predict:
            return
        split, note = self.group.prediction_split()  # a group's: one GPU of it, with its communication
        if note is None:
            result.prediction, note = predict_or_note(
                spec, result.optimizations, result.fp32_precision, split, self.profiled
            )
        if note:
            self.log.warning(note)
            result.notes.append(note)

    def store(self, result: BenchResult) -> tuple[BenchResult, Path]:
        """results.json written and the staged folder moved into place; a failed run is stored, then raised."""
        if len(result.iterations) > self.run_.spec.iterations:  # --min-duration or --target-precision: more calls
            storage.write_json(self.staging / storage.REQUESTS, self.requests(len(result.iterations)))
        self.log.info("done: %s", result.status)
        folder = self.directory.commit(result)
        result.stored_in(folder)
        if result.status == "failed":
            raise DiffmeterError(f"{result.error} (recorded as a failed result in {folder})")
        return result, folder


def bench(spec: BenchSpec, out: str | Path = "results", force: bool = False, progress=None):
    """Run ``spec`` in this process and store it under ``out``; returns (BenchResult, run folder). A spec of
    several processes runs through ``diffmeter.execute.bench``, which starts them."""
    if spec.world_size > 1:
        raise DiffmeterError(
            f"this spec runs over {spec.world_size} processes: start it with diffmeter.execute.bench (or `diffmeter "
            "bench`), which launches them"
        )
    return MeasuredRun(spec, out, force, progress).run()


def stored_or_run(spec: BenchSpec, out, progress=None, rerun: bool = False, replace: bool = False):
    """The complete result of ``spec`` stored in ``out`` when it holds every image the spec asks for (same seed
    and prompt or class); otherwise run it: ``rerun`` always, replacing what is there; a stored result that does
    not serve (failed, or short of images) only with ``replace`` (``--force``), else refused in one line, so no
    stored run is lost unasked. Returns (result, folder)."""
    entry = entry_of(spec)
    settled = spec.settle(entry)
    folder = Path(out).expanduser() / run_name(settled, entry, build(settled.optimizations))
    if not rerun and (folder / storage.RESULTS).exists():
        stored = storage.read_result(folder)
        workload = Workload(settled, entry)
        wanted = set()
        for index in range(settled.iterations):
            batch = workload.batch(index)
            wanted |= set(zip(batch.seeds, batch.prompts or batch.class_labels, strict=True))
        held = {
            (image.seed, image.prompt if image.prompt is not None else image.class_label) for image in stored.images
        }
        # measured with other threads, hardware or versions: a speed-up against it would be of those (121x "faster"
        # against a baseline of another thread count: a new user's trial)
        now = speed_settings(collect_environment(), settled.device)
        otherwise = speed_differences(speed_settings(stored.environment, stored.spec.device), now)
        if stored.status == "complete" and wanted <= held and not otherwise:
            return stored, folder
        if not replace:
            why = (
                f"a failed result ({(stored.error or 'no reason stored').splitlines()[0]})"
                if stored.status != "complete"
                else f"{len(wanted & held)} of the {len(wanted)} images (seed and prompt) this run needs"
                if not wanted <= held
                else f"a run measured otherwise than this process would ({'; '.join(otherwise)})"
            )
            raise DiffmeterError(f"the stored run {folder} holds {why}: pass --force to measure it again, replacing it")
    return bench(spec, out=out, force=True, progress=progress)


def _strict_fp32(device: torch.device):
    """On CUDA, float32 matmuls and convolutions in strict IEEE float32 unless a technique (tf32)
    says otherwise for its calls; PyTorch's own default runs convolutions in TF32."""
    return fp32_math(False) if device.type == "cuda" else contextlib.nullcontext()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
