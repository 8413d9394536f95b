"""FOAM-Adam-mini: Adam-mini whose matrices keep their first moment folded, plus the residual.

The arithmetic is ``AdamMini``'s own (a group with a ``level`` folds its first moment); this
module is the recipe that turns it on for the attention/MLP matrices.
"""

from __future__ import annotations

from typing import Any

import torch

from foam.baselines.adam_mini import HEADS, AdamMini, build, heads_from_config
from foam.hparams import signature_defaults
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit
from foam.registry import register
from foam.settings import require_paper_semantics

FOLD_OPTIONS = ("fold_axis", "residual")


@register(
    "foam_adam_mini",
    shards=True,
    from_model=heads_from_config,
    **signature_defaults(FOAM, "level", "semantics"),
    **signature_defaults(AdamMini, *FOLD_OPTIONS),
    **HEADS,
)
def _foam_adam_mini(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """Adam-mini with the matrices' first moment folded plus residual; ``level=0`` is adam_mini."""
    require_paper_semantics("foam_adam_mini", hp["semantics"])
    return build(split, hp, hp["level"], **{k: hp[k] for k in FOLD_OPTIONS})
