"""The `diffmeter` command line: one module per command group, options shared from ``options``.

Modules import torch, diffusers and the rest only inside the commands that need them, so
``--help`` and ``--version`` start fast. Commands are listed in the order imported here.
"""
# isort: skip_file

from diffmeter.cli.app import app, main
from diffmeter.cli import profile  # noqa: F401  (registers profile)
from diffmeter.cli import models  # noqa: F401  (registers models)
from diffmeter.cli import fit  # noqa: F401  (registers fit)
from diffmeter.cli import gpus  # noqa: F401  (registers gpus)
from diffmeter.cli import bench  # noqa: F401  (registers bench, show)
from diffmeter.cli import optimizations  # noqa: F401  (registers optimizations, ladder)
from diffmeter.cli import sweep  # noqa: F401  (registers sweep, table)
from diffmeter.cli import report  # noqa: F401  (registers report, compare)
from diffmeter.cli import doctor  # noqa: F401  (registers doctor)

__all__ = ["app", "main"]
