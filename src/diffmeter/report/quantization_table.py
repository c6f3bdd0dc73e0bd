"""The ``--quantize`` backends as a table: types, which run on this CPU, the extra that installs each."""

from __future__ import annotations

from rich.markup import escape

from diffmeter.optimize.quantization_backends import BackendRow
from diffmeter.report.layout import Column, FittedTable


def backends_table(rows: list[BackendRow]) -> FittedTable:
    table = FittedTable(
        "quantization backends: --quantize [NAME=]BACKEND:TYPE (NAME: a component; default the denoiser)",
        [
            Column("backend", justify="left"),
            Column("types", justify="left"),
            Column("on this CPU", justify="left"),
            Column("install", justify="left", drop=1),
            Column("what it is", justify="left", drop=2),
        ],
        caption="--quantize int8 | fp8: the older names, torchao weight-only applied after loading (predicted by "
        "profile --gpu and fit); gguf and bfl read a pre-quantized file (--weights FILE), nunchaku and autoround a "
        "component folder (--weights DIR)",
    )
    for row in rows:
        kinds: dict[str, list[str]] = {}  # reason -> the types it refuses
        for kind, reason in row.not_on_cpu.items():
            kinds.setdefault(reason, []).append(kind)
        if not kinds:
            cpu = "all types"
        elif len(row.not_on_cpu) == len(row.types) and len(kinds) == 1:
            cpu = "no: " + next(iter(kinds))
        else:
            cpu = "; ".join(f"not {', '.join(names)}: {reason}" for reason, names in kinds.items())
        install = f"pip install 'diffmeter[{row.extra}]'" + ("" if row.installed else " (not installed)")
        table.add_row(row.name, escape(", ".join(row.types)), escape(cpu), escape(install), escape(row.summary))
    return table
