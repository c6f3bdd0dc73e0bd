"""The sweep file: its axes expanded to cells (minus exclude, plus include), a wrong or unknown key refused naming it,
the shipped JSON schema current."""

import json
from pathlib import Path

import pytest

from diffmeter.errors import DiffmeterError
from diffmeter.sweep.file import SweepFile, expand, read_sweep_file


def test_axes_expand_to_every_combination_minus_exclude_plus_include():
    sweep = SweepFile(
        axes={"model": ["tiny-sd", "tiny-pixart"], "batch_size": [1, 2], "optimizations": ["", "fuse-qkv"]},
        fixed={"steps": 2},
        exclude=[{"model": "tiny-pixart", "optimizations": "fuse-qkv"}],
        include=[{"model": "tiny-sd", "batch_size": 2, "seed": 7}, {"model": "tiny-flux", "size": "48x32"}],
    )
    cells = expand(sweep)
    assert len(cells) == 2 * 2 * 2 - 2 + 1
    assert all(cell.spec.steps == 2 for cell in cells)
    pixart = [cell for cell in cells if cell.spec.model == "tiny-pixart"]
    assert len(pixart) == 2 and all(not cell.spec.optimizations for cell in pixart)
    extended = [cell for cell in cells if cell.spec.seed == 7]
    assert {(c.spec.model, c.spec.batch_size) for c in extended} == {("tiny-sd", 2)} and len(extended) == 2
    (added,) = [cell for cell in cells if cell.spec.model == "tiny-flux"]
    assert (added.spec.width, added.spec.height, added.spec.batch_size) == (48, 32, 1)
    (fused,) = [c for c in cells if c.spec.model == "tiny-sd" and c.spec.batch_size == 1 and c.spec.optimizations]
    assert [o.name for o in fused.spec.optimizations] == ["fuse-qkv"]
    combined = expand(
        SweepFile(axes={"model": ["tiny-sd"], "optimizations": ["fuse-qkv+first-block-cache:threshold=0.2"]})
    )
    assert [(o.name, o.params) for o in combined[0].spec.optimizations] == [
        ("fuse-qkv", {}),
        ("first-block-cache", {"threshold": 0.2}),
    ]


@pytest.mark.parametrize(
    "text, named",
    [
        ("axes: {model: [tiny-sd]}\nrepeats: 3\n", "unknown key 'repeats'"),
        ("axes: {model: [tiny-sd], batchsize: [1, 2]}\n", "unknown option 'batchsize' in axes"),
        ("axes: {model: [tiny-sd]}\nfixed: {iteration: 3}\n", "unknown option 'iteration' in fixed"),
        ("axes: {model: [tiny-sd]}\nexclude: [{modle: tiny-sd}]\n", "unknown option 'modle' in exclude[0]"),
        ("axes: {model: []}\n", "axis 'model' has no values"),
        ("axes: {steps: [1, 2]}\n", "no model"),
        ("axes: {model: [tiny-sd], steps: [1]}\nfixed: {steps: 2}\n", "'steps' is both an axis and fixed"),
        ("axes: {model: [tiny-sd], optimizations: ['', 'quantize:mode=int8']}\n", "quantize: bad parameter mode"),
        ("axes: {model: [tiny-sd]}\nfixed: {optimizations: fuse-qvk}\n", "unknown optimization 'fuse-qvk'"),
        ("axes: {model: [tiny-sd]}\ntimeout_s: -5\n", "timeout_s: Input should be greater than 0"),
        ("axis: {model: [tiny-sd]}\n", "unknown key 'axis'"),  # not only 'axes: Field required'
        # a value of the wrong type is named where the file has it (a new user's trial: "cell model=tiny-sd:
        # iterations: ...", without the file or that it is in fixed)
        ("axes: {model: [tiny-sd]}\nfixed: {iterations: two}\n", "study.yaml: iterations two in fixed: Input should"),
        ("axes: {model: [tiny-sd], steps: [1, x]}\n", "study.yaml: steps x in axes: Input should be a valid integer"),
    ],
)
def test_a_sweep_file_with_an_unknown_or_wrong_key_is_refused_naming_it(tmp_path, cli, text, named):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(DiffmeterError, match=named.replace("[", r"\[").replace("]", r"\]")):
        read_sweep_file(path)
    code, out, err = cli("sweep", path, "--out", tmp_path / "out", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_shipped_json_schema_is_current_and_refuses_unknown_keys():
    from diffmeter.sweep.file import json_schema

    committed = json.loads((Path(__file__).parents[1] / "docs" / "sweep.schema.json").read_text())
    assert committed == json_schema()
    assert (
        committed["additionalProperties"] is False
        and "batch_size" in committed["properties"]["axes"]["propertyNames"]["enum"]
    )
