"""`diffmeter gpus`: the GPU table every prediction reads, one card a row, with the figures each prediction uses."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter import units
from diffmeter.report.layout import Column, FittedTable


class GpuRow(BaseModel):
    """One table GPU as ``--gpu`` names it, its figures in their units, and where they were read."""

    name: str
    architecture: str | None
    #: what the driver reports (nvidia-smi's MiB as GiB), or the datasheet's less the measured reserve
    memory_gib: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    bandwidth_gb_s: float | None
    tdp_w: float | None
    host_link: str | None
    #: GPU-to-GPU, both directions summed; None: no NVLink found for the card
    nvlink_gb_s: float | None
    source: str


def gpu_rows() -> list[GpuRow]:
    """Every table GPU, in the table's order."""
    from diffmeter.predict.devices import nvlinks, of_row
    from diffmeter.predict.peaks import PEAKS

    links = nvlinks()
    rows = []
    for row in PEAKS:
        device = of_row(row)
        rows.append(
            GpuRow(
                name=device.name,
                architecture=device.architecture,
                memory_gib=device.memory_bytes / 2**30 if device.memory_bytes else None,
                bf16_tflops=device.tflops.get("bf16"),
                fp8_tflops=device.tflops.get("fp8"),
                bandwidth_gb_s=device.bandwidth_bytes_per_s / 1e9 if device.bandwidth_bytes_per_s else None,
                tdp_w=device.tdp_w,
                host_link=device.host_link,
                nvlink_gb_s=links.get(device.name, {}).get("gb_s"),
                source=device.source,
            )
        )
    return rows


def gpu_table(rows: list[GpuRow]) -> FittedTable:
    """The rows as the terminal shows them; sources in ``--json``."""
    table = FittedTable(
        "GPUs diffmeter predicts for (--gpu NAME: a name or a unique part of one, e.g. h100, 4090, 'rtx 4070')",
        [
            Column("GPU", justify="left"),
            Column("architecture", justify="left", drop=2),
            Column("memory"),
            Column("bf16 dense"),
            Column("fp8 dense", drop=1),
            Column("bandwidth"),
            Column("TDP", drop=1),
            Column("host link", justify="left", drop=3),
            Column("NVLink", drop=2),
        ],
    )
    for row in rows:
        table.add_row(
            row.name,
            row.architecture or "-",
            units.gib(row.memory_gib * 2**30) if row.memory_gib else "-",
            f"{row.bf16_tflops:g} TFLOP/s" if row.bf16_tflops else "-",
            f"{row.fp8_tflops:g} TFLOP/s" if row.fp8_tflops else "-",
            f"{row.bandwidth_gb_s:,.0f} GB/s" if row.bandwidth_gb_s else "-",
            f"{row.tdp_w:g} W" if row.tdp_w else "-",
            row.host_link or "-",
            f"{row.nvlink_gb_s:g} GB/s" if row.nvlink_gb_s else "-",
        )
    table.caption = (
        "memory: what the driver reports (nvidia-smi's MiB, in GiB), or the datasheet's less the reserve measured "
        "cards of its kind show; peaks dense (half the sparse figure); bandwidth and NVLink (both directions summed) "
        "in decimal GB/s as datasheets state them; each figure's source in --json. A card not listed: profile and "
        "fit take its figures with --gpu-spec."
    )
    return table
