"""Multi-process generation through torch.distributed: diffusers' context parallelism (Ulysses, ring) and
tensor parallelism, CFG parallelism, and data parallelism (requests split across ranks).

``launch`` starts or joins the processes; each runs ``rank_run``: the one measured-run lifecycle
(``runs.lifecycle``) with its ``place`` and its ``group`` (join, barriers, the parallel layers from
``context_parallel`` and ``cfg_parallel``, failure propagation); ``group_result`` and ``merge`` turn the ranks'
results into the one stored result, ``communication`` counts what the collectives move, ``scaling`` compares
with the one-device run.
"""
