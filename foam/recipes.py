"""Registered recipes for AdamW and FOAM (the baselines register theirs in their own modules)."""

from __future__ import annotations

from typing import Any

import torch

from foam.optimizer import FOAM, fused_adamw_applies
from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups

# None: the value FOAM's ``semantics`` gives it (foam.optimizer.SEMANTICS).
FOAM_OPTIONS: dict[str, Any] = {
    "alpha": 0.25,
    "residual": True,
    "residual_in_second_moment": True,
    "semantics": "paper",
    "second_moment": None,
    "bias_correction": None,
    "fold_axis": None,
    "tail_block": None,
    "decay": None,
    "state_dtype": None,
    "fused_adamw": True,
}


@register("adamw", alpha=1.0)
def _adamw(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch AdamW; ``alpha != 1`` is the paper's module-wise-lr control (matrices at lr*alpha).

    Fused where the device has the kernel: the same kernel FOAM and the other methods use for
    their unfolded parameters, so speed and memory comparisons measure the methods.
    """
    base = adam_settings(hp)
    groups = two_groups(split, {**base, "lr": hp["lr"] * hp["alpha"]}, base)
    fused = all(fused_adamw_applies(p) for _, p in [*split.matrices, *split.others])
    return torch.optim.AdamW(groups, **base, fused=fused or None)


def _foam(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    groups = two_groups(split, {}, {"level": None})
    return FOAM(groups, **hp)


register("foam", level=2, **FOAM_OPTIONS)(_foam)


@register("foam_mini", **FOAM_OPTIONS)
def _foam_mini(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    return _foam(split, {**hp, "level": "mini"})
