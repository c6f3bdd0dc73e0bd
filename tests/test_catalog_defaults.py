"""Each catalog entry's run defaults against its pipeline class: what ``profile MODEL`` counts with no flag is
either what the installed pipeline's ``__call__`` does or a value its cited source (the model card) states."""

import re
from pathlib import Path

import pytest
from tiny_runs import REAL

from diffmeter.catalog.pipeline_defaults import derive
from diffmeter.families import get_family

#: no such folder: ``derive`` then reads the pipeline class alone (no tokenizer configs, no template entry)
NO_FOLDER = Path("/nonexistent")
FIELDS = ("steps", "guidance_scale", "height", "width", "num_frames", "max_sequence_length", "cfg_trunc_ratio")


def numbers(text: str) -> set[float]:
    return {float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)}


@pytest.mark.parametrize("entry", REAL, ids=lambda e: e.name)
def test_a_default_the_pipeline_does_not_give_is_stated_by_its_source(entry):
    """Where an entry departs from its pipeline class's own defaults (``__call__``, or the family's size rule where
    ``__call__`` leaves it to the model config), ``sources['defaults']`` names the value: a typo, or a value copied
    from a sibling entry, has no source."""
    called, _ = derive(entry, NO_FOLDER, None)
    stated = numbers(entry.sources.get("defaults", ""))
    unstated = [
        f"{field} {getattr(entry.defaults, field)} (the pipeline's {getattr(called, field)})"
        for field in FIELDS
        if getattr(entry.defaults, field) != getattr(called, field) and getattr(entry.defaults, field) not in stated
    ]
    assert not unstated, f"{entry.name}: {unstated} not named in sources['defaults']"


#: how a source names each dtype (``float16`` as a word, not inside ``bfloat16``)
DTYPE_WORDS = {"bfloat16": r"\b(bfloat16|bf16)\b", "float16": r"\b(float16|fp16)\b", "float32": r"\b(float32|fp32)\b"}


@pytest.mark.parametrize("entry", REAL, ids=lambda e: e.name)
def test_the_dtype_is_the_one_its_source_loads(entry):
    """Memory and time predictions follow the dtype: ``sources['defaults']`` says where it comes from."""
    assert re.search(DTYPE_WORDS[entry.defaults.dtype], entry.sources.get("defaults", "").lower()), entry.name


@pytest.mark.parametrize("entry", REAL, ids=lambda e: e.name)
def test_the_sequence_encoder_is_padded_as_bench_calls_the_pipeline(entry):
    """bench passes ``max_sequence_length`` where the model card does (``defaults.max_sequence_length``, which
    ``test_a_default_the_pipeline_does_not_give_is_stated_by_its_source`` holds to its source) or the user asks
    (runs/workload.py), else the pipeline's ``__call__`` pads to its own: the length the entry records for its
    sequence encoder must be that one, or profile and bench count different prompts."""
    sequence_encoder = get_family(entry.family).sequence_encoder
    _, lengths = derive(entry, NO_FOLDER, None)
    if sequence_encoder is None or sequence_encoder not in lengths:
        pytest.skip(f"{entry.pipeline_class} has no max_sequence_length for its sequence encoder")
    passed = entry.defaults.max_sequence_length or lengths[sequence_encoder]
    assert entry.text_max_length[sequence_encoder] == passed, (
        f"{entry.name}: {entry.text_max_length[sequence_encoder]} tokens, bench's {entry.pipeline_class} call pads "
        f"to {passed}"
    )


@pytest.mark.parametrize("entry", REAL, ids=lambda e: e.name)
def test_notes_quoting_the_entrys_own_settings_agree_with_them(entry):
    """A note copied from a sibling entry keeps the sibling's numbers (Wan 2.2 I2V's notes said T2V's boundary_ratio
    0.875 and guidance 4.0): every ``defaults.FIELD (V)`` and ``KEY=V`` of a pipeline __init__ value in the entry's
    notes, extra and sources states the entry's own value."""
    text = " ".join([entry.notes, str(entry.extra), *entry.sources.values()])
    wrong = [
        quoted.group(0)
        for quoted in re.finditer(r"defaults\.(\w+) \((\d+(?:\.\d+)?)\)", text)
        if float(quoted.group(2)) != getattr(entry.defaults, quoted.group(1))
    ]
    for key, value in entry.extra.get("pipeline_init", {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            wrong += [q.group(0) for q in re.finditer(rf"{key}=(\d+(?:\.\d+)?)", text) if float(q.group(1)) != value]
    assert not wrong, f"{entry.name}: {wrong}"
