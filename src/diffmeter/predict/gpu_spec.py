"""A GPU given by its figures (``--gpu-spec``), and the device of ``--gpu`` or ``--gpu-spec``."""

from __future__ import annotations

import json
import math
import re

from diffmeter.errors import DiffmeterError
from diffmeter.predict.devices import ARCHITECTURES, Device, named_gpu

#: one figure of a ``--gpu-spec`` text and its unit
SPEC_PART = re.compile(r"^\s*([\d.]+)\s*(gb|gib|tflops|tb/s|gb/s|w)\s*$", re.IGNORECASE)

#: the keys a JSON ``--gpu-spec`` takes
SPEC_KEYS = ("memory_gib", "memory_gb", "tflops", "bandwidth_gb_s", "tdp_w", "architecture", "host_link_gb_s")


def spec_gpu(text: str) -> Device:
    """A GPU from "80GB,989TFLOPS,3.35TB/s,700W,arch=hopper,link=64GB/s" (any order, any subset; GB read as GiB,
    as on datasheets; the architecture picks the expected range's calibration, the TDP the energy's, the host link's
    rate per direction times offloading) or a JSON object with ``memory_gib`` (or ``memory_gb``, read as GiB),
    ``tflops``, ``bandwidth_gb_s``, ``tdp_w``, ``architecture`` and ``host_link_gb_s``."""
    usage = (
        '--gpu-spec takes "80GB,989TFLOPS,3.35TB/s,700W,arch=hopper,link=64GB/s" (GB read as GiB) or JSON '
        '{"memory_gib": 80, "tflops": 989, "bandwidth_gb_s": 3350, "tdp_w": 700, "architecture": "hopper", '
        '"host_link_gb_s": 64}'
    )
    if text.strip().startswith("{"):
        try:
            data = json.loads(text)
            if unknown := sorted(set(data) - set(SPEC_KEYS)):
                raise DiffmeterError(f"{usage}; {', '.join(map(repr, unknown))}: not one of its keys")
            memory = data.get("memory_gib", data.get("memory_gb"))
            tflops, bandwidth = data.get("tflops"), data.get("bandwidth_gb_s")
            tdp, architecture, link = data.get("tdp_w"), data.get("architecture"), data.get("host_link_gb_s")
        except (ValueError, AttributeError):
            raise DiffmeterError(f"{usage}; got '{text}'") from None
    else:
        memory = tflops = bandwidth = tdp = architecture = link = None
        for part in text.split(","):
            key, _, value = part.strip().lower().rpartition("=")  # "arch=hopper", "link=64GB/s", or a bare figure
            match = SPEC_PART.match(value)
            unit = match.group(2).lower() if match else None
            rate = float(match.group(1)) * (1000 if unit == "tb/s" else 1) if match else None  # GB/s
            if key == "arch":
                architecture = value.strip()
            elif match is None or key not in ("", "link") or (key == "link" and unit not in ("gb/s", "tb/s")):
                raise DiffmeterError(f"{usage}; '{part.strip()}' is none of these")
            elif key == "link":
                link = rate
            elif unit in ("gb", "gib"):
                memory = float(match.group(1))
            elif unit == "tflops":
                tflops = float(match.group(1))
            elif unit == "w":
                tdp = float(match.group(1))
            else:
                bandwidth = rate
    if memory is None and tflops is None and bandwidth is None:
        raise DiffmeterError(f"{usage}; got '{text}'")
    figures = {"memory": memory, "TFLOPS": tflops, "bandwidth": bandwidth, "TDP": tdp, "host link": link}
    for label, value in figures.items():  # 0GB read as no memory at all, a JSON string failed deep inside
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and 0 < value < math.inf):
            raise DiffmeterError(f"--gpu-spec's {label} must be a positive number; got {value!r}")
    if architecture is not None and architecture not in ARCHITECTURES:
        raise DiffmeterError(f"--gpu-spec's arch= takes {'|'.join(ARCHITECTURES)}; got '{architecture}'")
    return Device(
        name="--gpu-spec",
        memory_bytes=int(float(memory) * 2**30) if memory else None,
        bandwidth_bytes_per_s=float(bandwidth) * 1e9 if bandwidth else None,
        tflops={"any": float(tflops)} if tflops else {},
        source=f"--gpu-spec {text}" + ("; memory read as GiB" if memory else ""),
        architecture=architecture,
        tdp_w=float(tdp) if tdp else None,
        host_link=f"{link:g} GB/s host link" if link else None,
        host_link_bytes_per_s=float(link) * 1e9 if link else None,
    )


def chosen_gpu(gpu: str | None, gpu_spec: str | None, dtypes: tuple[str, ...] = ()) -> Device | None:
    """The device of ``--gpu`` or ``--gpu-spec``; ``dtypes``: the ones whose peaks a CPU must measure."""
    if gpu and gpu_spec:
        raise DiffmeterError("--gpu names a GPU of the table and --gpu-spec gives figures: pick one")
    if gpu:
        return named_gpu(gpu, dtypes)
    return spec_gpu(gpu_spec) if gpu_spec else None
