"""Counting compute: an operator-level counter and the per-pipeline profile built on it."""
