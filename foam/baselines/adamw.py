"""The AdamW recipe: torch's AdamW, with the paper's module-wise-lr control ``alpha``."""

from __future__ import annotations

from typing import Any

import torch

from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups


@register("adamw", alpha=1.0)
def _adamw(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch AdamW; ``alpha != 1`` is the paper's module-wise-lr control (matrices at lr*alpha)."""
    base = adam_settings(hp)
    groups = two_groups(split, {**base, "lr": hp["lr"] * hp["alpha"]}, base)
    return torch.optim.AdamW(groups, **base)
