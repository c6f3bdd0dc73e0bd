"""diffmeter: measure diffusion-model inference.

>>> import diffmeter
>>> profile = diffmeter.profile("flux-dev", height=1024, width=1024)
>>> profile.denoiser_macs_per_step

The heavy parts (torch, diffusers) are imported on first use, so the command line starts fast.
"""

from diffmeter.errors import DiffmeterError

__version__ = "0.1.0"
__all__ = ["ComponentProfile", "DiffmeterError", "Profile", "ProfileSpec", "profile"]

#: public name -> the module that defines it
_LAZY = {
    "ComponentProfile": "diffmeter.flops.profile",
    "Profile": "diffmeter.flops.profile",
    "profile": "diffmeter.flops.profile",
    "ProfileSpec": "diffmeter.spec",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'diffmeter' has no attribute '{name}'")
    import importlib

    from diffmeter.quiet import quiet_import

    with quiet_import():  # diffusers probes optional packages (torchao) at import
        value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
