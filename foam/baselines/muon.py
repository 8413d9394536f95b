"""Muon (the Moonlight variant the paper cites): torch's Muon on the matrices, AdamW elsewhere.

Muon orthogonalises a Nesterov momentum with five Newton-Schulz steps and scales the result to
AdamW's update RMS (``0.2 * sqrt(max(A, B))``, torch's ``adjust_lr_fn="match_rms_adamw"``), so the
lr and weight decay tuned for AdamW carry over. It takes matrices only; everything else gets plain
AdamW (``FOAM`` with ``level=None``), inside one ``Composite`` optimizer.

``alpha`` is the paper's module-wise lr: the matrix group runs at ``lr * alpha`` (decay included,
as torch's Muon applies ``lr * weight_decay`` with the group lr). The paper runs Muon without an
alpha, hence the default 1.
"""

from __future__ import annotations

from typing import Any

import torch

from foam.hparams import signature_defaults
from foam.param_groups import ParamSplit
from foam.registry import register, with_adamw_for_others

MATCH_RMS = "match_rms_adamw"  # Moonlight's scale; lets Muon reuse AdamW's lr and decay
SETTINGS = ("lr", "weight_decay", "momentum", "nesterov", "ns_steps")
"""The keywords Muon and its folded variant (``foam_muon``) share."""
MUON_OPTIONS: dict[str, Any] = {
    "alpha": 1.0,
    **signature_defaults(torch.optim.Muon, "momentum", "nesterov", "ns_steps"),
}


def matrix_group(split: ParamSplit, hp: dict[str, Any]) -> list[dict[str, Any]]:
    """The matrices as one group at ``lr * alpha``."""
    return [
        {"params": [p for _, p in split.matrices], "name": "matrices", "lr": hp["lr"] * hp["alpha"]}
    ]


@register("muon", **MUON_OPTIONS)
def _muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch's Muon (Moonlight scale) on the matrices, AdamW on the rest at the base lr."""
    settings = {k: hp[k] for k in SETTINGS}
    matrices = torch.optim.Muon(matrix_group(split, hp), **settings, adjust_lr_fn=MATCH_RMS)
    return with_adamw_for_others(split, matrices, hp)
