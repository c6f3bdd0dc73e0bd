"""`profile --gpu --cfg-degree 2` as the CLI shows it: each GPU's half of a batched CFG call, and the exchanges of a
pipeline that calls its denoiser once per guidance half."""

import json


def test_a_cfg_parallel_gpus_memory_row_names_its_half_of_the_batch(cli):
    """Each GPU runs batch 1 of the CFG-doubled batch 2: its denoising row said "batch 2" beside batch 1's
    activations."""
    asked = ("profile", "tiny-sd", "--gpu", "a100", "--json")
    alone, split = (json.loads(cli(*asked, *extra)[1]) for extra in ((), ("--cfg-degree", "2")))
    batches = [
        next(s["batch"] for s in found["memory"]["stages"] if s["stage"] == "denoising step")
        for found in (alone, split)
    ]
    assert batches == [2, 1]


def test_separate_cfg_calls_count_one_exchange_per_pair(cli):
    """Wan calls its transformer once per guidance half: under CFG parallelism each rank runs one of each pair and
    receives the other's prediction, an all-gather per step, counted with its bytes (it said '... in 0
    collectives' beside the bytes, a new user's finding)."""
    code, out, err = cli("profile", "tiny-wan", "--gpu", "h100", "--cfg-degree", "2", "--steps", "3", "--json")
    parallel = json.loads(out)["parallel"]
    assert code == 0, err
    assert parallel["calls_by_collective"] == {"all_gather": 3} and parallel["collectives_per_generation"] == 3
    assert parallel["received_by_collective"]["all_gather"] == parallel["bytes_received_per_gpu"] > 0
