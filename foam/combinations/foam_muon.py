"""FOAM-Muon: torch's Muon whose momentum buffer is stored folded, plus the residual.

Under FSDP2 each rank folds its own shard as FOAM does (``foam.sharding``: the fold runs along
the dim the shard keeps whole, or in blocks aligned with the shards; FOAM-Mini along the sharded
dim all-reduces its block means), and Newton-Schulz runs on the owners as Muon's
(``foam.baselines.muon``); the folded buffer is a DTensor in the parameter's placement.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from foam.baselines.muon import MATCH_RMS, MUON_OPTIONS, SETTINGS, Muon, matrix_group
from foam.folding import (
    PAPER_FOLD_AXIS,
    fold_plan,
    folded_numel,
    unfold_with_residual,
    validate_fold_settings,
)
from foam.hparams import signature_defaults, validate_muon_hparams
from foam.numerics import compute_dtype, ema_
from foam.param_groups import ParamSplit
from foam.registry import register, with_adamw_for_others
from foam.settings import DEFAULT_SEMANTICS, require_paper_semantics
from foam.sharding import ShardFold, fold_shard, local, shard_fold, zeros_state


class FoldedMuon(Muon):
    """torch's Muon whose momentum buffer is stored folded.

    With ``level`` not ``None`` the buffer is the EMA of the folded gradient, ``B~``; the momentum
    handed to Nesterov and Newton-Schulz is ``E(B~) + rho * R`` with the residual
    ``R = G - E(A(G))`` recomputed each step, so the current gradient enters undamaged. Level 0
    (blocks of one) and ``level=None`` run torch's Muon step exactly.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        level: int | str | None = 2,
        fold_axis: str = PAPER_FOLD_AXIS,
        residual: bool | float = True,
    ) -> None:
        self._fold_defaults = {"level": level, "fold_axis": fold_axis, "residual": residual}
        super().__init__(
            params,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adjust_lr_fn=MATCH_RMS,
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Fill the fold keys, check them and plan every matrix now, before any step."""
        for key, value in self._fold_defaults.items():
            param_group.setdefault(key, value)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        validate_muon_hparams(group)
        validate_fold_settings(group)
        for index, p in enumerate(group["params"]):
            self.shard_fold_for(p, group, index)  # a block straddling two shards fails now

    plan_for = staticmethod(fold_plan)

    def shard_fold_for(
        self, p: torch.Tensor, group: dict[str, Any], index: int = 0
    ) -> ShardFold | None:
        """How this rank folds its part of ``p`` (``foam.sharding``); ``None`` at level 0 or
        ``level=None``, which run torch's Muon step."""
        plan = self.plan_for(p, group)
        if plan is None or plan.block == 1:
            return None
        return shard_fold(p, plan, f"parameter {index} of group {group.get('name', '')!r}")

    def planned_state_numel(self) -> int:
        """Momentum elements once every matrix has stepped, from the plans that size them."""
        return sum(
            folded_numel(self.plan_for(p, g), p.numel())
            for g in self.param_groups
            for p in g["params"]
        )

    def momentum(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """``lerp(G, E(B~) + rho * R, mu)`` on this rank's part of ``p`` (torch's at level 0)."""
        fold_of = self.shard_fold_for(p, group)
        if fold_of is None:
            return super().momentum(p, group)
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = zeros_state(p, fold_of, p.dtype)
        mu = group["momentum"]
        g = local(p.grad).to(compute_dtype(p.dtype))
        g_folded = fold_shard(g, fold_of, p)
        buf = ema_(local(state["momentum_buffer"]), g_folded, mu, square=False)
        full = unfold_with_residual(g, g_folded, buf, fold_of.local, float(group["residual"]))
        return g.lerp(full, mu) if group["nesterov"] else full


FOLD_OPTIONS = ("level", "fold_axis", "residual")


@register(
    "foam_muon",
    shards=True,
    **signature_defaults(FoldedMuon, *FOLD_OPTIONS),
    semantics=DEFAULT_SEMANTICS,
    **MUON_OPTIONS,
)
def _foam_muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """Muon with the momentum stored folded; ``level=0`` is ``muon``."""
    require_paper_semantics("foam_muon", hp["semantics"])
    settings = {k: hp[k] for k in (*SETTINGS, *FOLD_OPTIONS)}
    return with_adamw_for_others(split, FoldedMuon(matrix_group(split, hp), **settings), hp)
