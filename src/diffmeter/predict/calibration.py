"""The calibrations of the expected time: achieved fractions of the roofline per operator kind, the GPU's cost
per kernel and per attention score, the host's cost of issuing the work, and the board power, per device class
("cpu", "cuda:ARCHITECTURE"), shipped in ``data/efficiency.json`` (written by ``benchmarks/roofline_cpu.py`` and
``benchmarks/calibrate_published.py``); an architecture without one borrows its neighbour's, widened."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources

from pydantic import BaseModel

from diffmeter.predict.devices import Device
from diffmeter.predict.host_time import HostCalibration
from diffmeter.predict.peaks import PRECISION, conv_key
from diffmeter.predict.schema import CallWork, OperatorWork

#: the keys of the rates measured on convolutions, one per precision
CONVOLUTIONS = frozenset(conv_key(precision) for precision in PRECISION.values())


class Calibration(BaseModel):
    """Achieved fractions of the roofline per operator kind ([lowest, highest] seen), the device's own time per
    operator (seconds: outside operators on a CPU, between kernels on a GPU), the host's cost of issuing the work
    and the board power, fitted on the runs ``source`` names."""

    source: str
    fractions: dict[str, tuple[float, float]]
    overhead_s: tuple[float, float]
    #: seconds per attention score beyond its FLOPs (``OperatorGroup.scores``), where the fit has one
    score_s: tuple[float, float] | None = None
    #: the least eager bound per operator among the runs it was fitted on (seconds): a run under it is launch-bound
    #: beyond anything the fit saw
    least_bound_per_operator_s: float | None = None
    #: the average board power while generating, a share of the card's TDP, and the energy range's factor w,
    #: fitted on published runs' energy (``fit_energy``), with where they come from
    power_fraction: float | None = None
    energy_width: float | None = None
    energy_source: str | None = None
    #: the board power's share of TDP while the GPU waits for the host (``energy``), where the fit has one
    idle_power_fraction: float | None = None
    #: the host's cost of issuing the work (CUDA calibrations: ``host_time``); None: no host term (a CPU)
    host: HostCalibration | None = None
    #: the held-out figure of this calibration's own range, as its ``source`` ends with it
    held_out: str | None = None
    #: per table card with published runs, what its own runs showed in that test (a card can sit off its
    #: architecture's fit): a prediction on that card says it beside ``held_out`` (``source_for``)
    held_out_by_card: dict[str, str] | None = None
    #: the factor a borrowing architecture's range is widened by: the error measured when each architecture was
    #: predicted by its neighbour's fit, fitted without it (``benchmarks/calibrate_published.py``)
    borrowed_width: float | None = None
    #: the held-out figure of a borrowed range, widened as ``borrowed`` widens it: what a borrower's source claims
    #: in place of ``held_out`` (``fit_holdout.widened_test``)
    borrowed_held_out: str | None = None
    #: that test's figure on one architecture's own runs, per architecture that has published runs: a borrower of
    #: that architecture says it beside the pooled one
    borrowed_held_out_by: dict[str, str] | None = None
    #: the measured peaks the fractions are of, when the fit was made (a CPU's: TFLOP/s per ``Device.tflops`` key;
    #: its copy rate is named in ``source``): each fraction applies to the same peak measured on the machine
    #: predicted (``fitted_units``)
    fitted_tflops: dict[str, float] | None = None
    #: fits of their own for calls the fractions above were not fitted on, by ``variant_name`` ("bfloat16",
    #: "compiled", "compiled bfloat16"): a CPU's (``benchmarks/roofline_cpu_variants.py``); with them, a call of a
    #: variant without a fit gets no range. None (CUDA): these fractions price every call, any dtype, compiled or not
    variants: dict[str, Calibration] | None = None
    #: the power limit's exponent the fit was made with and chosen by (``power_limit``: each peak at the card's share
    #: of its die's reference's power per TFLOP to this power); None: no power term (a CPU)
    power_exponent: float | None = None

    def missing_for(self, work: OperatorWork) -> str | None:
        """Why this calibration cannot price ``work``: calls of a variant it has no fit for; None where it can."""
        if self.variants is None:
            return None
        missing = sorted(v for v in variants_of(work) if v and v not in self.variants)
        if not missing:
            return None
        return (
            f"the calibration has no fit for {' or '.join(missing)} calls (fitted: float32 eager, "
            f"{', '.join(self.variants)}: benchmarks/roofline_cpu_variants.py)"
        )

    def fits_for(self, work: OperatorWork) -> list[tuple[Calibration, list[CallWork]]]:
        """``work``'s calls with the fit that prices each: all under this one where it has no variants, else each
        variant's calls under its own fit (``missing_for`` says where one lacks)."""
        if self.variants is None:
            return [(self, list(work.calls))]
        return [(self.variants[name] if name else self, calls) for name, calls in variants_of(work).items()]

    def source_for(self, work: OperatorWork, card: str = "") -> str:
        """The sources of the fits that price ``work``: this one's, or each variant's it uses; on ``card`` (a table
        row's name), with what its own published runs showed where it has some."""
        sources = "; ".join(dict.fromkeys(fit.source for fit, _ in self.fits_for(work)))
        if not card or self.held_out_by_card is None:
            return sources
        own = self.held_out_by_card.get(card) or f"no published run on the {card} itself in that test"
        return f"{sources}; {own}"


def variant_name(dtype: str, compiled: bool) -> str:
    """The fit a call at ``dtype`` (``compiled``: torch.compile's code) needs from a calibration with variants:
    "" (float32 eager: the calibration's own fractions), "bfloat16", "compiled", "compiled bfloat16"."""
    return " ".join((["compiled"] if compiled else []) + ([dtype] if dtype != "float32" else []))


def variants_of(work: OperatorWork) -> dict[str, list[CallWork]]:
    """``work``'s calls by ``variant_name``, each at its call's dtype (an operator kept at another dtype inside a
    call, T5's float32 ``wo``, is priced with its call)."""
    found: dict[str, list[CallWork]] = {}
    for call in work.calls:
        found.setdefault(variant_name(call.dtype or work.dtype, call.compiled), []).append(call)
    return found


def fitted_units(device: Device, calibration: Calibration | None) -> Device:
    """``device`` as ``calibration``'s fractions read it: without the rates measured on convolutions where the fit
    had none (its convolutions were charged the matmul peak, so their fractions are of that peak)."""
    if calibration is None or calibration.fitted_tflops is None or on_convolutions(calibration):
        return device
    kept = {key: rate for key, rate in device.tflops.items() if key not in CONVOLUTIONS}
    return device if kept == device.tflops else device.model_copy(update={"tflops": kept})


def unfitted_peak(device: Device, calibration: Calibration | None) -> str | None:
    """Why ``calibration``'s fractions cannot apply on ``device``: they are of rates measured on convolutions, and
    the device has a precision without one (a CPU's peaks stored before convolutions were measured); else None."""
    if calibration is None or not on_convolutions(calibration):
        return None
    lacking = sorted(conv_key(p) for p in PRECISION.values() if p in device.tflops and conv_key(p) not in device.tflops)
    if not lacking:
        return None
    return (
        f"the calibration's convolution fractions are of measured convolution rates, and the stored peaks lack "
        f"{', '.join(lacking)} (measured before convolutions were): `diffmeter doctor --remeasure-cpu` measures them"
    )


def on_convolutions(calibration: Calibration) -> bool:
    """Whether ``calibration`` was fitted with convolutions charged the rate measured on them."""
    return any(key in CONVOLUTIONS for key in calibration.fitted_tflops or {})


def shipped_power_exponent() -> float | None:
    """The power limit's exponent the shipped CUDA calibrations were fitted with (one fit makes them all)."""
    return next((c.power_exponent for kind, c in calibrations().items() if kind.startswith("cuda:")), None)


def calibrations() -> dict[str, Calibration]:
    """The shipped calibrations: "cpu", and "cuda:ARCHITECTURE" (eager runs)."""
    text = resources.files("diffmeter.predict").joinpath("data/efficiency.json").read_text()
    return {kind: Calibration.model_validate(found) for kind, found in json.loads(text).items()}


#: where an architecture without a fit of its own borrows one: the fractions are of each card's own peak and
#: bandwidth, so a neighbour's apply scaled by the card's datasheet figures. GeForce Blackwell (sm_120) borrows
#: Ada's, not the B200's: it "keeps the Ampere-style warp-level mma.sync programming model: no WGMMA, no tcgen05, no
#: Tensor Memory" and sm_86/89's ~100 KB of shared memory per SM, so its libraries run their sm_8x kernels on it
#: (github.com/Dao-AILab/flash-attention PRs #2634 and #2592); with the B200's fit an RTX 5090 came out slower
#: than an RTX 4090 on every model, against its higher peaks and bandwidth
NEIGHBOURS = {
    "blackwell": "hopper",
    "rtx-blackwell": "ada",
    "ada": "ampere",
    "turing": "ampere",
    "volta": "ampere",
    "ampere": "hopper",
}


def neighbours_of(architecture: str | None) -> Iterator[str]:
    """The architectures ``architecture`` borrows from, nearest first (``NEIGHBOURS``, each once)."""
    seen = {architecture}
    lender = NEIGHBOURS.get(architecture)
    while lender and lender not in seen:
        yield lender
        seen.add(lender)
        lender = NEIGHBOURS.get(lender)


def calibration_for(device: Device) -> Calibration | None:
    """The device's calibration: its kind's ("cpu"), its architecture's, or the nearest neighbour's (said in the
    source); None where there is none."""
    shipped = calibrations()
    if device.kind != "cuda":
        return shipped.get(device.kind)
    if (own := shipped.get(f"cuda:{device.architecture}")) is not None:
        return own
    lender = next((a for a in neighbours_of(device.architecture) if f"cuda:{a}" in shipped), None)
    return borrowed(shipped[f"cuda:{lender}"], lender, device.architecture, device.name) if lender else None


def borrowed(found: Calibration, lender: str, architecture: str | None, card: str = "") -> Calibration:
    """``lender``'s calibration for ``architecture`` (on ``card``), its range widened by the error measured when
    each architecture was predicted by its neighbour's fit (``Calibration.borrowed_width``), said in its source with
    the held-out figure of such a widened range (``borrowed_held_out``, and the architecture's own runs' where it has
    some, ``borrowed_held_out_by``) in place of the lender's own."""
    borrower = f"{architecture} ({card})" if card else str(architecture)
    width = found.borrowed_width or 1.0

    def wider(pair):
        return (pair[0] / width, pair[1] * width)

    fitted = found.source.removesuffix(f"; {found.held_out}") if found.held_out else found.source
    source = f"{fitted}; borrowed for {borrower} from {lender}" + (
        f", its range widened {width:.2f}x (the error of an architecture predicted by its neighbour's fit)"
        if found.borrowed_width
        else ""
    )
    claim = found.borrowed_held_out
    if claim and (own := (found.borrowed_held_out_by or {}).get(architecture)):
        claim = f"{claim}; {own}"
    if claim:  # in place of the lender's own figure
        source += f"; {claim}"
    update = {
        "source": source,
        "held_out": claim,
        "held_out_by_card": None,  # the lender's cards' own runs: the borrower's architecture's are in ``claim``
        "fractions": {kind: wider(pair) for kind, pair in found.fractions.items()},
        "overhead_s": wider(found.overhead_s),
        "score_s": wider(found.score_s) if found.score_s else None,
    }
    if found.host:
        terms = HostCalibration.model_fields
        update["host"] = HostCalibration(**{term: wider(getattr(found.host, term)) for term in terms})
    return found.model_copy(update=update)
