"""`diffmeter doctor`: what this machine can measure."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from diffmeter.cli.app import command, console
from diffmeter.cli.options import AsJson


@command()
def doctor(
    as_json: AsJson = False,
    remeasure_cpu: Annotated[
        bool, typer.Option("--remeasure-cpu", help="measure this CPU's peaks again, replacing the stored ones")
    ] = False,
) -> None:
    """Say what this machine can measure: GPUs and their peaks, energy counters, attention kernels, extras."""
    from diffmeter.doctor import examine
    from diffmeter.report.doctor_table import doctor_report

    if remeasure_cpu:
        from diffmeter.predict.cpu_peaks import remeasure

        remeasure()
    found = examine()  # loads the libraries, quietly, only when it probes (doctor._probed)
    if as_json:
        print(json.dumps(found.model_dump(mode="json"), indent=2))
    else:
        console.print(doctor_report(found))
