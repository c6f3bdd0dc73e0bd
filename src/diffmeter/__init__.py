"""diffmeter: measure diffusion-model inference.

>>> import diffmeter
>>> profile = diffmeter.profile("flux-dev", height=1024, width=1024)   # compute, from configs alone
>>> profile.denoiser_macs_per_step
>>> result = diffmeter.bench("tiny-sd", steps=4, optimizations=["fuse-qkv"])   # a measured run
>>> result.summary.latency_s.median, result.folder
>>> table = diffmeter.load_results("results")   # every stored run: a pandas DataFrame, a row each

The heavy parts (torch, diffusers) are imported on first use, so the command line starts fast.
"""

import os

from diffmeter.errors import DiffmeterError
from diffmeter.quiet import QUIET_VARIABLE, keep_library_warnings_off_the_terminal

if os.environ.get(QUIET_VARIABLE) == "1":  # a process the command line started (a rank, a sweep cell)
    keep_library_warnings_off_the_terminal()

__version__ = "0.1.0"
__all__ = [
    "BenchResult",
    "BenchSpec",
    "ComponentProfile",
    "DiffmeterError",
    "Profile",
    "ProfileSpec",
    "bench",
    "load_results",
    "profile",
]

#: public name -> the module that defines it
_LAZY = {
    "ComponentProfile": "diffmeter.flops.schema",
    "Profile": "diffmeter.flops.schema",
    "profile": "diffmeter.flops.profile",
    "ProfileSpec": "diffmeter.spec",
    "bench": "diffmeter.execute:measure",
    "BenchResult": "diffmeter.runs.results",
    "BenchSpec": "diffmeter.runs.spec",
    "load_results": "diffmeter.runs.collect",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'diffmeter' has no attribute '{name}'")
    import importlib

    from diffmeter.quiet import quiet_import

    module, _, attribute = _LAZY[name].partition(":")
    with quiet_import():  # diffusers probes optional packages (torchao) at import
        value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value
