"""The JSON Schemas in docs/ (profile.schema.json, fit.schema.json) against what `profile --json` and `fit --json`
print: a user validating the output with them finds every key named and no key they do not name."""

from __future__ import annotations

import json

import pytest


def test_every_key_profile_gpu_json_prints_is_in_the_committed_schema_with_a_unit(cli):
    """docs/profile.schema.json is what a user validates the output against: it forbids keys it does not name."""
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).parents[1] / "docs" / "profile.schema.json").read_text())
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--steps", "2", "--json")
    found = json.loads(out)
    jsonschema.validate(found, schema)
    assert code == 0 and {"gpu", "memory", "time", "time_left_out", "peak_memory_bytes"} <= set(found)
    assert "*_s" in found["units"] and "*_bytes" in found["units"]
    with pytest.raises(jsonschema.ValidationError, match="not_a_key"):
        jsonschema.validate({**found, "not_a_key": 1}, schema)
    code, out, _ = cli("profile", "tiny-sd", "--steps", "2", "--json")  # without --gpu: no prediction keys
    plain = json.loads(out)
    jsonschema.validate(plain, schema)
    assert "gpu" not in plain and "*_s" not in plain["units"]
    code, out, _ = cli("profile", "tiny-sd", "--steps", "2", "--cfg-degree", "2", "--json")  # a group, no --gpu
    jsonschema.validate(split := json.loads(out), schema)
    assert code == 0 and split["context_parallel_per_gpu_step"]["cfg_degree"] == 2 and "gpu" not in split
    code, out, _ = cli("profile", "tiny-sd", "--steps", "2,3", "--gpu", "h100", "--json")  # several: "profiles"
    jsonschema.validate(several := json.loads(out), schema)
    assert code == 0 and [p["steps"] for p in several["profiles"]] == [2, 3]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**several, "not_a_key": 1}, schema)


def test_fit_json_is_what_the_committed_schema_says_and_names_its_units(cli):
    """docs/fit.schema.json is FitAnswer's, forbids keys it does not name, and `fit --json` (with a card's time and
    with memory alone) validates against it as a user would check it."""
    from pathlib import Path

    import jsonschema

    from diffmeter.runs.fit_answer import FitAnswer

    schema = json.loads((Path(__file__).parents[1] / "docs" / "fit.schema.json").read_text())
    assert schema == FitAnswer.model_json_schema(mode="serialization")
    for card in (("--gpu", "h100"), ("--memory", "1.2835GB")):
        code, out, err = cli("fit", "tiny-flux", "--steps", "2", *card, "--json")
        answer = json.loads(out)
        assert code == 0, err
        jsonschema.validate(answer, schema)
        assert answer["fits"] and answer["units"]["*_bytes"].startswith("bytes")
    with pytest.raises(jsonschema.ValidationError, match="extra"):
        jsonschema.validate({**answer, "extra": 1}, schema)
