"""ONNX Runtime as the denoiser's runtime (and optionally the VAE decoder's), inside the same
diffusers pipeline.

The module's ``forward`` (the VAE's ``decode``) is replaced in place by a function that runs an
ONNX Runtime session, so the pipeline still drives the loop: the stage timer's hooks, the
scheduler, CFG and the quality comparison are those of the PyTorch run. The graph is exported
with PyTorch's ONNX exporter (``torch.onnx.export``, dynamo) in the first call that meets a
given set of input shapes, like a compiler, so export time lands in the cold call (the run's
cold-start overhead). Tensor arguments become the graph's inputs; everything else (flags,
``return_dict``, ``None``) is fixed in the graph and part of its key.

Exported files are cached under diffmeter's cache folder (``cache.directory()/onnx``), keyed by
the model, the component's class, a hash of its weights (random weights differ by seed), the
input shapes and dtypes, and the torch and onnx versions; a second run with the same key loads
the file instead of exporting. With the cache off (``DIFFMETER_CACHE_DIR=off``) files go to a
temporary folder removed after the run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch.utils import _pytree as pytree

from diffmeter import cache
from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.optimize.onnxruntime_session import PROVIDERS, execution_providers, started_session
from diffmeter.optimize.registry import register

log = logging.getLogger(__name__)

#: what the exported graph needs, and the extra that installs it
PACKAGES = ("onnxruntime", "onnx", "onnxscript")
#: techniques whose work lives in hooks or module state the exported graph never runs
BYPASSED_KINDS = ("cache", "attention", "quantization")
#: denoisers whose forward reads tensor values into Python (the exporter cannot trace it)
UNEXPORTABLE = {
    "Lumina2Transformer2DModel": "its forward reads the attention mask's lengths into Python (.tolist())",
    # the exporter: "No ONNX function found for aten.unsqueeze ... complex-valued input" (torch 2.13)
    "LuminaNextDiT2DModel": "it takes its rotary frequencies as complex64 tensors, which the ONNX exporter cannot "
    "translate",
    # held by tests/test_onnxruntime.py: the day the exporter gets it right, that test fails
    "PixArtTransformer2DModel": (
        "its output's squeeze(1) of a dimension that is not 1 (a no-op in PyTorch) becomes an ONNX Squeeze "
        "that ONNX Runtime refuses to load"
    ),
}
#: every dtype a tensor can cross into ONNX Runtime with (numpy's name); bfloat16 has none (refused in ``supports``)
_NUMPY = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",  # LTX-Video's attention mask
}
#: ONNX Runtime's output type names and the torch dtype each comes back as
_OUTPUTS = {
    f"tensor({'float' if name == 'float32' else 'double' if name == 'float64' else name})": dtype
    for dtype, name in _NUMPY.items()
}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: ONNX Runtime execution provider: cpu, cuda or tensorrt (the last two need onnxruntime-gpu and CUDA)
    provider: Literal["cpu", "cuda", "tensorrt"] = "cpu"
    #: also run the VAE decoder's decode in ONNX Runtime
    decoder: bool = False
    #: ONNX opset of the export (None: the exporter's default)
    opset: int | None = None
    #: once exported, move the PyTorch weights of the exported components to the meta device so that
    #: only ONNX Runtime holds them (a deployment's memory); a later new input shape cannot export again
    release_weights: bool = False


@register
class OnnxRuntime(Optimization):
    name = "onnxruntime"
    kind = "compile"
    lossless = True
    exclusive = True
    summary = "export the denoiser (optionally the VAE decoder) to ONNX and run it in ONNX Runtime"
    package = ("onnxruntime", "onnx")
    Config = Config

    @classmethod
    def missing_package(cls) -> str | None:
        missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
        if missing:
            return f"{cls.name} needs the {', '.join(missing)} package(s): pip install 'diffmeter[onnx]'"
        return None

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(Config(provider=provider)) for provider in PROVIDERS]

    def supports(self, target: Target) -> str | None:
        provider = self.config.provider
        if provider == "cpu" and target.device.type != "cpu":
            return f"provider=cpu runs on the host; this run is on {target.device} (use provider=cuda or tensorrt)"
        if provider != "cpu" and target.device.type != "cuda":
            return f"provider={provider} needs a CUDA device; this run is on {target.device.type} (use provider=cpu)"
        if target.dtype == "bfloat16":
            return "bfloat16 tensors cannot cross into ONNX Runtime through numpy; use --dtype fp16 or fp32"
        reason = UNEXPORTABLE.get(target.denoiser_class.__name__)
        if reason:
            return f"{target.denoiser_class.__name__} cannot be exported to ONNX: {reason}"
        if provider != "cpu" and importlib.util.find_spec("onnxruntime") is not None:
            import onnxruntime

            if PROVIDERS[provider] not in onnxruntime.get_available_providers():
                return (
                    f"this onnxruntime has no {PROVIDERS[provider]} (it has "
                    f"{', '.join(onnxruntime.get_available_providers())}); install onnxruntime-gpu"
                )
        return None

    def note(self, target: Target) -> str | None:
        if self.config.provider == "cpu":
            return None
        engines = ", TensorRT engines" if self.config.provider == "tensorrt" else ""
        kept = "" if self.config.release_weights else "; PyTorch's copy of the exported weights stays resident too"
        return (
            f"peak memory leaves out ONNX Runtime's own GPU memory (its CUDA arena{engines}): PyTorch's allocator, "
            f"which the figures read, does not see it{kept}"
        )

    def clashes(self, others: list[Optimization]) -> str | None:
        for other in others:
            bypassed = other.name in ("vae-slicing", "vae-tiling") and self.config.decoder
            if bypassed or other.kind in BYPASSED_KINDS or other.name in ("sdpa-kernel", "offload"):
                return (
                    f"onnxruntime and {other.name} do not combine: the exported graph runs in ONNX Runtime, "
                    f"which never runs what {other.name} installs on the PyTorch module"
                )
        return None

    def apply(self, pipe, target: Target) -> None:
        import onnxruntime

        # the environment logger's warnings reach the terminal otherwise (onnxruntime-gpu 1.31.1 printed "No
        # registered plugin EP device found for 'CUDAExecutionProvider'" for every CUDA session on an H200)
        onnxruntime.set_default_logger_severity(3)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initializers are not the user's concern
        options.intra_op_num_threads = torch.get_num_threads()  # the threads PyTorch would have used
        self._folder, self._temporary = _export_folder()
        self._replaced: list[tuple[object, str]] = []
        self.export_s = 0.0
        for module in denoisers(pipe, target):
            runner = _OrtModule(self, module, module.forward, target, options)
            module.forward = runner
            self._replaced.append((module, "forward"))
        if self.config.decoder:
            vae = getattr(pipe, target.family.decoder)
            method = type(vae).decode
            plain = getattr(method, "__wrapped__", method).__get__(vae)  # no offload hook: the session holds weights
            runner = _OrtModule(self, vae, plain, target, options, decode=True)
            vae.decode = runner
            self._replaced.append((vae, "decode"))

    def restore(self, pipe, target: Target) -> None:
        for owner, name in getattr(self, "_replaced", []):
            if name in vars(owner):
                delattr(owner, name)
        self._replaced = []
        if getattr(self, "_temporary", False):
            shutil.rmtree(self._folder, ignore_errors=True)


def _export_folder() -> tuple[Path, bool]:
    """Where exported graphs are kept: the cache (``onnx/``) or, with the cache off, a temporary folder."""
    root = cache.directory()
    if root is not None:
        try:
            folder = root / "onnx"
            folder.mkdir(parents=True, exist_ok=True)
            return folder, False
        except OSError:
            pass  # best-effort, as every cache of diffmeter's
    return Path(tempfile.mkdtemp(prefix="diffmeter-onnx-")), True


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of every parameter and buffer (names, shapes, dtypes, bytes): what the exported file holds."""
    digest = hashlib.sha256()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        data = tensor.detach().cpu().contiguous()
        digest.update(data.view(torch.uint8).numpy() if data.numel() else b"")
    return digest.hexdigest()


class _Flat(torch.nn.Module):
    """The component's call with its tensor arguments as positional inputs and its outputs flattened."""

    def __init__(self, method, leaves: list, spec, tensor_at: list[int]) -> None:
        super().__init__()
        self.method, self.leaves, self.spec, self.tensor_at = method, leaves, spec, tensor_at

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for index, tensor in zip(self.tensor_at, tensors, strict=True):
            leaves[index] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return tuple(pytree.tree_leaves(self.method(*args, **kwargs)))


class _OrtModule:
    """Stands in for the component's method: one ONNX Runtime session per set of input shapes."""

    def __init__(self, technique: OnnxRuntime, module, method, target: Target, options, decode=False) -> None:
        self.technique, self.module, self.method, self.target = technique, module, method, target
        self.options, self.decode = options, decode
        self.sessions: dict[str, tuple] = {}
        self._weights: str | None = None
        self.released = False

    def __call__(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        key = self._key(leaves, spec, tensor_at)
        if key not in self.sessions:
            self.sessions[key] = self._session(key, leaves, spec, tensor_at)
        session, out_spec = self.sessions[key]
        tensors = [leaves[i] for i in tensor_at]
        outputs = self._run(session, tensors)
        return pytree.tree_unflatten(outputs, out_spec)

    def _key(self, leaves, spec, tensor_at) -> str:
        fixed = [
            f"tensor{tuple(leaf.shape)}:{leaf.dtype}" if i in tensor_at else _constant(leaf)
            for i, leaf in enumerate(leaves)
        ]
        return json.dumps([str(spec), fixed])

    def _session(self, key: str, leaves, spec, tensor_at):
        import onnx
        import onnxruntime

        if self.released:
            from diffmeter.errors import DiffmeterError

            raise DiffmeterError(
                f"onnxruntime release_weights=true: a new input shape of {type(self.module).__name__} needs its "
                "PyTorch weights to export again; drop release_weights"
            )
        if self._weights is None:
            self._weights = weights_digest(self.module)
        target = self.target
        identity = {
            "model": target.entry.id,
            "component": type(self.module).__name__,
            "method": "decode" if self.decode else "forward",
            "weights": self._weights,
            "call": key,
            "opset": self.technique.config.opset,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
        }
        name = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
        path = self.technique._folder / name / "model.onnx"
        tensors = tuple(leaves[i] for i in tensor_at)
        flat = _Flat(self.method, leaves, spec, tensor_at)
        with torch.no_grad():
            example = self.method(*pytree.tree_unflatten(leaves, spec)[0], **pytree.tree_unflatten(leaves, spec)[1])
        out_spec = pytree.tree_flatten(example)[1]
        if not path.is_file():
            start = time.perf_counter()
            _export(flat, tensors, path, self.technique.config.opset)
            self.technique.export_s += time.perf_counter() - start
            log.info("exported %s to %s in %.2f s", identity["component"], path, time.perf_counter() - start)
        if self.technique.config.release_weights and not self.released:
            self.module.to("meta")  # before the session loads its copy: the two never coexist
            self.released = True
        device = self.target.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # inside the run's device scope: its own
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        providers = execution_providers(self.technique.config.provider, device, self.target.dtype, stream)
        return started_session(onnxruntime, path, self.options, providers), out_spec

    def _run(self, session, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        names = [i.name for i in session.get_inputs()]
        if self.technique.config.provider == "cpu":
            feeds = {name: tensor.detach().contiguous().numpy() for name, tensor in zip(names, tensors, strict=True)}
            return [torch.from_numpy(array) for array in session.run(None, feeds)]
        return _run_on_cuda(session, names, tensors)


def _constant(leaf) -> str:
    """A non-tensor argument as part of the key; a generator (which the VAE's decode accepts and
    AutoencoderKL ignores) is one per image and call, so only its presence counts."""
    return "generator" if isinstance(leaf, torch.Generator) else repr(leaf)


def _export(flat: torch.nn.Module, tensors: tuple, path: Path, opset: int | None) -> None:
    """PyTorch's ONNX exporter (torch.export + onnxscript), weights in an external file beside the graph."""
    staging = path.parent.with_name(path.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with torch.no_grad():
        try:
            program = torch.onnx.export(flat, tensors, dynamo=True, opset_version=opset, verbose=False)
        except Exception as error:  # the exporter's own errors: one line, the run stored as failed
            from diffmeter.errors import DiffmeterError

            shutil.rmtree(staging, ignore_errors=True)
            said = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
            raise DiffmeterError(f"onnxruntime: the ONNX exporter could not export this model: {said}") from None
    program.save(str(staging / path.name), external_data=True)
    staging.rename(path.parent)  # a half-written export never has the final name


def _run_on_cuda(session, names: list[str], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Inputs and outputs bound to CUDA memory (ONNX Runtime's IOBinding): nothing crosses to the host. The
    bound tensors (contiguous copies included) live until the run returns: the binding holds bare pointers, and
    a freed copy's memory could be handed to another tensor by PyTorch's allocator before ONNX Runtime reads it.
    PyTorch's stream is synchronized before the run: ONNX Runtime's issues #26609 and #32673 are wrong TensorRT
    results from inputs read before the kernels making them had finished."""
    import numpy

    bound = [tensor.contiguous() for tensor in tensors]
    torch.cuda.current_stream(bound[0].device).synchronize()
    binding = session.io_binding()
    for name, tensor in zip(names, bound, strict=True):
        binding.bind_input(
            name,
            "cuda",
            tensor.device.index or 0,
            numpy.dtype(_NUMPY[tensor.dtype]),
            tuple(tensor.shape),
            tensor.data_ptr(),
        )
    device = tensors[0].device
    outputs = []
    for output in session.get_outputs():
        dtype = _OUTPUTS[output.type]
        result = torch.empty(tuple(output.shape), dtype=dtype, device=device)
        binding.bind_output(
            output.name, "cuda", device.index or 0, numpy.dtype(_NUMPY[dtype]), tuple(result.shape), result.data_ptr()
        )
        outputs.append(result)
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    del bound  # only now: ONNX Runtime has read them
    return outputs
