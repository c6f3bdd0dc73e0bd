"""The host link of a CUDA run: host-to-device (H2D) and device-to-host (D2H) copy rates with pinned and pageable
host memory, pageable pages fresh (never touched, as each ``.to("cpu")`` of diffusers' model offload allocates) or
touched, measured once per CUDA run before loading, so an offloaded run's time can be compared across hosts."""

from __future__ import annotations

import resource
import statistics
import time

from pydantic import BaseModel

from diffmeter import units

#: bytes per copy (above glibc's largest mmap threshold, 32 MiB, DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, malloc.c:
#: offload's ``.to("cpu")`` of a layer this size gets memory newly mapped from the kernel)
COPY_BYTES = 64 * 2**20
#: copies of each kind; the rate is their median (a fresh buffer for every fresh copy)
REPEATS = 3
#: what a run without a GPU says in place of the rates
NO_LINK = "host link: not measured (a CPU run moves no data over a host link)"
KINDS = ("pageable_fresh", "pageable_touched", "pinned")


class HostLink(BaseModel):
    """Copy rates in GB/s (10^9 bytes per second): the median of ``repeats`` copies of ``copy_bytes`` each, timed by
    the host clock between two synchronizations of the device, so a copy's whole wall time counts."""

    device: str
    copy_bytes: int
    repeats: int
    h2d_pageable_fresh_gb_s: float
    h2d_pageable_touched_gb_s: float
    h2d_pinned_gb_s: float
    d2h_pageable_fresh_gb_s: float
    d2h_pageable_touched_gb_s: float
    d2h_pinned_gb_s: float
    #: minor page faults of the process during the fresh D2H copies: about copy_bytes / 4 KiB per copy (fewer with
    #: huge pages); near none would mean the buffers were not fresh
    d2h_fresh_page_faults: int
    #: the probe's own wall time, seconds
    probe_s: float

    def text(self) -> str:
        """ "host link: H2D pageable fresh 1.20 GB/s, ..." as every offload figure names it."""

        def rates(direction: str) -> str:
            words = {"pageable_fresh": "pageable fresh", "pageable_touched": "pageable touched", "pinned": "pinned"}
            return ", ".join(
                f"{direction.upper()} {words[kind]} {self.rate(direction, kind):,.2f} GB/s" for kind in KINDS
            )

        return (
            f"host link of {self.device}: {rates('h2d')}; {rates('d2h')} (median of {self.repeats} copies of "
            f"{units.gib(self.copy_bytes)} each, measured before loading)"
        )

    def rate(self, direction: str, kind: str) -> float:
        """GB/s of ``direction`` ("h2d" or "d2h") with host memory ``kind`` (``KINDS``)."""
        return getattr(self, f"{direction}_{kind}_gb_s")


def link_line(link: HostLink | None, cuda: bool) -> str:
    """The host link's rates, or why a run (``cuda``: on a GPU) has none."""
    if link is not None:
        return link.text()
    return "host link: not measured (the run was stored before diffmeter measured it)" if cuda else NO_LINK


def fresh_host(size: int):
    """A pageable host buffer of ``size`` bytes whose pages were never touched: an anonymous mapping of its own, so
    its first write faults every page in (``torch.empty`` may hand back pages the process touched before: seen
    here with 0 faults after other tests in the same process, whatever the size)."""
    import mmap

    import torch

    return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)


def pinned_host(size: int):
    """A page-locked host buffer of ``size`` bytes (CUDA's host allocator)."""
    import torch

    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def measure(device) -> HostLink:
    """Every rate on ``device`` (a CUDA device), about 1.1 GB moved in all (under a second at PCIe rates)."""
    import torch

    started = time.perf_counter()
    seconds, faults = _copies(device)
    torch.cuda.empty_cache()  # its buffers freed: the run starts from the device's memory as it found it
    rates = {f"{name}_gb_s": COPY_BYTES / statistics.median(times) / 1e9 for name, times in seconds.items()}
    return HostLink(
        device=str(device),
        copy_bytes=COPY_BYTES,
        repeats=REPEATS,
        d2h_fresh_page_faults=faults,
        probe_s=time.perf_counter() - started,
        **rates,
    )


def _copies(device) -> tuple[dict[str, list[float]], int]:
    """Each kind's copy seconds, and the minor page faults during the fresh D2H copies."""
    import torch

    on_device = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    pinned = pinned_host(COPY_BYTES)
    touched = fresh_host(COPY_BYTES).fill_(1)  # written: every page faulted in
    on_device.copy_(pinned)  # the first copies' one-time setup outside the figures
    pinned.copy_(on_device)
    seconds: dict[str, list[float]] = {}
    for _ in range(REPEATS):
        source = fresh_host(COPY_BYTES)  # allocated outside the timed copy; its pages first read inside it
        _time(seconds, "h2d_pageable_fresh", device, lambda s=source: on_device.copy_(s))
        _time(seconds, "h2d_pageable_touched", device, lambda: on_device.copy_(touched))
        _time(seconds, "h2d_pinned", device, lambda: on_device.copy_(pinned))
    faults = 0
    for _ in range(REPEATS):
        target = fresh_host(COPY_BYTES)  # what offload's .to("cpu") writes into: pages first touched by the copy
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        _time(seconds, "d2h_pageable_fresh", device, lambda t=target: t.copy_(on_device))
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        _time(seconds, "d2h_pageable_touched", device, lambda: touched.copy_(on_device))
        _time(seconds, "d2h_pinned", device, lambda: pinned.copy_(on_device))
    return seconds, faults


def _time(seconds: dict[str, list[float]], name: str, device, copy) -> None:
    """One copy's wall seconds, the device synchronized before and after it."""
    import torch

    torch.cuda.synchronize(device)
    start = time.perf_counter()
    copy()
    torch.cuda.synchronize(device)
    seconds.setdefault(name, []).append(time.perf_counter() - start)
