"""Prompts for a run: the shipped set, a local txt/jsonl/csv file, or one prompt; sampled with the seed."""

from __future__ import annotations

import csv
import json
import random
from importlib import resources
from pathlib import Path

from diffmeter.errors import DiffmeterError

#: keys a jsonl record or csv header may use for its prompt, in order of preference
PROMPT_KEYS = ("prompt", "text", "caption")


def builtin_prompts() -> list[str]:
    """The prompt set shipped with diffmeter: 240 prompts, 12 subjects, short to long."""
    text = (resources.files("diffmeter.runs") / "data" / "prompts.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a .txt (one per line), .jsonl (strings or objects) or .csv (a prompt column)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise DiffmeterError(
            f"cannot read prompts file {path}: {reason}; pass a readable .txt, .jsonl or .csv file"
        ) from None
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        lines = enumerate(text.splitlines(), 1)
        prompts = [_jsonl_prompt(line, path, number) for number, line in lines if line.strip()]
    elif suffix == ".csv":
        prompts = _csv_prompts(text, path)
    else:
        prompts = [line.strip() for line in text.splitlines()]
    prompts = [prompt for prompt in prompts if prompt]
    if not prompts:
        raise DiffmeterError(f"prompts file {path} holds no prompts; put one prompt per line (or use --prompt)")
    return prompts


def _jsonl_prompt(line: str, path: Path, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DiffmeterError(f"{path}:{number} is not JSON ({error.msg}); write one JSON value per line") from None
    if isinstance(record, str):
        return record.strip()
    if isinstance(record, dict):
        for key in PROMPT_KEYS:
            if isinstance(record.get(key), str):
                return record[key].strip()
    raise DiffmeterError(f"{path}:{number} has no prompt: use a string or an object with a 'prompt' key")


def _csv_prompts(text: str, path: Path) -> list[str]:
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        return []
    header = [cell.strip().lower() for cell in rows[0]]
    column = next((header.index(key) for key in PROMPT_KEYS if key in header), None)
    if column is None:
        raise DiffmeterError(f"{path} has no 'prompt' column; name the prompt column 'prompt' in the header row")
    return [row[column].strip() for row in rows[1:] if len(row) > column]


def prompt_pool(prompt: str | None, prompts_file: str | None, count: int, seed: int) -> list[str]:
    """``count`` prompts sampled without replacement (cycled when the source is smaller)."""
    if prompt is not None:
        if not prompt.strip():
            raise DiffmeterError("--prompt is empty; give a prompt or leave it out to use the shipped set")
        return [prompt]
    source = read_prompts(prompts_file) if prompts_file else builtin_prompts()
    rng = random.Random(seed)
    order = rng.sample(source, len(source))
    return [order[i % len(order)] for i in range(count)]
