"""The bytes inductor's fused kernels move, from the operators as they run: a dataflow over tensor storages.

A chain is the fusible operators between two library kernels (``operators.OperatorTally``'s chains). Fused, it
reads once each tensor it consumes that was made outside it (by a library kernel, an earlier chain, a parameter,
an input) and writes once each tensor it makes that is used outside it (read by a later operator outside the chain,
or still alive when the call ends: returned or kept); what only the chain itself reads stays in registers. That is
what inductor's own estimate counts per generated kernel: each buffer a node reads or writes once, the writes no
node outside the fused node reads dropped (torch 2.13 torch/_inductor/scheduler.py:1680-1820,
``get_read_write_buffer_accesses``, ``is_materialized``). Views share their storage, so tensors are followed by
storage; a storage read through several views is charged each distinct view once, at most the storage's size.

Repeated blocks replayed (``replay.py``) apply the bytes their recorded run counted, and their rebuilt outputs
of the sizes the recorded run left unwritten are written once a later operator reads them, as the recorded
ones would have been. A replayed block's reads of what it is handed are as its recorded run found them (written
already or not), so the count is within 2% of every block run (FLUX.1-dev's transformer -1.1%, SD 1.5's UNet +0.3%
at 256 px: tests/test_compiled_time.py).
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch


def storage_key(tensor: torch.Tensor) -> int:
    """The identity of ``tensor``'s storage (views of one storage share it)."""
    return tensor.untyped_storage()._cdata


def storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def view_bytes(tensor: torch.Tensor) -> int:
    """The bytes of ``tensor``'s elements, at most its storage's."""
    return min(tensor.numel() * tensor.element_size(), storage_bytes(tensor))


class Pending:
    """A storage written by a chain, not yet counted: the chain, the bytes written, its order among the writes,
    and a weak reference to the storage (once it dies, it was never read outside its chain: forgotten)."""

    __slots__ = ("chain", "nbytes", "serial", "ref")

    def __init__(self, chain: int, nbytes: int, serial: int, tensor: torch.Tensor, pending: dict) -> None:
        self.chain, self.nbytes, self.serial = chain, nbytes, serial
        key = storage_key(tensor)
        self.ref = weakref.ref(
            tensor.untyped_storage(), lambda _: pending.pop(key, None) if pending.get(key) is self else None
        )


class FusedBytes:
    """The running count (``total``) of the bytes the fused chains of one call move once fused."""

    def __init__(self) -> None:
        self.total = 0
        self.chain = 0  # the open chain's number; 0: none open (the last operator was a library kernel)
        self.chains = 0
        self.pending: dict[int, Pending] = {}
        self.writes = 0  # the pending writes made so far (their ``serial``)
        # per storage, the views the open chain read from outside it, with a weak reference to the storage: a key
        # (the storage's address) reused by a new storage after the old one died starts afresh
        self.read: dict[int, tuple[weakref.ref, set]] = {}
        self.read_bytes: Counter[int] = Counter()
        self.rebuilt: Counter[int] = Counter()  # sizes of a replayed block's outputs left to write (``apply``)

    def alive(self, key: int) -> Pending | None:
        """The storage's pending write, where that storage is still the one written."""
        found = self.pending.get(key)
        if found is not None and found.ref() is None:
            del self.pending[key]
            return None
        return found

    def flush(self, key: int) -> None:
        """Count a pending write of another chain: its tensor is used outside that chain."""
        found = self.alive(key)
        if found is not None and found.chain != self.chain:
            self.total += found.nbytes
            del self.pending[key]

    def library(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        """A library kernel (matmul, convolution, attention): it reads every chain's tensors it takes from memory,
        and ends the open chain."""
        self.chain = 0
        for tensor in inputs:
            self.flush(storage_key(tensor))
        for tensor in outputs:  # what it overwrites was not read by anyone
            self.pending.pop(storage_key(tensor), None)

    def fused(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], extra_read: int = 0) -> None:
        """A fusible operator, in the open chain or starting one: reads what the chain did not make, makes
        ``outputs`` (written once used outside it). ``extra_read``: bytes read beside ``inputs`` (an embedding's
        rows)."""
        if not self.chain:
            self.chains += 1
            self.chain = self.chains
            self.read.clear()
            self.read_bytes.clear()
        self.total += extra_read
        for tensor in inputs:
            key = storage_key(tensor)
            found = self.alive(key)
            if found is not None and found.chain == self.chain:
                continue  # made in this chain: in registers
            self.flush(key)
            view = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
            entry = self.read.get(key)
            if entry is None or entry[0]() is None:
                entry = self.read[key] = (weakref.ref(tensor.untyped_storage()), set())
                self.read_bytes[key] = 0
            views = entry[1]
            if view not in views:
                views.add(view)
                size = storage_bytes(tensor)
                added = min(view_bytes(tensor), size - self.read_bytes[key])
                self.read_bytes[key] += added
                self.total += added
        for tensor in outputs:
            key = storage_key(tensor)
            found = self.alive(key)
            if found is not None and found.chain != self.chain:
                self.flush(key)  # overwritten in part: the other chain's part is kept
                found = None
            written = min(view_bytes(tensor) + (found.nbytes if found is not None else 0), storage_bytes(tensor))
            self.pend(self.chain, tensor, written)

    def pend(self, chain: int, tensor: torch.Tensor, nbytes: int) -> None:
        """``tensor``'s storage written by ``chain``: counted once read outside it."""
        self.writes += 1
        self.pending[storage_key(tensor)] = Pending(chain, nbytes, self.writes, tensor, self.pending)

    def allocated(self, tensor: torch.Tensor) -> None:
        """A replayed block's output storage allocated again: pending, in the open chain, where the recorded
        block left one of its size unwritten."""
        size = storage_bytes(tensor)
        if self.rebuilt[size] > 0:
            self.rebuilt[size] -= 1
            self.pend(self.chain or -1, tensor, size)  # -1: a chain of the block's that ended inside it

    def finish(self) -> int:
        """The call's total: the writes of tensors still alive (returned or kept) counted."""
        for key in list(self.pending):
            found = self.alive(key)
            if found is not None:
                self.total += found.nbytes
        self.pending.clear()
        return self.total

    # a replay recorder's part (``operators.OperatorTally``'s begin, end and apply)
    def begin(self) -> tuple[int, int, int]:
        return self.total, self.chain, self.writes

    def end(self, begun: tuple[int, int, int]) -> tuple[int, str, Counter[int]]:
        """The bytes the block counted, how it left the chain ("closed" by a library kernel, "new": in a chain it
        opened, "same"), and the sizes of the storages it wrote whole and left unwritten (its outputs)."""
        total, chain, writes = begun
        ended = "closed" if not self.chain else "same" if self.chain == chain else "new"
        unwritten = Counter(
            found.nbytes
            for found in list(self.pending.values())
            if found.serial > writes and found.ref() is not None and found.ref().nbytes() == found.nbytes
        )
        return self.total - total, ended, unwritten

    def apply(self, effect: tuple[int, str, Counter[int]]) -> None:
        counted, ended, unwritten = effect
        self.total += counted
        if ended == "closed":
            self.chain = 0
        elif ended == "new":
            self.chains += 1
            self.chain = self.chains
            self.read.clear()
            self.read_bytes.clear()
        self.rebuilt = Counter(unwritten)
