"""ONNX Runtime's execution providers for a run's device, and a session started on the one asked for."""

from __future__ import annotations

from pathlib import Path

import torch

from diffmeter.errors import DiffmeterError

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def execution_providers(provider: str, device: torch.device, dtype: str, stream: int | None) -> list:
    """ONNX Runtime's providers with their options for a run on ``device`` (ONNX Runtime docs, "CUDA Execution
    Provider" and "TensorRT Execution Provider", configuration options): ``device_id`` the run's GPU (without it
    every session runs on GPU 0, whatever ``cuda:N`` the run is on); ``user_compute_stream`` PyTorch's current
    stream, so ONNX Runtime computes after the kernels that made its inputs and before those that read its
    outputs, on the stream the stage timer's events are on; TensorRT in float16 with ``trt_fp16_enable`` (else a
    float16 graph may build FP32 engines), and the CUDA provider after it for the nodes TensorRT rejects (else they
    fall back to the CPU)."""
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    cuda = {"device_id": device.index or 0}
    if stream is not None:
        cuda["user_compute_stream"] = str(stream)
    providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    if provider == "tensorrt":
        providers.insert(0, ("TensorrtExecutionProvider", {**cuda, "trt_fp16_enable": dtype == "float16"}))
    return providers


def started_session(onnxruntime, path: Path, options, providers: list):
    """An InferenceSession on ``providers[0]`` or a clear error. ONNX Runtime's own fallback is off: when a
    provider cannot start (TensorRT's libnvinfer missing, CUDA's libraries missing) it prints the error and
    retries on CUDA then CPU without the provider options, so without it the run would measure another provider
    on GPU 0 under this one's name (onnxruntime/capi/onnxruntime_inference_collection.py, InferenceSession
    ``__init__``: ``enable_fallback``, and ``_create_inference_session(self._fallback_providers, None)``; seen
    with onnxruntime-gpu 1.31.1 on an H200 without TensorRT). Where ``enable_fallback`` is not understood, the
    session's providers are checked instead."""
    wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=providers, enable_fallback=0)
    except (RuntimeError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DiffmeterError(f"onnxruntime: ONNX Runtime could not start {wanted}: {first[:300]}") from error
    if session.get_providers()[0] != wanted:
        raise DiffmeterError(
            f"onnxruntime: ONNX Runtime could not start {wanted} and fell back to {session.get_providers()[0]}"
        )
    return session
