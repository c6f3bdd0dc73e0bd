"""A LoRA file's adapted layers and ranks, read from its safetensors header alone (no weight is loaded).

diffusers saves a pipeline's LoRA (``save_lora_weights``; the format ``load_lora_weights`` reads without
converting) with one ``lora_A`` matrix of shape (rank, in features) per adapted layer, keyed
``<component>.<layer path>.lora_A.weight``: the layer path and its rank are all the count needs."""

from __future__ import annotations

from pathlib import Path

from diffmeter.errors import DiffmeterError

DOWN = ".lora_A.weight"


def lora_layers(path: str | Path, denoiser: str) -> tuple[tuple[tuple[str, int], ...], list[str]]:
    """(layer path inside the denoiser, rank) per adapted layer, sorted, and what the file adapts elsewhere
    (text encoders: not counted). One clear line for a file that is missing, unreadable or in another format."""
    from safetensors import SafetensorError, safe_open

    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "pytorch_lora_weights.safetensors"
    if not path.is_file():
        raise DiffmeterError(f"--lora {path}: no such file (a diffusers LoRA folder or its .safetensors file)")
    try:
        with safe_open(str(path), "pt") as opened:
            keys = list(opened.keys())
            shapes = {key: opened.get_slice(key).get_shape() for key in keys if key.endswith(DOWN)}
    except (SafetensorError, OSError) as error:
        raise DiffmeterError(f"--lora {path}: not a safetensors file ({error})") from None
    if any("lora_magnitude_vector" in key for key in keys):
        raise DiffmeterError(
            f"--lora {path}: a DoRA (lora_magnitude_vector), whose extra per-call work diffmeter does not count; "
            "pass --lora-rank R for its plain LoRA part"
        )
    layers, elsewhere = {}, set()
    for key, shape in shapes.items():
        component, _, layer = key[: -len(DOWN)].partition(".")
        if component == denoiser:
            layers[layer] = int(shape[0])
        else:
            elsewhere.add(component)
    if not layers:
        found = ", ".join(sorted(elsewhere)) or "no '<component>.<layer>.lora_A.weight' key"
        raise DiffmeterError(
            f"--lora {path}: no {denoiser} layer in diffusers' LoRA format (found: {found}); convert it with the "
            "pipeline's load_lora_weights and save_lora_weights"
        )
    notes = [f"the LoRA file also adapts {name}: not counted" for name in sorted(elsewhere)]
    return tuple(sorted(layers.items())), notes


def lora_fields(
    model: str, rank: int | None, targets: str | None, path: str | None, fused: bool
) -> tuple[dict, list[str]]:
    """``ProfileSpec`` fields for the LoRA options (``--lora-rank``, ``--lora-targets a,b``, ``--lora FILE``,
    ``--fuse-lora``) and the notes reading a file gave."""
    if path is not None and (rank is not None or targets):
        raise DiffmeterError("--lora FILE gives its own layers and ranks: drop --lora-rank and --lora-targets")
    fields: dict = {"lora_rank": rank, "fuse_lora": fused}
    if targets:
        fields["lora_targets"] = tuple(name.strip() for name in targets.split(",") if name.strip())
    if path is None:
        return fields, []
    from diffmeter.catalog import resolve
    from diffmeter.families import get_family

    layers, notes = lora_layers(path, get_family(resolve(model).family).denoiser)
    return {**fields, "lora_layers": layers}, notes
