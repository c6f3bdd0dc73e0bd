"""A technique as a run asks for it and stores it: its name and parameters. Here, not in ``optimize/`` (whose package
imports every technique, and torch), so reading a stored run imports no technique."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class OptimizationSpec(BaseModel):
    """A technique asked for by name, with its parameters (as stored in results)."""

    model_config = ConfigDict(frozen=True)

    name: str
    params: dict[str, Any] = {}
