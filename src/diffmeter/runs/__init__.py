"""Measured runs: spec, prompts, workload, runner, results schema and storage, ladders."""
