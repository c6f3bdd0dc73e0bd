"""A GGUF file of a model's weights, written with the ``gguf`` package as llama.cpp's tools lay it out (tensors
under the model's own state-dict names, diffusers' format): 2-D weights whose rows split into whole blocks in the
asked type, the rest (biases, norms, convolutions) in F32. The tests load it through ``--weights FILE``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def write_gguf(module: torch.nn.Module, path: Path, kind: str = "Q8_0") -> dict[str, str]:
    """``module``'s state dict as ``path`` in ``kind`` (a type ``gguf.quants.quantize`` writes: Q8_0, Q4_0, Q4_1,
    Q5_0, Q5_1, BF16; or a K-quant, which it cannot write: blocks of seeded random bytes, the layout without the
    values, for tests that load a file and never run it); returns each tensor's stored type."""
    import gguf

    quant = gguf.GGMLQuantizationType[kind]
    block, _ = gguf.GGML_QUANT_SIZES[quant]
    writer = gguf.GGUFWriter(str(path), arch="diffmeter-test")
    stored = {}
    for name, tensor in module.state_dict().items():
        data = tensor.detach().float().cpu().numpy()
        if data.ndim == 2 and data.shape[-1] % block == 0 and kind.endswith("_K"):
            size = gguf.GGML_QUANT_SIZES[quant][1] * data.shape[-1] // block
            blocks = np.random.default_rng(0).integers(0, 256, (data.shape[0], size), dtype=np.uint8)
            writer.add_tensor(name, blocks, raw_dtype=quant)
            stored[name] = kind
        elif data.ndim == 2 and data.shape[-1] % block == 0:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
            stored[name] = kind
        else:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
            stored[name] = "F32"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
