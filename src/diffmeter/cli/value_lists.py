"""Comma-separated option values (``--height 512,768,1024``, ``--steps 20,30``): profile's scaling tables."""

from __future__ import annotations

from diffmeter.errors import DiffmeterError


def numbers(text: str | None, option: str, kind=int) -> list:
    """Parse '512,768,1024' into numbers, or fail with one clear line."""
    if text is None:
        return [None]
    try:
        return [kind(part) for part in text.split(",")]
    except ValueError:
        raise DiffmeterError(f"{option} takes numbers separated by commas, got '{text}'") from None


def sizes(height: str | None, width: str | None) -> list[tuple[int | None, int | None]]:
    """Paired --height/--width lists; a list given alone sets both sides."""
    heights, widths = numbers(height, "--height"), numbers(width, "--width")
    if width is None:
        return [(h, h) for h in heights]
    if height is None:
        return [(w, w) for w in widths]
    if len(heights) != len(widths):
        raise DiffmeterError("--height and --width lists must have the same length (they are paired)")
    return list(zip(heights, widths, strict=True))
