"""`bench --trace` on tiny pipelines (UNet and MMDiT): the Chrome trace, the operators table, `show --ops`."""

import gzip
import json
from collections import defaultdict

import pytest

from diffmeter.flops.kinds import kind_of
from diffmeter.measure.ops import OUTSIDE, PREFIX, OpsTable
from diffmeter.measure.trace import OPS_FILE, TRACE_FILE
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import REQUESTS, read_result

MODELS = ["tiny-sd", "tiny-flux"]
STEPS = 3
#: the profiler's range of a stage and the stage timer's reading of it, in the same call, differ by where each
#: marks its boundaries: on a loaded machine a few milliseconds, a large share of a tiny pipeline's short stage
SAME_CALL = {"rel": 0.1, "abs": 0.01}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("traced")
    return {name: bench(BenchSpec(model=name, steps=STEPS, iterations=2, trace=True), out=out) for name in MODELS}


def _ranges(folder) -> dict[str, float]:
    """Seconds in each diffmeter range of the stored Chrome trace, by name (CFG encodes text twice)."""
    with gzip.open(folder / TRACE_FILE, "rt") as file:
        trace = json.load(file)
    events = trace["traceEvents"]
    assert all("ph" in event and "name" in event for event in events)
    complete = [event for event in events if event["ph"] == "X"]
    assert any(event["name"].startswith("aten::") for event in complete)
    ranges, step_end = defaultdict(float), None
    for event in sorted(complete, key=lambda event: event["ts"]):
        name = event["name"].removeprefix(PREFIX)
        if name.startswith("step "):  # contiguous, as the stage timer times steps: from the previous step's end
            start = event["ts"] if step_end is None else step_end
            step_end = event["ts"] + event["dur"]
            ranges[name] = (step_end - start) / 1e6
        elif name != event["name"]:
            ranges[name] += event["dur"] / 1e6
    return ranges


@pytest.mark.parametrize("name", MODELS)
def test_the_trace_is_a_chrome_trace_whose_stage_ranges_are_the_stage_times(traced, name):
    result, folder = traced[name]
    ranges = _ranges(folder)
    stages = result.trace.stages
    assert set(ranges) >= {"pipeline call", "text encoding", "VAE decode", *(f"step {i}" for i in range(STEPS))}
    assert f"step {STEPS}" not in ranges  # the tail after the last step is named as part of "other"
    assert "after the last step (other)" in ranges
    assert ranges["pipeline call"] == pytest.approx(result.trace.total_s, **SAME_CALL)
    assert ranges["text encoding"] == pytest.approx(stages.text_encoding_s, **SAME_CALL)
    assert ranges["VAE decode"] == pytest.approx(stages.vae_decode_s, **SAME_CALL)
    for step in range(STEPS):
        assert ranges[f"step {step}"] == pytest.approx(stages.steps_s[step], **SAME_CALL)


@pytest.mark.parametrize("name", MODELS)
def test_each_stage_table_adds_up_to_the_stage_time(traced, name):
    result, folder = traced[name]
    table = OpsTable.model_validate_json((folder / OPS_FILE).read_text())
    timed = result.trace.stages
    expected = {
        "text_encoding": timed.text_encoding_s,
        "denoising": timed.denoising_s,
        "vae_decode": timed.vae_decode_s,
        "other": timed.other_s,
    }
    assert [stage.stage for stage in table.stages] == list(expected)
    for stage in table.stages:
        operators = sum(row.self_s for row in stage.rows if row.name != OUTSIDE)
        # the outside row holds the rest of the profiler's range of the stage, which is the stage timer's
        assert sum(row.self_s for row in stage.rows) == pytest.approx(max(stage.range_s, operators), rel=1e-9)
        assert stage.range_s == pytest.approx(expected[stage.stage], **SAME_CALL)
        assert sum(row.share for row in stage.rows) == pytest.approx(1.0, rel=1e-6)
        assert [row.name for row in stage.rows].count(OUTSIDE) == 1
    stored = {stage.stage: stage for stage in result.trace.top_ops}
    assert all(len(stored[stage.stage].rows) <= 6 for stage in table.stages)  # results.json: the top 5 + outside


@pytest.mark.parametrize("name", MODELS)
def test_operator_flops_add_up_to_the_profiles_denoising_flops(traced, name):
    """The counter's formulas on the recorded shapes count what the offline profile counts (matmuls,
    convolutions, attention), so one call's denoising FLOPs agree exactly."""
    result, folder = traced[name]
    table = OpsTable.model_validate_json((folder / OPS_FILE).read_text())
    denoising = next(stage for stage in table.stages if stage.stage == "denoising")
    counted = sum(row.flops for row in denoising.rows if row.flops)
    assert counted == result.summary.flops["denoising"]
    assert {kind for kind, total in denoising.kinds.items() if total.flops} <= {"attention", "matmul", "convolution"}
    assert all(row.achieved_tflops > 0 for row in denoising.rows if row.flops)


@pytest.mark.parametrize("name", MODELS)
def test_the_traced_call_is_extra_and_flagged(traced, name):
    result, folder = traced[name]
    assert len(result.iterations) == result.summary.iterations == 2
    assert len(result.images) == 2  # the traced call saves no image
    assert len(json.loads((folder / REQUESTS).read_text())) == 2
    assert read_result(folder).trace == result.trace
    assert result.trace.total_s > 0 and len(result.trace.stages.steps_s) == STEPS


def test_show_ops_prints_the_table_and_refuses_an_untraced_run(cli, traced, tmp_path):
    _, folder = traced["tiny-sd"]
    code, out, err = cli("show", folder, "--ops")
    assert code == 0, err
    for text in ("denoising", "VAE decode", "aten::", "all convolution", "(outside operators", "FLOP/s"):
        assert text in out
    code, out, _ = cli("show", folder)
    assert code == 0 and TRACE_FILE in out
    _, plain = bench(BenchSpec(model="tiny-sd", steps=2, iterations=1), out=tmp_path)
    code, _, err = cli("show", plain, "--ops")
    assert code == 2 and "--trace" in err and "Traceback" not in err


def test_operator_kinds():
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert [kind_of(f"aten::{op}") for op in ("addmm", "mm", "bmm", "linear")] == ["matmul"] * 4
    assert kind_of("aten::mkldnn_convolution") == kind_of("aten::_slow_conv2d_forward") == "convolution"
    assert kind_of("aten::native_group_norm") == kind_of("aten::native_layer_norm") == "normalization"
    assert [kind_of(f"aten::{op}") for op in ("add", "mul_", "silu", "gelu")] == ["elementwise"] * 4
    assert kind_of("aten::cat") == kind_of("aten::copy_") == "other"
    # kinds are whole words of the name: the initial noise is not a normalization, a summed mean not a matmul
    assert kind_of("aten::normal_") == kind_of("aten::randn") == "other"
    assert kind_of("aten::conv_transpose2d") == kind_of("aten::cudnn_convolution") == "convolution"
    assert kind_of("aten::_efficient_attention_forward") == "attention"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-sd", "tiny-sana"])
def test_the_profilers_native_lines_go_to_the_run_folder_not_the_terminal(tmp_path, model):
    """libkineto writes its start and stop lines straight to file descriptor 2 (no Python logger to quiet); so does
    c10 while the call is recorded: tiny SANA frees a tensor allocated before profiling started (CPUAllocator's
    "Memory block of unknown size" warning, which reached the terminal)."""
    import subprocess

    command = ["diffmeter", "bench", model, "--steps", "1", "--iterations", "1", "--trace", "--out", str(tmp_path)]
    # -q: a run past progress.PLAIN_EVERY_S would print its progress line on a stderr that is not a terminal
    done = subprocess.run(command + ["--no-predict", "-q"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (log,) = tmp_path.glob("*/profiler.log")
    assert "profiler_start" in log.read_text() and "profiler_stop" in log.read_text()
    assert ("Memory block of unknown size" in log.read_text()) == (model == "tiny-sana")


def _recorded(name, shapes, parent=None):
    """An operator call as torch.profiler records it with record_shapes (absent arguments: empty shapes)."""
    from types import SimpleNamespace

    return SimpleNamespace(name=name, input_shapes=shapes, concrete_inputs=[None] * len(shapes), cpu_parent=parent)


def test_fused_attention_kernels_are_counted_by_their_sdpa_operator_not_from_their_tensors():
    """On CUDA, SDPA's efficient kernel records `_efficient_attention_forward` with (B, S, H, D) inputs and
    empty shapes for its absent arguments; torch's formula for it reads tensors (get_raw), and reading
    recorded shapes crashed a traced H200 run. The SDPA operator above it carries the count."""
    from torch.utils.flop_counter import sdpa_flop_count

    from diffmeter.measure.ops import operator_flops

    q = [2, 4, 64, 32]
    sdpa = _recorded("aten::_scaled_dot_product_efficient_attention", [q, q, q, [], [], [], [], [], []])
    kernel = _recorded("aten::_efficient_attention_forward", [[2, 64, 4, 32]] * 3 + [[]] * 11, parent=sdpa)
    assert operator_flops(sdpa) == sdpa_flop_count(q, q, q) == 4 * 2 * 4 * 64 * 64 * 32
    assert operator_flops(kernel) is None


def _event(name, start_us, end_us, device="cpu", parent=None, kernel_us=0.0, event_id=None):
    """A FunctionEvent as torch.profiler builds it from kineto: CPU events nest by cpu_parent; on CUDA every
    record_function range also appears once more on the GPU's timeline (a gpu_user_annotation event)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    event = SimpleNamespace(
        name=name,
        id=event_id if event_id is not None else id(name) + int(start_us),
        device_type=DeviceType.CPU if device == "cpu" else DeviceType.CUDA,
        time_range=SimpleNamespace(start=start_us, end=end_us),
        cpu_parent=parent,
        cpu_children=[],
        input_shapes=[],
        concrete_inputs=[],
        self_cpu_time_total=end_us - start_us,
        self_device_time_total=kernel_us,
    )
    if parent is not None:
        parent.cpu_children.append(event)
    return event


def test_cuda_stage_lengths_come_from_the_gpu_timeline_once_and_kernels_from_the_range_that_launched_them():
    """On an H200 every stage range was counted twice (host range + its GPU mirror): text encoding came out at
    exactly 2x the stage timer's figure and "other" negative. The host launches ahead of the GPU; the stage
    timer's CUDA events time the GPU's timeline, so the table must too."""
    from diffmeter.measure.ops import OUTSIDE, PREFIX, ops_table

    host = {
        name: _event(PREFIX + name, start, end, event_id=i)
        for i, (name, start, end) in enumerate(
            [
                ("pipeline call", 0, 1000),
                ("text encoding", 0, 300),
                ("step 0", 300, 500),
                ("step 1", 500, 700),
                ("VAE decode", 700, 1000),
            ]
        )
    }
    gpu = [  # the same ranges on the GPU: later and, where the GPU is the bottleneck, longer
        _event(PREFIX + name, start, end, device="cuda", event_id=100 + i)
        for i, (name, start, end) in enumerate(
            [
                ("pipeline call", 50, 1450),
                ("text encoding", 50, 250),
                ("step 0", 400, 700),
                ("step 1", 700, 1000),
                ("VAE decode", 1000, 1400),
            ]
        )
    ]
    mm = _event("aten::mm", 310, 320, parent=host["step 0"], kernel_us=250.0)
    conv = _event("aten::cudnn_convolution", 710, 720, parent=host["VAE decode"], kernel_us=300.0)
    events = [*host.values(), *gpu, mm, conv]

    table, ranges_s = ops_table(events, steps=2, time_base="cuda")
    assert ranges_s["text_encoding"] == pytest.approx(200e-6)
    assert ranges_s["steps"] == pytest.approx([300e-6, 300e-6])
    assert ranges_s["vae_decode"] == pytest.approx(400e-6)
    assert ranges_s["other"] == pytest.approx(1400e-6 - 200e-6 - 600e-6 - 400e-6)
    rows = {stage.stage: {row.name: row.self_s for row in stage.rows} for stage in table.stages}
    assert rows["denoising"] == pytest.approx({"aten::mm": 250e-6, OUTSIDE: 350e-6})
    assert rows["vae_decode"] == pytest.approx({"aten::cudnn_convolution": 300e-6, OUTSIDE: 100e-6})

    cpu_table, cpu_ranges = ops_table([*host.values(), mm, conv], steps=2, time_base="cpu")
    assert cpu_ranges["text_encoding"] == pytest.approx(300e-6)  # a CPU run: the host's ranges, as before
