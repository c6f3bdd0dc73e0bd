"""An AutoRound folder written from a tiny component as auto-round 0.16.1 exports one (export/export_to_autoround/
export.py ``save_quantized_as_autoround``): the linear layers of the blocks auto-round finds (``get_block_names``)
packed by its own ``pack_layer`` in its default symmetric format (``auto_round:auto_gptq``), each group's scale
rounded to nearest (auto-round's iters=0, no calibration); a layer whose features do not split into 32s and groups
is named in ``extra_config`` at 16 bits, as its export names a layer it left whole."""

from __future__ import annotations

import json
import os

import torch


def write_autoround(module: torch.nn.Module, folder, bits: int, group_size: int = 32) -> dict:
    """Save ``module`` quantized to ``folder``; returns its ``quantization_config``."""
    from auto_round.export.export_to_autoround.export import pack_layer
    from auto_round.utils import get_block_names

    blocks = [os.path.commonprefix(group).rstrip(".") for group in get_block_names(module)]
    config = {
        "bits": bits,
        "group_size": group_size,
        "sym": True,
        "data_type": "int",
        "act_bits": 16,
        "quant_method": "auto-round",
        "packing_format": "auto_round:auto_gptq",
        "block_name_to_quantize": ",".join(dict.fromkeys(blocks)),
        "extra_config": {},
    }
    for name, layer in list(module.named_modules()):
        if type(layer) is not torch.nn.Linear or not any(name.startswith(f"{block}.") for block in blocks):
            continue
        if layer.in_features % group_size or layer.in_features % 32 or layer.out_features % 32:
            config["extra_config"][name] = {"bits": 16}
            continue
        weight = layer.weight.detach().float()
        scale = weight.reshape(weight.shape[0], -1, group_size).abs().amax(-1) / 2 ** (bits - 1)
        layer.bits, layer.group_size, layer.sym, layer.act_bits, layer.data_type = bits, group_size, True, 16, "int"
        layer.scale, layer.zp = scale.clamp(min=1e-8), torch.full_like(scale, 2 ** (bits - 1))
        pack_layer(name, module, "auto_round:auto_gptq")
    module.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    saved["quantization_config"] = config
    (folder / "config.json").write_text(json.dumps(saved))
    return config
