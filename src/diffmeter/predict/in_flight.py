"""A call's activations at their highest with its quantized layers' own allocations added where those layers run
(``layer_levels`` records where; ``quantized_formats.footprint`` what each allocates). Torch-free: a cached
``fit`` reads it without importing torch."""

from __future__ import annotations

#: a quantized layer whose level no call recorded under its shape (its module not found by its tensor's name): its
#: copy is added at the call's peak, as a bound
UNPLACED = "unplaced"


def in_flight_peak(levels: dict, copies: dict, peak: int) -> int:
    """A call's activations at their highest with its quantized layers' own allocations added where those layers
    run: ``levels``, the call's (start, with its output, with two outputs) per layer key (``LayerLevels``);
    ``copies``, per key the most a layer allocates for its weight before its matmul, what of it stays live beside
    its output, how many outputs it holds at once and the bytes beside them (``quantized_formats.footprint``);
    ``peak``, the call's activations at its peak. A key the call never ran adds nothing; ``UNPLACED``, its weight's
    copy at the peak."""
    found = peak
    for key, (most, held, outputs, beside) in copies.items():
        if key == UNPLACED:
            found = max(found, peak + most)
        elif key in levels:
            start, top, doubled = levels[key]
            found = max(found, start + most, top + held, doubled + beside if outputs > 1 else 0)
    return found
