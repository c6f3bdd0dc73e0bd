"""The `$ diffmeter` examples of README.md and docs/*.md: found, run in-process, their figures compared with the
page's, and (``python -m tests.docs_examples --update``) the pages' output blocks rewritten from the current output.

A page's conventions (docs/ARCHITECTURE.md, "Examples in the pages"): an example is a fenced block whose lines
start with ``$ diffmeter ...`` followed by its output; a line ``...`` marks output left out; an HTML comment right
before the block says what it needs (``<!-- needs: weights -->``, ``<!-- needs: gpu -->``: not run here) or that it
is slow (``<!-- slow -->``: run by the slow test); a fenced block whose first line is ``# NAME.yaml`` (or ``.json``,
``.txt``) is written to the examples' folder, for the examples after it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the width every page's output was written at: what diffmeter prints into a pipe or a file
WIDTH = 160
TRIM = ("...", "…")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
FILE_HEADER = re.compile(r"^#\s+(\S+\.(?:ya?ml|json|txt|jsonl|csv))\s*$")
FIGURE = re.compile(
    r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?"
    r"(GiB|MiB|KiB|TiB|GB|MB|kB|TB|[kMGTPE]?MACs|[kMGTPE]?FLOPs|[kMGTPE]?FLOP/s|[kMBT]? ?params"
    r"|ms|µs|us|ns|min|s|%|x|J|W)(?![\w/])"
)
COMPUTE = re.compile(r"MACs|FLOPs|params")
MEMORY = re.compile(r"[KMGT]i?B|kB")
#: commands whose figures (other than compute) are measured on this machine, so differ run to run
MEASURED = {"bench", "ladder", "show", "table", "compare", "report"}


@dataclass
class Example:
    page: str  # relative to the repository root
    line: int  # 1-based, of the `$ diffmeter` line
    command: str
    output: list[str]
    needs: set[str] = field(default_factory=set)
    slow: bool = False
    output_from: int = 0  # 0-based index in the page of the output's first line
    end: int = 0  # 0-based index in the page after the output

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} `{self.command}`"

    @property
    def runnable(self) -> bool:
        return not self.needs


@dataclass
class PageFile:
    """A fenced block the examples after it read (a sweep file, a prompts file)."""

    name: str
    text: str


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def steps(page: Path) -> list[Example | PageFile]:
    """The page's examples and files, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example | PageFile] = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith("```"):
            index += 1
            continue
        start = index + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("```")), len(lines))
        markers = _markers(lines, index)
        block = lines[start:end]
        header = FILE_HEADER.match(block[0]) if block else None
        if header and not any(line.startswith("$ ") for line in block):
            found.append(PageFile(header.group(1), "\n".join(block[1:]) + "\n"))
        found += _examples(page, block, start, markers)
        index = end + 1
    return found


def _markers(lines: list[str], fence: int) -> set[str]:
    """The words of the HTML comments right before a fence ("needs: gpu", "slow")."""
    words: set[str] = set()
    index = fence - 1
    while index >= 0 and (not lines[index].strip() or MARKER.match(lines[index].strip())):
        if comment := MARKER.match(lines[index].strip()):
            words.add(comment.group(1))
        index -= 1
    return words


def _examples(page: Path, block: list[str], start: int, markers: set[str]) -> list[Example]:
    needs = {word.split(":", 1)[1].strip() for word in markers if word.startswith("needs:")}
    examples: list[Example] = []
    index = 0
    while index < len(block):
        if not block[index].startswith("$ diffmeter"):
            index += 1
            continue
        first = index
        command = block[index][2:]
        while command.endswith("\\") and index + 1 < len(block):
            index += 1
            command = command[:-1].rstrip() + " " + block[index].strip()
        index += 1
        output_start = index
        while index < len(block) and not block[index].startswith("$ "):
            index += 1
        examples.append(
            Example(
                str(page.relative_to(ROOT)),
                start + first + 1,
                command,
                block[output_start:index],
                needs,
                "slow" in markers,
                start + output_start,
                start + index,
            )
        )
    return examples


def run(command: str, folder: Path) -> tuple[int, str]:
    """``diffmeter ...`` in this process, in ``folder``, at the pages' width: (exit code, what it printed)."""
    from diffmeter.cli import main
    from diffmeter.cli.app import console

    words = shlex.split(command)
    assert words[0] == "diffmeter", command
    out, err = io.StringIO(), io.StringIO()
    width, argv, here = console.width, sys.argv, Path.cwd()
    console.width, sys.argv = WIDTH, words
    code = 0
    try:
        os.chdir(folder)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    finally:
        os.chdir(here)
        console.width, sys.argv = width, argv
    return code, out.getvalue() + (err.getvalue() if code else "")


def compared(command: str):
    """Which figures of a command's output are compared: all but timings (and the measured memory and shares) where
    it measures; those depend on the machine and the moment."""
    words = shlex.split(command)
    name = words[1] if len(words) > 1 else ""
    if name in MEASURED or (name == "sweep" and "--dry-run" not in words):
        return lambda unit: bool(COMPUTE.search(unit))
    if "--gpu" in words and words[words.index("--gpu") + 1 :][:1] == ["cpu"]:
        return lambda unit: bool(COMPUTE.search(unit) or MEMORY.fullmatch(unit))
    return lambda unit: True


def figures(text: str, keep=lambda unit: True) -> list[str]:
    """Every number with its unit, as "1.06 GFLOPs" (a line's trailing padding left out, as the pages store it: a
    figure wrapped between its number and unit is still one)."""
    text = re.sub(r"[ \t]+\n", "\n", text)
    found = (f"{number} {' '.join(unit.split())}" for number, unit in FIGURE.findall(text))
    return [figure for figure in found if keep(figure.split(" ", 1)[1])]


def differences(example: Example, code: int, printed: str) -> list[str]:
    """What the page shows that the command no longer prints, each naming page, example and figure."""
    expected = "\n".join(example.output)
    if bool(code) != bool(re.search(r"^error:", expected, re.M)):
        return [f"{example.where}: exit code {code}; printed: {printed.strip()[-600:]}"]
    keep = compared(example.command)
    missing = Counter(figures(expected, keep)) - Counter(figures(printed, keep))
    found = []
    for figure in missing.elements():
        line = next(line for line in example.output if figure in figures(line, keep))
        label = _label(line)
        near = [other for other in printed.splitlines() if label and _label(other) == label]
        same = [other for other in figures(near[0], keep) if _kind(other) == _kind(figure)] if near else []
        got = ", ".join(same) if near else f"no line starting {label!r}"
        found.append(f"{example.where}: expected {figure} (in {line.strip()[:100]!r}), got {got or 'no figure'}")
    return found


def _kind(figure: str) -> str:
    """What a figure measures, whatever its prefix: "FLOPs" for "1.06 GFLOPs", "B" for "2.39 GiB"."""
    unit = figure.split(" ", 1)[1]
    return next((kind for kind in ("FLOP/s", "FLOPs", "MACs", "params", "B", "s") if unit.endswith(kind)), unit)


def _label(line: str) -> str:
    """A table row's or a sentence's words before its first figure or colon."""
    return re.split(r"[\d:]", line.strip(" │┃║|"), maxsplit=1)[0].strip(" │┃║|:(")


def check_page(page: Path, folder: Path, slow: bool) -> list[str]:
    """Run the page's runnable examples (the slow ones, or the others) in ``folder``: the differences found."""
    found = []
    for step in steps(page):
        if isinstance(step, PageFile):
            (folder / step.name).write_text(step.text, encoding="utf-8")
        elif step.runnable and step.slow == slow:
            found += differences(step, *run(step.command, folder))
    return found


def update_page(page: Path, folder: Path, slow: bool = True) -> int:
    """Rewrite the output of every runnable example of ``page`` (the slow ones too unless ``slow`` is False) with
    what the command prints now, keeping a block's ``...`` cuts. The page is read again before it is written, so
    an edit made meanwhile elsewhere in it is kept. Returns how many blocks changed."""
    printed: dict[tuple[int, str], list[str]] = {}
    for number, step in enumerate(steps(page)):
        if isinstance(step, PageFile):
            (folder / step.name).write_text(step.text, encoding="utf-8")
        elif step.runnable and (slow or not step.slow):
            _, text = run(step.command, folder)
            printed[number, step.command] = [line.rstrip() for line in text.rstrip("\n").splitlines()]
    lines = page.read_text(encoding="utf-8").splitlines()
    changed = 0
    for number, step in reversed(list(enumerate(steps(page)))):
        if isinstance(step, Example) and (number, step.command) in printed:
            new = _trimmed(step.output, printed[number, step.command])
            changed += step.output != new
            lines[step.output_from : step.end] = new
    page.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return changed


def _trimmed(shown: list[str], printed: list[str]) -> list[str]:
    """``printed`` cut where the page cut its block: its first part as many lines from the top as the page showed,
    each part after a ``...`` as many lines from the printed line that starts as that part's first line does (or,
    for a last part whose line is not found, from the bottom)."""
    parts, part = [], []
    for line in shown:
        if line.strip() in TRIM:
            parts.append(part)
            part = []
        else:
            part.append(line)
    parts.append(part)
    if len(parts) == 1:
        return printed
    kept, at = printed[: len(parts[0])], len(parts[0])
    for index, part in enumerate(parts[1:], start=1):
        kept.append("...")
        if not part:
            continue
        label = _label(part[0])
        start = next((i for i in range(at, len(printed)) if label and _label(printed[i]) == label), None)
        if start is None and index == len(parts) - 1:
            start = max(at, len(printed) - len(part))
        if start is not None:
            kept += printed[start : start + len(part)]
            at = start + len(part)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to handle (default: README.md and docs/*.md)")
    parser.add_argument("--update", action="store_true", help="rewrite the output blocks with the current output")
    parser.add_argument("--fast", action="store_true", help="leave the examples marked slow out")
    arguments = parser.parse_args()
    chosen = [path.resolve() for path in arguments.pages] or pages()
    found: list[str] = []
    for page in chosen:
        with tempfile.TemporaryDirectory() as folder:
            if arguments.update:
                print(f"{page.relative_to(ROOT)}: {update_page(page, Path(folder), not arguments.fast)} blocks changed")
            else:
                for slow in (False, True)[: 1 if arguments.fast else 2]:
                    found += check_page(page, Path(folder), slow)
    print("\n".join(found) or ("" if arguments.update else "every example's figures match its page"))
    raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
