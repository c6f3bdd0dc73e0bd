"""diffmeter: measure diffusion-model inference.

>>> import diffmeter
>>> profile = diffmeter.profile("flux-dev", height=1024, width=1024)
>>> profile.denoiser_macs_per_step
"""

from diffmeter.errors import DiffmeterError
from diffmeter.quiet import quiet_import

with quiet_import():  # diffusers probes optional packages (torchao) at import
    from diffmeter.flops.profile import ComponentProfile, Profile, profile
    from diffmeter.spec import ProfileSpec

__all__ = ["ComponentProfile", "DiffmeterError", "Profile", "ProfileSpec", "profile"]
__version__ = "0.1.0"
