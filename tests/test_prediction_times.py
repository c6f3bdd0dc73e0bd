"""`fit --all` cold: the wait it announces comes from each model's last prediction time on this machine."""

from diffmeter.cli.leaderboard import wait_note
from diffmeter.runs import prediction_times


def test_times_are_kept_per_model_and_estimate_the_models_left(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    assert prediction_times.load() == {} and prediction_times.estimate_s(["sd15"], {}) is None
    prediction_times.remember("sd15", 4.0)
    prediction_times.remember("flux-dev", 10.0)
    prediction_times.remember("wan2.1-t2v-1.3b", 30.0)
    known = prediction_times.load()
    assert known == {"sd15": 4.0, "flux-dev": 10.0, "wan2.1-t2v-1.3b": 30.0}
    # each known model at its own time, an unknown one at the median of the known (10 s): 4 + 30 + 10
    assert prediction_times.estimate_s(["sd15", "wan2.1-t2v-1.3b", "never-timed"], known) == 44.0
    prediction_times.remember("sd15", 5.0)  # the last time replaces the earlier one
    assert prediction_times.load()["sd15"] == 5.0


def test_nothing_is_kept_with_the_cache_off(monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", "off")
    prediction_times.remember("sd15", 4.0)
    assert prediction_times.load() == {}


def test_the_cold_note_says_how_many_and_how_long():
    assert wait_note(3, 66, 150.0).startswith("3 of 66 models are not in the cache")
    assert "about 2.50 min from their last times here" in wait_note(3, 66, 150.0)
    assert "no earlier prediction timed on this machine" in wait_note(66, 66, None)
