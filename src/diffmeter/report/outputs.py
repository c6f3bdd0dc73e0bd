"""What a run's figures count per: images, or videos for runs with frames; "outputs" where a table has both."""

from __future__ import annotations

import math

from diffmeter import units


def is_video(row) -> bool:
    """A table row of a video run (it has frames)."""
    frames = row["frames"]
    return frames is not None and not (isinstance(frames, float) and math.isnan(frames))


def size(row) -> str:
    """A row's output size: "64x64", a video's with its frames "832x480x81f"."""
    return f"{row['width']}x{row['height']}" + (f"x{row['frames']}f" if is_video(row) else "")


def noun(rows) -> str:
    """What the rows' per-output columns count: "image", "video", or "output" where they mix both."""
    kinds = {is_video(row) for row in rows}
    return "output" if len(kinds) > 1 else "video" if kinds == {True} else "image"


def rate(value: float, video: bool, mixed: bool) -> str:
    """Outputs per second as ``units.figure`` writes a figure, one format down a column ("40.00" beside "37.90",
    never "40" beside "37.9"), with what they are ("0.935 images") in a table that mixes images and videos."""
    text = units.figure(value)
    return f"{text} {'videos' if video else 'images'}" if mixed else text


def explained(word: str) -> str:
    """The caption's line for ``noun``'s word: what an output is where a table mixes kinds, else nothing."""
    return "output: an image, or a whole video (all its frames) for a video run." if word == "output" else ""
