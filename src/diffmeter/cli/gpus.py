"""`diffmeter gpus`: the GPUs --gpu names, with the figures predictions use."""

from __future__ import annotations

import json

from diffmeter.cli.app import command, console
from diffmeter.cli.options import AsJson


@command()
def gpus(as_json: AsJson = False) -> None:
    """List the GPUs profile --gpu and fit predict for: memory as the driver reports it, dense peaks, bandwidth,
    TDP, host link and NVLink, each figure with its source in --json."""
    from diffmeter.report.gpu_list import gpu_rows, gpu_table

    rows = gpu_rows()
    if as_json:
        print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        console.print(gpu_table(rows))
