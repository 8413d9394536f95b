"""Registered recipes for AdamW and FOAM (the baselines register theirs in their own modules)."""

from __future__ import annotations

from typing import Any

import torch

from foam.optimizer import FOAM
from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups

FOAM_OPTIONS: dict[str, Any] = {
    "alpha": 0.25,
    "residual": True,
    "residual_in_second_moment": True,
    "second_moment": "square_of_mean",
    "bias_correction": True,
    "fold_axis": "larger",
    "state_dtype": None,
    "fused_adamw": True,
    "implementation": "auto",
}


@register("adamw", alpha=1.0)
def _adamw(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch AdamW; ``alpha != 1`` is the paper's module-wise-lr control (matrices at lr*alpha)."""
    base = adam_settings(hp)
    groups = two_groups(split, {**base, "lr": hp["lr"] * hp["alpha"]}, base)
    return torch.optim.AdamW(groups, **base)


def _foam(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    groups = two_groups(split, {}, {"level": None})
    return FOAM(groups, **hp)


register("foam", level=2, **FOAM_OPTIONS)(_foam)


@register("foam_mini", **FOAM_OPTIONS)
def _foam_mini(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    return _foam(split, {**hp, "level": "mini"})
