"""Put first on PYTHONPATH of the Ray processes diffmeter starts, only on machines where
``import amdsmi`` fails with something other than ImportError: amdsmi (a dependency of Zeus)
raises KeyError at import when AMD's libamd_smi.so is absent, i.e. on every machine without
ROCm, and Ray's GPU detection, which catches ImportError only, then fails in every process.
Marking the module absent makes Ray see no AMD GPU, which is the truth on such a machine."""

import sys

try:
    import amdsmi  # noqa: F401
except ImportError:
    pass
except Exception:
    sys.modules["amdsmi"] = None
