"""Measuring a running pipeline: device clocks, per-stage timing, memory, energy, peaks."""
