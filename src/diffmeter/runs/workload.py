"""What each pipeline call gets (prompts or class labels, seeds, settings) and what it returns."""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from diffmeter.catalog.controlnets import controlnet_of
from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.runs.prompts import prompt_pool
from diffmeter.runs.spec import BenchSpec


@dataclass(frozen=True)
class Batch:
    """The inputs of one call: a prompt (or an ImageNet class for DiT) and a seed per image."""

    prompts: list[str] | None
    class_labels: list[int] | None
    seeds: list[int]


class Workload:
    """Batches for warm-up and measured calls. Image ``n`` of a run always gets seed ``seed + n``
    and the ``n``-th prompt of the pool, so a run with other settings reproduces it."""

    def __init__(self, spec: BenchSpec, entry: PipelineEntry) -> None:
        self.spec = spec
        self.entry = entry
        self.family = get_family(entry.family)
        self.class_conditional = entry.family == "dit"
        self._files: list | None = None
        # data-parallel ranks each take every ``data_parallel``-th batch of the group's workload
        count = spec.num_prompts or spec.batch_size * spec.iterations * spec.data_parallel
        if self.class_conditional:
            if spec.prompt is not None or spec.prompts_file is not None:
                raise DiffmeterError(
                    f"{entry.name} is class-conditional: it generates ImageNet classes (sampled with --seed), "
                    "not prompts; drop --prompt/--prompts"
                )
            classes = entry.components[self.family.denoiser].config.get("num_embeds_ada_norm") or 1000
            rng = random.Random(spec.seed)
            self.pool = [rng.randrange(classes) for _ in range(count)]
        else:
            self.pool = prompt_pool(spec.prompt, spec.prompts_file, count, spec.seed)

    def batch(self, iteration: int) -> Batch:
        size = self.spec.batch_size
        first = iteration * size
        picked = [self.pool[(first + k) % len(self.pool)] for k in range(size)]
        seeds = [self.spec.seed + first + k for k in range(size)]
        if self.class_conditional:
            return Batch(None, picked, seeds)
        return Batch(picked, None, seeds)

    def call_arguments(self, pipe, batch: Batch) -> dict:
        """Keyword arguments for ``pipe(...)``: the spec's settings in the pipeline's own names."""
        spec = self.spec
        accepted = inspect.signature(type(pipe).__call__).parameters
        arguments = dict(self.entry.extra.get("runtime", {}).get("call", {}))
        arguments.update(
            num_inference_steps=spec.steps,
            **self.family.guidance_arguments(self.entry, spec.guidance_scale),
            **self.family.true_cfg_arguments(spec.true_cfg_scale, spec.batch_size),
            # CPU generators: the same seed gives the same noise on every device
            generator=[torch.Generator("cpu").manual_seed(seed) for seed in batch.seeds],
            output_type="pil",
        )
        if self.class_conditional:
            arguments["class_labels"] = batch.class_labels
        else:
            arguments.update(prompt=batch.prompts, height=spec.height, width=spec.width)
        steering = controlnet_of(self.entry)
        if spec.image_sizes and not steering:
            arguments.update(self.family.image_arguments(self.entry, [self.input_images(seed) for seed in batch.seeds]))
        if steering:  # the ControlNet pipelines name it control_image (FLUX) or image (SD, SDXL)
            name = "control_image" if "control_image" in accepted else "image"
            arguments.update(steering["call"], **{name: [self.control_image(seed) for seed in batch.seeds]})
            for option in ("control_guidance_start", "control_guidance_end", "controlnet_conditioning_scale"):
                if getattr(spec, option) is not None:
                    arguments[option] = getattr(spec, option)
        if self.family.is_video:
            arguments["num_frames"] = spec.num_frames
        if spec.max_sequence_length is not None:  # settled: the model card's where not asked (FLUX.1-schnell: 256)
            arguments["max_sequence_length"] = spec.max_sequence_length
        if spec.cfg_trunc_ratio is not None:  # settled: the model card's where not asked (Lumina-Image-2.0: 0.25)
            arguments["cfg_trunc_ratio"] = spec.cfg_trunc_ratio
        if "use_resolution_binning" in accepted:
            arguments["use_resolution_binning"] = spec.resolution_binning
        arguments = {name: value for name, value in arguments.items() if name in accepted}
        return self.family.seeded_call(pipe, arguments) if spec.image_sizes and not steering else arguments

    def input_images(self, seed: int) -> list:
        """One output's input images: the ``--image`` files, else seeded noise at each ``--image-size`` (its
        output's seed, so a run with other settings edits the same images)."""
        from PIL import Image

        if self.spec.images:
            if self._files is None:
                self._files = [Image.open(path).convert("RGB") for path in self.spec.images]
            return self._files
        made = []
        for index, (height, width) in enumerate(self.spec.image_sizes):
            pixels = np.random.default_rng([seed, index]).integers(0, 256, (height, width, 3), dtype=np.uint8)
            made.append(Image.fromarray(pixels))
        return made

    def control_image(self, seed: int):
        """One output's ControlNet condition: the input image (``--image``, or seeded noise at ``--image-size``), else
        seeded noise at the output size (the pipelines resize it to it)."""
        from PIL import Image

        if self.spec.image_sizes:
            return self.input_images(seed)[0]
        pixels = np.random.default_rng([seed, 1 << 20]).integers(0, 256, (self.spec.height, self.spec.width, 3))
        return Image.fromarray(pixels.astype(np.uint8))

    def requests(self, iterations: int) -> dict:
        """requests.json: the inputs of every measured call."""
        calls = []
        for index in range(iterations):
            batch = self.batch(index)
            calls.append(
                {"iteration": index, "prompts": batch.prompts, "class_labels": batch.class_labels, "seeds": batch.seeds}
            )
        return {"spec": self.spec.model_dump(mode="json"), "calls": calls}


def outputs(result) -> list:
    """The images (PIL) or videos (lists of PIL frames) a pipeline call returned."""
    frames = getattr(result, "frames", None)
    if frames is not None:
        return list(frames)
    return list(result.images)


def save_output(output, folder: Path, number: int, label: str) -> Path:
    """PNG for an image; animated PNG (lossless, readable by PIL) for a video."""
    from diffmeter.runs.storage import slug

    path = folder / f"{number:05d}_{slug(label, 48) or 'image'}.png"
    if isinstance(output, list | tuple):
        output[0].save(path, save_all=True, append_images=list(output[1:]), duration=125, loop=0)
    else:
        output.save(path)
    return path
