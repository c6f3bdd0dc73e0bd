"""Device and precision rules of CUDA runs, shown on CPU: a cuda:N run pinned to its device and its events to
that device's stream, strict float32 unless tf32 is asked for, the MFU peak following the run's own tf32
setting, compilation and CUDA-graph recordings inside a window counted, MPS refused with its reason."""

import pytest
import torch

from diffmeter.errors import DiffmeterError


def test_a_cuda_n_run_is_pinned_to_its_device_and_its_events_to_that_devices_stream(monkeypatch):
    """No CUDA here: torch.cuda's device context, events and streams are replaced by recorders."""
    from diffmeter.measure import clock

    entered, recorded_on = [], []

    class Device:
        def __init__(self, device):
            self.index = device.index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            entered.append(-1)

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self, stream):
            recorded_on.append(stream)

    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"stream of {device}")
    with clock.device_scope(torch.device("cuda", 1)):
        clock.clock_for(torch.device("cuda", 1)).mark()
    assert entered == [1, -1] and recorded_on == ["stream of cuda:1"]
    with clock.device_scope(torch.device("cpu")):
        assert clock.clock_for(torch.device("cpu")).mark() > 0


def test_strict_fp32_sets_convolutions_too_and_survives_the_new_precision_api():
    from diffmeter.optimize.tf32 import fp32_math, fp32_precision

    before = fp32_precision()
    with fp32_math(False):
        assert fp32_precision() == {"matmul": "ieee", "convolution": "ieee"}  # PyTorch's default leaves conv TF32
        with fp32_math(True):
            assert fp32_precision() == {"matmul": "tf32", "convolution": "tf32"}
        assert fp32_precision() == {"matmul": "ieee", "convolution": "ieee"}
    assert fp32_precision() == before
    if hasattr(torch.backends.cudnn.conv, "fp32_precision"):  # torch 2.9+: someone used the new API
        previous = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        try:
            with fp32_math(True):
                assert fp32_precision()["convolution"] == "tf32"
            torch.get_float32_matmul_precision()  # the legacy reader inductor uses must not raise
            assert torch.backends.cudnn.allow_tf32 is False
        finally:  # with the legacy setter: conv and RNN alike, or torch.export's legacy read raises later
            torch.backends.cudnn.allow_tf32 = previous
        assert torch._C._get_cudnn_allow_tf32() == previous


def test_the_mfu_peak_follows_the_runs_tf32_setting_not_global_state():
    from diffmeter.predict.peaks import device_peak

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        assert device_peak("NVIDIA H100 80GB HBM3", "float32").tflops == 67.0
        assert device_peak("NVIDIA H100 80GB HBM3", "float32", tf32=True).tflops == 494.5
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_compilation_inside_a_window_is_counted():
    from diffmeter.measure.compilation import watch_compilation

    function = torch.compile(lambda x: (2 * x).sin(), backend="eager")
    function(torch.ones(3))
    with watch_compilation() as steady:
        function(torch.ones(3))
    with watch_compilation() as reshaped:
        function(torch.ones(5))
    assert steady.clean and reshaped.graphs_compiled == 1


def test_cuda_graph_recordings_inside_a_window_are_counted(monkeypatch):
    """No CUDA here: the recording itself is replaced; the count is what is tested."""
    from diffmeter.measure.compilation import watch_compilation

    graph_class = torch.cuda.graphs.CUDAGraph
    monkeypatch.setattr(graph_class, "capture_begin", lambda self, *args, **kwargs: None)
    with watch_compilation() as seen:
        graph_class.capture_begin(object())
        graph_class.capture_begin(object())
    assert seen.cuda_graphs_recorded == 2 and not seen.clean
    assert graph_class.capture_begin is not None


def test_mps_is_refused_with_the_reason():
    from diffmeter.runs.spec import resolve_device

    with pytest.raises(DiffmeterError, match="--device mps is not supported.*--device cpu"):
        resolve_device("mps")
