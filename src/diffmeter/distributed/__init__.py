"""Multi-process generation through torch.distributed: diffusers' context parallelism
(Ulysses, ring) and data parallelism (requests split across ranks).

``support`` decides before loading, ``launch`` starts or joins the processes, ``context_parallel``
enables diffusers' implementation on the denoiser, ``rank_run`` measures on one rank and
``merge`` turns the ranks' results into the one stored result.
"""
