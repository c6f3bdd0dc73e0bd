"""Speed-ups by name: one module per technique, each a config plus ``supports`` and ``apply``.

Importing this package registers every technique (see ``registry.REGISTRY``).
"""

from diffmeter.optimize import (  # noqa: F401  (registration)
    attention,
    cache_dit,
    compile,
    deep_cache,
    faster_cache,
    first_block_cache,
    fp8_text_encoder,
    fuse_qkv,
    mag_cache,
    offload,
    onnxruntime,
    pyramid_attention_broadcast,
    quantize,
    quantize_autoround,
    quantize_bfl,
    quantize_bnb,
    quantize_gguf,
    quantize_modelopt,
    quantize_nunchaku,
    quantize_quanto,
    quantize_sdnq,
    quantize_torchao,
    scheduler,
    sdpa_kernel,
    sea_cache,
    taylorseer_cache,
    tensorrt,
    tf32,
    vae,
)
from diffmeter.optimize.base import Optimization, OptimizationSpec, Target
from diffmeter.optimize.registry import REGISTRY, build, check

__all__ = ["REGISTRY", "Optimization", "OptimizationSpec", "Target", "build", "check"]
