"""The offline compute profile: every component built on the meta device and counted.

FLOPs come from the counter (2 per multiply-add); MACs are half of them, exactly,
since only matmuls, convolutions and attention are counted.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import torch

from diffmeter.catalog import ComponentEntry, entry_of
from diffmeter.catalog.controlnets import controlnet_of
from diffmeter.errors import DiffmeterError
from diffmeter.families import DENOISER, Call, get_family, lora, schedule
from diffmeter.families.images import image_sized, refuse_ignored_size
from diffmeter.flops.cached import cached_params, cached_profile, remember_params, remember_profile
from diffmeter.flops.counter import KINDS, FlopCounts, call_signature, count_flops
from diffmeter.flops.schema import BYTES_PER_PARAM, CallProfile, ComponentProfile, Profile, weights_of
from diffmeter.parallel import parallel_map
from diffmeter.pipelines import build_component, component_class, count_params
from diffmeter.spec import ProfileSpec, image_sizes_of, sizes_text
from diffmeter.stages import VAE_ROLES


def profile(model: str, *, depth: int = 0, **settings) -> Profile:
    """Count MACs/FLOPs of ``model`` at the given settings (see ``ProfileSpec``; ``component_dtypes`` may be a
    dict: ``{"vae": "float32"}``; ``image_sizes`` "WxH" strings or (height, width) pairs, empty for none, left out
    for the catalog call's)."""
    if isinstance(settings.get("component_dtypes"), dict):
        settings["component_dtypes"] = tuple(sorted(settings["component_dtypes"].items()))
    if settings.get("image_sizes") is not None:
        settings["image_sizes"] = image_sizes_of(settings["image_sizes"])
    return profile_spec(ProfileSpec(model=model, **settings), depth=depth)


def profile_many(specs: list[ProfileSpec], depth: int = 0, jobs: int = 1, done=None) -> list[Profile]:
    """Profile several specs, in ``jobs`` worker processes (0: one per CPU); ``done(finished, total)``
    reports progress. Specs of one family go to the same worker, where the counts of the components
    they share (the same encoder, VAE or transformer at the same inputs) are reused."""
    if jobs == 1 or len(specs) < 2:
        return parallel_map(partial(profile_spec, depth=depth), specs, 1, done)
    for name in {c.class_name for spec in specs for c in entry_of(spec).components.values()}:
        component_class(name)  # imported once, before the workers fork
    groups: dict[str, list[int]] = {}
    for index, spec in enumerate(specs):
        groups.setdefault(entry_of(spec).family, []).append(index)
    batches = [[specs[index] for index in indices] for indices in groups.values()]
    counted = parallel_map(partial(_profile_all, depth=depth), batches, jobs, done, cost=_cost, size=len)
    profiles: list[Profile | None] = [None] * len(specs)
    for indices, found in zip(groups.values(), counted, strict=True):
        for index, profile_ in zip(indices, found, strict=True):
            profiles[index] = profile_
    return profiles


def _profile_all(specs: list[ProfileSpec], depth: int) -> list[Profile]:
    return [profile_spec(spec, depth) for spec in specs]


def _cost(specs: list[ProfileSpec]) -> float:
    """Videos take the longest to count (a causal VAE decodes frame by frame); then the groups with
    the most components to build and count, so no large group starts last."""
    entries = [entry_of(spec) for spec in specs]
    video = any(spec.num_frames or entry.defaults.num_frames for spec, entry in zip(specs, entries, strict=True))
    return (1000.0 if video else 0.0) + sum(len(entry.components) for entry in entries)


def profile_spec(spec: ProfileSpec, depth: int = 0) -> Profile:
    """The profile of ``spec``: from the disk cache when this exact question was answered before
    with the same configs, libraries and diffmeter code, else counted (and remembered)."""
    found = cached_profile(spec, depth)
    if found is None:
        found = _count(spec, depth)
        remember_profile(spec, depth, found)
    return found


def refusal(spec: ProfileSpec) -> str | None:
    """Why ``spec``'s pipeline refuses its settings (DiT at another size than its own, frames for an image
    model), or None; nothing is built or counted."""
    entry, family, spec = _with_defaults(spec)
    try:
        family.shapes(entry, spec)
    except DiffmeterError as error:
        return str(error)
    return None


def _with_defaults(spec: ProfileSpec):
    entry = entry_of(spec)
    family = get_family(entry.family)
    spec = spec.with_defaults(entry.defaults)
    if family.is_video and spec.num_frames is None:
        spec = replace(spec, num_frames=1)
    return entry, family, spec


def _count(spec: ProfileSpec, depth: int) -> Profile:
    asked = (spec.height, spec.width)
    entry, family, spec = _with_defaults(spec)
    sized = image_sized(family, entry, spec)  # no size asked: the input images set it, as the pipeline does
    requested = sized[:2] if sized else (spec.height, spec.width)
    shapes = family.shapes(entry, spec)
    if asked != (shapes.spec.height, shapes.spec.width):  # bench's own profile asks the size the pipeline makes
        refuse_ignored_size(family, entry, asked, spec)
    try:
        plan = family.plan(shapes)
    except (ValueError, ZeroDivisionError) as error:  # the pipeline's own sizing (Qwen's smart_resize: aspect < 200)
        images = f" from input images {sizes_text(image_sizes_of(spec.image_sizes))}" if spec.image_sizes else ""
        raise DiffmeterError(
            f"{entry.name} cannot make {spec.width}x{spec.height} (WxH){images}: its sizing raised "
            f"{type(error).__name__}: {' '.join(str(error).split())[:200]}; give sizes of a more usual aspect ratio"
        ) from None
    spec = shapes.spec  # binning or the pipeline's rounding may have changed the size
    resized = (spec.height, spec.width) != requested

    components = []
    adapter = lora.targets_of(family, entry, spec)  # a LoRA's weights are loaded on the main denoiser, fused or not
    # a row per component and role: the VAE that encodes an input image and decodes the output is two rows
    for name, role in dict.fromkeys((call.component, call.role) for call in plan):
        calls = [call for call in plan if (call.component, call.role) == (name, role)]
        try:
            bytes_per_param = BYTES_PER_PARAM[spec.dtype_of(name)]
            adapted = adapter if name == family.denoiser else ()
            components.append(
                _profile_component(
                    name, entry.components[name], calls, depth, bytes_per_param, adapted, bool(spec.lora_layers)
                )
            )
        except ValueError as error:  # the model's own refusal (a size beyond its position embeddings)
            raise DiffmeterError(
                f"{entry.name} cannot generate {spec.width}x{spec.height} (WxH): its {name} "
                f"({entry.components[name].class_name}) says: {str(error).strip().splitlines()[0]}"
            ) from None
        except RuntimeError as error:
            if "overflow" in str(error):
                raise DiffmeterError(
                    f"{spec.width}x{spec.height} (WxH) is too large to count: its tensors overflow PyTorch's size "
                    "limits"
                ) from None
            if "Kernel size can't be greater" not in str(error):  # a size or length the model's own code refuses
                tokens = f", --prompt-tokens {spec.prompt_tokens}" if spec.prompt_tokens else ""
                raise DiffmeterError(
                    f"{entry.name}'s {name} ({entry.components[name].class_name}) cannot run {spec.width}x"
                    f"{spec.height} (WxH){tokens}: its forward, run as the count runs it, raised RuntimeError: "
                    f"{' '.join(str(error).split())[:200]}; lower the size or the tokens"
                ) from None
            # diffusers' CogVideoXSafeConv3d cuts a tensor over 2 GiB along time into parts its kernel cannot span
            raise DiffmeterError(
                f"{entry.name}'s {name} ({entry.components[name].class_name}) cannot run {spec.batch_size} at once "
                f"at {spec.width}x{spec.height} (WxH): {str(error).strip().splitlines()[-1]}; the pipeline runs it "
                "only with vae.enable_slicing() (bench --vae-slicing), and profile counts the decode whole, even with "
                "--vae-slicing: lower --batch-size to count it here"
            ) from None

    denoiser_macs = sum(c.macs for c in components if c.role == DENOISER)
    denoiser_steps = schedule.denoiser_steps(entry, spec)  # what bench times as steps: one per scheduler.step
    total_macs = sum(c.macs for c in components)
    for component in components:
        component.share = component.macs / total_macs if total_macs else 0.0
    weights = weights_of(components)  # a component's weights once, whatever roles it plays
    params = sum(c.params for c in weights)
    return Profile(
        model=entry.id,
        name=entry.name,
        family=entry.family,
        origin=entry.origin,
        height=spec.height,
        width=spec.width,
        requested_height=requested[0] if resized else None,
        requested_width=requested[1] if resized else None,
        num_frames=spec.num_frames if family.is_video else None,
        input_images=shapes.images,
        requested_images=list(spec.image_sizes) if list(spec.image_sizes) != shapes.images else None,
        controlnet=(controlnet_of(entry) or {}).get("id"),
        steps=spec.steps,
        denoiser_steps=denoiser_steps,
        scheduler=schedule.described(entry, spec.steps, spec.scheduler),
        batch_size=spec.batch_size,
        guidance_scale=spec.guidance_scale,
        true_cfg_scale=spec.true_cfg_scale,
        cfg_trunc_ratio=spec.cfg_trunc_ratio,
        cfg=family.guided(shapes),
        dtype=spec.dtype,
        component_dtypes=dict(spec.component_dtypes),
        components=components,
        denoiser_macs_per_step=denoiser_macs // denoiser_steps,
        total_macs=total_macs,
        total_flops=2 * total_macs,
        params=params,
        param_bytes=sum(c.param_bytes for c in weights),
        notes=shapes.notes,
    )


def meta_inputs(call: Call) -> dict:
    """A call's inputs on the meta device (tensors created without a device land there too)."""
    with torch.device("meta"):
        return call.build(torch.device("meta"))


def count_call(module: torch.nn.Module, name: str, call: Call, inputs: dict, submodules: bool = True) -> FlopCounts:
    """Run one call of ``module`` on the meta device under the counter.

    Repeated blocks are reused except in VAEs, whose blocks carry state between calls
    (Wan's causal-convolution caches); a call may name submodules to replay instead."""
    handle = call.prepare(module) if call.prepare else None
    try:
        reuse = call.role not in VAE_ROLES
        with torch.no_grad(), count_flops({name: module}, reuse, submodules, call.replayed) as counts:
            getattr(module, call.method)(**inputs)
    finally:
        if handle is not None:
            handle.remove()
    return counts


#: config keys that record where and how a checkpoint was saved, never how it runs
CONFIG_METADATA = frozenset(
    (
        "_name_or_path",
        "_diffusers_version",
        "_class_name",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "_commit_hash",
    )
)


class MetaComponent:
    """A component built on meta at most once per process, with its counts memoized:
    catalog pipelines share encoders and VAEs, and sweeps repeat shapes."""

    _counts: dict = {}
    _params: dict = {}

    def __init__(self, component: ComponentEntry) -> None:
        self.component = component
        self.key = (component.class_name, json.dumps(component.config, sort_keys=True, default=str))
        self._module = None

    @property
    def module(self) -> torch.nn.Module:
        if self._module is None:
            self._module = build_component(self.component, "meta")
        return self._module

    @property
    def params(self) -> int:
        if self.key not in self._params:
            stored = cached_params(self.component)
            if stored is None:
                stored = count_params(self.module)
                remember_params(self.component, stored)
            self._params[self.key] = stored
        return self._params[self.key]

    def count(self, name: str, call: Call, submodules: bool) -> FlopCounts:
        inputs = meta_inputs(call)
        # keyed by structure and by the config's settings, not its metadata: a flag that changes the forward and no
        # module (Qwen-Image-Edit-2511's zero_cond_t) must not share 2509's counts
        prepared = getattr(call.prepare, "key", call.prepare is None)  # a LoRA's hooks: its targets
        signature = (call.method, call_signature(inputs), prepared, call.note, call.replayed)
        settings = json.dumps(
            {k: v for k, v in self.component.config.items() if k not in CONFIG_METADATA}, sort_keys=True, default=str
        )
        key = (type(self.module).__name__, repr(self.module), settings, name, signature, submodules)
        if key not in self._counts:
            self._counts[key] = count_call(self.module, name, call, inputs, submodules)
        return self._counts[key]


def _profile_component(
    name,
    component: ComponentEntry,
    calls: list[Call],
    depth: int,
    bytes_per_param: int,
    adapter: tuple = (),
    from_file: bool = False,
):
    """One component's row; ``adapter``'s (target, rank) pairs add a LoRA's parameters to its own (diffusers keeps
    them loaded when fused, to unfuse); ``from_file``: they are a LoRA file's layers, each of which must be one of
    the component's."""
    meta = MetaComponent(component)
    class_name = component.class_name
    invocations, kinds, modules = [], dict.fromkeys(KINDS, 0), {}
    for call in calls:
        if not call.count:  # loaded, never called at these settings (an expert given no step)
            invocations.append(CallProfile(batch=call.batch, count=0, macs_per_call=0, note=call.note))
            continue
        counts = meta.count(name, call, submodules=depth > 0)
        invocations.append(
            CallProfile(batch=call.batch, count=call.count, macs_per_call=counts.total // 2, note=call.note)
        )
        for kind, flops in counts.by_kind().items():
            kinds[kind] += flops // 2 * call.count
        if depth:
            for path, flops in counts.modules(depth).items():
                modules[path] = modules.get(path, 0) + flops // 2 * call.count
    macs = sum(i.macs_per_call * i.count for i in invocations)
    total_calls = sum(i.count for i in invocations)
    if from_file:
        lora.refuse_foreign_layers(meta.module, adapter, name)
    params = meta.params + (lora.adapter_params(meta.module, adapter) if adapter else 0)
    return ComponentProfile(
        name=name,
        role=calls[0].role,
        class_name=class_name,
        params=params,
        param_bytes=params * bytes_per_param,
        calls=total_calls,
        batch_per_call=calls[0].batch,
        macs_per_call=macs // total_calls if total_calls else 0,
        macs=macs,
        flops=2 * macs,
        macs_by_kind=kinds,
        invocations=invocations,
        modules_macs=dict(sorted(modules.items(), key=lambda kv: -kv[1])) if depth else None,
    )
