"""`diffmeter doctor`: what this machine can measure."""

from __future__ import annotations

import json

from diffmeter.cli.app import command, console
from diffmeter.cli.options import AsJson
from diffmeter.quiet import load_libraries


@command()
def doctor(as_json: AsJson = False) -> None:
    """Say what this machine can measure: GPUs and their peaks, energy counters, attention kernels, extras."""
    load_libraries()
    from diffmeter.doctor import examine
    from diffmeter.quiet import quiet_libraries
    from diffmeter.report.doctor_table import doctor_report

    with quiet_libraries():
        found = examine()
    if as_json:
        print(json.dumps(found.model_dump(mode="json"), indent=2))
    else:
        console.print(doctor_report(found))
