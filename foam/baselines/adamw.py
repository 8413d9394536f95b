"""The AdamW recipe: torch's AdamW, with the paper's module-wise-lr control ``alpha``."""

from __future__ import annotations

from typing import Any

import torch

from foam.optimizer import fused_adamw_applies
from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups


@register("adamw", shards=True, alpha=1.0)
def _adamw(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch AdamW; ``alpha != 1`` is the paper's module-wise-lr control (matrices at lr*alpha).

    Fused where the device has the kernel: the same kernel FOAM and the other methods use for
    their unfolded parameters, so speed and memory comparisons measure the methods.
    """
    base = adam_settings(hp)
    groups = two_groups(split, {**base, "lr": hp["lr"] * hp["alpha"]}, base)
    fused = all(fused_adamw_applies(p) for _, p in [*split.matrices, *split.others])
    return torch.optim.AdamW(groups, **base, fused=fused or None)
