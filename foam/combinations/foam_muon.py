"""FOAM-Muon: torch's Muon whose momentum buffer is stored folded, plus the residual."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

# torch's own Newton-Schulz and shape scale: FOAM-Muon at level 0 is then torch's Muon to the bit.
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from foam.baselines.muon import MATCH_RMS, MUON_OPTIONS, SETTINGS, matrix_group
from foam.folding import (
    PAPER_FOLD_AXIS,
    fold,
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
from foam.state import run_closure


class FoldedMuon(torch.optim.Muon):
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
        for p in group["params"]:
            self.plan_for(p, group)

    plan_for = staticmethod(fold_plan)

    def planned_state_numel(self) -> int:
        """Momentum elements once every matrix has stepped, from the plans that size them."""
        return sum(
            folded_numel(self.plan_for(p, g), p.numel())
            for g in self.param_groups
            for p in g["params"]
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        plan = self.plan_for(p, group)
        state = self.state[p]
        mu = group["momentum"]
        if plan is None or plan.block == 1:
            # torch's Muon step, op for op (lerps in the state dtype compute in fp32 internally).
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            momentum = p.grad.lerp(buf, mu) if group["nesterov"] else buf
        else:
            if not state:
                state["momentum_buffer"] = torch.zeros(
                    plan.folded_shape, dtype=p.dtype, device=p.device
                )
            g = p.grad.to(compute_dtype(p.dtype))
            g_folded = fold(g, plan)
            buf = ema_(state["momentum_buffer"], g_folded, mu, square=False)
            full = unfold_with_residual(g, g_folded, buf, plan, float(group["residual"]))
            momentum = g.lerp(full, mu) if group["nesterov"] else full
        update = _zeropower_via_newtonschulz(
            momentum, group["ns_coefficients"], group["ns_steps"], group["eps"]
        )
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], p.shape))


FOLD_OPTIONS = ("level", "fold_axis", "residual")


@register(
    "foam_muon",
    **signature_defaults(FoldedMuon, *FOLD_OPTIONS),
    semantics=DEFAULT_SEMANTICS,
    **MUON_OPTIONS,
)
def _foam_muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """Muon with the momentum stored folded; ``level=0`` is ``muon``."""
    require_paper_semantics("foam_muon", hp["semantics"])
    settings = {k: hp[k] for k in (*SETTINGS, *FOLD_OPTIONS)}
    return with_adamw_for_others(split, FoldedMuon(matrix_group(split, hp), **settings), hp)
