"""A fault planted in one rank of a parallel run, for tests/test_multigpu.py (put this folder first on
PYTHONPATH; Python imports ``sitecustomize`` at start-up, in every process the launcher spawns).

RANK_FAULT_RANK=N picks the rank (torchrun's RANK, which the launcher sets inside each process after it starts,
so it is read at each call); RANK_FAULT says what happens in that rank's attention calls
(torch.nn.functional.scaled_dot_product_attention, which diffusers' attention looks up at each call):
``oom:K`` raises CUDA's out-of-memory error at the K-th call (calls on the meta device, the checks' shape
probes, not counted); ``sleep:K:S`` sleeps S seconds in each of the
first K calls. Out of memory cannot be made on purpose on this CPU; everything else in the run is real.

TP_ON_CPU=1 adds "cpu" to the devices diffusers runs tensor parallelism on (``_SUPPORTED_TP_DEVICES``: cuda,
neuron, tpu, xpu), so that its real sharding and collectives run over gloo here; no CUDA exists to run them on.
"""

import os
import time

if os.environ.get("RANK_FAULT"):
    import torch

    kind, *arguments = os.environ["RANK_FAULT"].split(":")
    attention = torch.nn.functional.scaled_dot_product_attention
    calls = [0]

    def planted(*args, **kwargs):
        query = kwargs.get("query", args[0] if args else None)
        if os.environ.get("RANK") == os.environ.get("RANK_FAULT_RANK") and query.device.type != "meta":
            calls[0] += 1
            if kind == "oom" and calls[0] == int(arguments[0]):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (planted by the test)")
            if kind == "sleep" and calls[0] <= int(arguments[0]):
                time.sleep(float(arguments[1]))
        return attention(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = planted

if os.environ.get("TP_ON_CPU"):
    import diffusers.hooks.tensor_parallel as tensor_parallel

    tensor_parallel._SUPPORTED_TP_DEVICES = (*tensor_parallel._SUPPORTED_TP_DEVICES, "cpu")
