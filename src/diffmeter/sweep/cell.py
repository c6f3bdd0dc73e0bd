"""One sweep cell in its own process: ``python -m diffmeter.sweep.cell SPEC_JSON OUT PARENT_PID``.

The spec is a BenchSpec as JSON; the run is exactly ``diffmeter bench`` (same folder, same
results.json). The process dies with the sweep that started it, so a killed sweep leaves no
cell running behind it. Exit codes: 0 stored complete, 3 stored failed, 2 refused, 130 Ctrl-C."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

STORED_FAILED = 3


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the sweep that started it dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the sweep stops its cells itself when it can
        return
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def main(argv: list[str]) -> int:
    spec_file, out, parent = argv
    _die_with_parent(int(parent))
    from diffmeter.quiet import load_libraries

    load_libraries()
    from diffmeter.errors import DiffmeterError
    from diffmeter.execute import bench
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec.model_validate_json(Path(spec_file).read_text(encoding="utf-8"))
    try:
        result, folder = bench(spec, out=out, force=True)
    except DiffmeterError as error:
        print(f"error: {error}", file=sys.stderr)
        return STORED_FAILED if "recorded as a failed result" in str(error) else 2
    except KeyboardInterrupt:
        return 130
    print(f"stored {result.status} result in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
