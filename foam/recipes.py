"""Registered recipes for FOAM and FOAM-Mini (the baselines register theirs in their own modules).

Their defaults are ``FOAM.__init__``'s, read off its signature.
"""

from __future__ import annotations

from typing import Any

from foam.hparams import signature_defaults
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit
from foam.registry import COMMON_DEFAULTS, register, two_groups

FOAM_DEFAULTS: dict[str, Any] = {
    k: v for k, v in signature_defaults(FOAM).items() if k not in COMMON_DEFAULTS
}
"""FOAM's keywords beyond the Adam ones every method takes, with FOAM's defaults (level 2)."""


@register("foam", shards=True, **FOAM_DEFAULTS)
def _foam(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    """FOAM-l on the attention/MLP matrices, plain AdamW (``level=None``) on the rest."""
    return FOAM(two_groups(split, {}, {"level": None}), **hp)


@register("foam_mini", shards=True, **{k: v for k, v in FOAM_DEFAULTS.items() if k != "level"})
def _foam_mini(split: ParamSplit, hp: dict[str, Any]) -> FOAM:
    """FOAM-Mini: one block over each matrix's larger axis."""
    return _foam(split, {**hp, "level": "mini"})
