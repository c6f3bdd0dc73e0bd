"""A disk cache of what diffmeter derives from configs alone (profiles, parameter counts), so a
repeated command answers without loading torch or diffusers.

An entry is keyed by everything the answer depends on: the configs and settings asked about,
the installed torch, diffusers and transformers versions, and a hash of diffmeter's own files (code and data).
Any change to any of them is a miss, never a stale answer
(the time calibration and its fits aside: no cached answer reads them). The cache lives in
``$DIFFMETER_CACHE_DIR`` (``off`` disables it), else ``$XDG_CACHE_HOME/diffmeter`` or
``~/.cache/diffmeter``; it is best-effort: a cache that cannot be read or written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path

#: the libraries whose code decides what a count comes to
LIBRARIES = ("torch", "diffusers", "transformers")
#: package files no cached answer reads: the time calibration and the code that fits it (times are computed from
#: the cached operator work on every call, ``predict/roofline.py``; no other module imports the fits: a test holds
#: it), so a refit keeps every fake-tensor count
UNCACHED = (
    "predict/data/efficiency.json",
    "predict/data/offload_rates.json",  # offloading's fitted link shares, read after the cache (offload_time.py)
    "predict/fit_published.py",
    "predict/fit_holdout.py",
    "predict/fit_energy.py",
)
#: the expected time's own modules and data: no operator count or memory prediction imports or reads them (a test
#: walks the imports), so a change to how a time is computed keeps every cached count (``COUNT_KINDS``); answers
#: that hold a time (a fit's ranked formats, a quality row) keep them in their key
TIME_ONLY = (
    "predict/attention_kernels.py",
    "predict/bench_prediction.py",
    "predict/cache_time.py",
    "predict/cache_published.py",
    "predict/cache_exact.py",
    "predict/cache_threshold.py",
    "predict/calibration.py",
    "predict/data/cache_skips.json",
    "predict/data/parallel_communication.json",
    "predict/data/quantized_held_out.json",
    "predict/energy.py",
    "predict/host_time.py",
    "predict/offload_time.py",
    "predict/parallel.py",
    "predict/power_limit.py",
    "predict/data/gpu_dies.json",
    "predict/quantized_modelled.py",
    "predict/quantized_time.py",
    "predict/quantized_work.py",
    "predict/roofline.py",
    "predict/timed_techniques.py",
)
#: the layers above the counts (each a folder of the package): the techniques, measuring, runs, several GPUs, sweeps,
#: reports and the CLI read counts and never make one (the same test walks the imports), so editing them keeps every
#: cached count
ABOVE_COUNTS = ("optimize/", "measure/", "runs/", "distributed/", "sweep/", "report/", "cli/")
#: the cached answers that are operator counts and memory predictions, never a time
COUNT_KINDS = ("memory", "operators")


def directory() -> Path | None:
    setting = os.environ.get("DIFFMETER_CACHE_DIR")
    if setting == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return home()


def home() -> Path:
    """diffmeter's folder under the user's cache home (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diffmeter"


def fingerprint(counts_only: bool = False) -> str:
    """The library versions and a hash of every file of diffmeter itself: its code and the data its answers read
    (the catalog, the GPU figures, the memory checks; not ``UNCACHED``, nor ``TIME_ONLY`` for ``counts_only``)."""
    return fingerprints()[counts_only]


@cache
def fingerprints() -> tuple[str, str]:
    """``fingerprint``'s two keys, every answer's and the counts', from one reading of the package's files."""
    versions = hashlib.sha256()
    for library in LIBRARIES:
        try:
            versions.update(f"{library}={metadata.version(library)};".encode())
        except metadata.PackageNotFoundError:
            versions.update(f"{library}=none;".encode())
    found = []
    for files in package_digests(Path(__file__).parent, UNCACHED, UNCACHED + TIME_ONLY + ABOVE_COUNTS):
        digest = versions.copy()
        digest.update(files.encode())
        found.append(digest.hexdigest())
    return found[0], found[1]


def package_digest(package: Path, left_out: tuple[str, ...] = UNCACHED) -> str:
    """A hash of the package's files, names and contents, ``left_out`` left out."""
    return package_digests(package, left_out)[0]


def package_digests(package: Path, *left_outs: tuple[str, ...]) -> list[str]:
    """``package_digest`` for each of ``left_outs`` (files, and folders ending in "/"), every file read once."""
    digests = [hashlib.sha256() for _ in left_outs]
    for source in package_files(package):
        content = (package / source).read_bytes()
        for digest, left_out in zip(digests, left_outs, strict=True):
            if not any(source == out or (out.endswith("/") and source.startswith(out)) for out in left_out):
                digest.update(source.encode())
                digest.update(content)
    return [digest.hexdigest() for digest in digests]


def package_files(package: Path) -> list[str]:
    """Every file of the package by its relative path, sorted; compiled bytecode aside."""
    found = (path for path in package.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    return sorted(str(path.relative_to(package)) for path in found)


def _path(kind: str, payload) -> Path | None:
    root = directory()
    if root is None:
        return None
    text = json.dumps({"payload": payload, "code": fingerprint(kind in COUNT_KINDS)}, sort_keys=True, default=str)
    return root / kind / f"{hashlib.sha256(text.encode()).hexdigest()}.json"


def load(kind: str, payload):
    """The stored answer for ``payload``, or None."""
    path = _path(kind, payload)
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None


def store(kind: str, payload, answer) -> None:
    """Remember ``answer`` for ``payload`` (atomically; silently skipped when the disk says no)."""
    path = _path(kind, payload)
    if path is None:
        return
    write_json(path, answer)


def write_json(path: Path, data, indent: int | None = None) -> bool:
    """Write ``data`` as JSON at ``path`` atomically (a temporary file renamed into place); False, and nothing
    half-written, when the disk says no."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=indent, sort_keys=indent is not None)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return False
    return True
