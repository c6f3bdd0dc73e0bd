"""Human-readable numbers that always carry their unit (decimal prefixes: G = 1e9; bytes in binary GiB)."""

import math

_PREFIXES = ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _scaled(value: float, unit: str) -> str:
    for factor, prefix in _PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def prefix(value: float) -> tuple[float, str]:
    """(factor, prefix) that makes ``value`` read between 1 and 999: (1e9, "G") for 3.9e11."""
    for factor, name in _PREFIXES:
        if abs(value) >= factor:
            return factor, name
    return 1.0, ""


def macs(value: float) -> str:
    return _scaled(value, "MACs")


def flops(value: float) -> str:
    return _scaled(value, "FLOPs")


def flop_rate(value: float) -> str:
    return _scaled(value, "FLOP/s")


def gib(value: float) -> str:
    """Bytes as GiB (2**30 bytes, as nvidia-smi's MiB and torch count), as ``figure`` writes them ("0.0123 GiB")."""
    return f"{figure(value / 2**30)} GiB"


def figure(value: float) -> str:
    """2 decimals from 1, 3 significant digits below, so a small figure never reads 0.00 ("0.0123"); the caller
    names the unit."""
    rounded = float(f"{value:.3g}")  # 0.9996 rounds to 1.00, 0.09996 to 0.100
    if rounded == 0 or abs(rounded) >= 1:
        return f"{value:,.2f}"
    return f"{value:.{2 - math.floor(math.log10(abs(rounded)))}f}"


def significant(value: float) -> str:
    """3 significant digits, whole numbers with thousands separators from 1,000 on (never "2.25e+03": 2,250); the
    caller names the unit."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def params(value: float) -> str:
    for factor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:,.2f}{suffix} params"
    return f"{value:,.0f} params"


#: (the least magnitude in seconds, seconds per unit, unit, format) of the units from a second up, largest first
WHOLE_SECONDS = ((7200, 3600, "h", ",.2f"), (120, 60, "min", ",.2f"), (1, 1, "s", ",.3f"))


def seconds(value: float) -> str:
    """Seconds, switching to ms below one second and to µs below one millisecond, and to minutes from two
    minutes and hours from two hours (8.29 h reads; 29,858.000 s does not)."""
    for floor, scale, unit, form in WHOLE_SECONDS:
        if abs(value) >= floor:
            return f"{value / scale:{form}} {unit}"
    return f"{value * 1e3:,.2f} ms" if abs(value) >= 1e-3 or value == 0 else f"{value * 1e6:,.2f} µs"


def seconds_range(low: float, high: float) -> str:
    """A range of seconds in one unit, the one ``seconds`` gives its larger end ("97.82 s to 155.40 s" reads as a
    range; "97.816 s to 2.59 min" does not)."""
    top = max(abs(low), abs(high))
    for floor, scale, unit, form in WHOLE_SECONDS:
        if top >= floor:
            return f"{low / scale:{form}} {unit} to {high / scale:{form}} {unit}"
    return f"{seconds(low)} to {seconds(high)}"


def joules(value: float) -> str:
    return _scaled(value, "J")


def watt_hours(joules_: float) -> str:
    """Joules as watt-hours, a kWh and up with its prefix ("15.15 MWh"), less as ``figure`` writes it ("12.7 Wh")."""
    hours = joules_ / 3600
    return _scaled(hours, "Wh") if abs(hours) >= 1e3 else f"{figure(hours)} Wh"


def steps(count: int) -> str:
    """ "1 step", "50 steps"."""
    return counted(count, "step")


def counted(count: int, word: str) -> str:
    """ "1 profile", "2 profiles", "0 profiles": a whole count with its noun, plural unless 1."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
