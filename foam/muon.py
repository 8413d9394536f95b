"""Muon (the Moonlight variant the paper cites) and FOAM with Muon (FOAM_SPEC section 5).

Muon orthogonalises a Nesterov momentum with five Newton-Schulz steps and scales the result to
AdamW's update RMS (``0.2 * sqrt(max(A, B))``, torch's ``adjust_lr_fn="match_rms_adamw"``), so the
lr and weight decay tuned for AdamW carry over. It takes matrices only; everything else gets plain
AdamW (``FOAM`` with ``level=None``), inside one ``Composite`` optimizer.

``alpha`` is the paper's module-wise lr: the matrix group runs at ``lr * alpha`` (decay included,
as torch's Muon applies ``lr * weight_decay`` with the group lr). The paper runs Muon without an
alpha, hence the default 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

# torch's own Newton-Schulz and shape scale: FOAM-Muon at level 0 is then torch's Muon to the bit.
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from foam.folding import FOLD_AXES, FoldPlan, fold, folded_numel, make_plan, unfold_with_residual
from foam.optimizer import compute_dtype, ema_, require_paper_semantics
from foam.param_groups import ParamSplit
from foam.registry import register, with_adamw_for_others

MATCH_RMS = "match_rms_adamw"  # Moonlight's scale; lets Muon reuse AdamW's lr and decay
MUON_OPTIONS: dict[str, Any] = {"alpha": 1.0, "momentum": 0.95, "nesterov": True, "ns_steps": 5}


class FoldedMuon(torch.optim.Muon):
    """torch's Muon whose momentum buffer is stored folded (FOAM_SPEC section 5).

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
        fold_axis: str = "larger",
        residual: bool | float = True,
    ) -> None:
        if fold_axis not in FOLD_AXES:
            raise ValueError(f"fold_axis must be one of {FOLD_AXES}, got {fold_axis!r}")
        if not float(residual) >= 0:
            raise ValueError(f"residual must be a bool or a scale >= 0, got {residual!r}")
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
        """Fill the fold keys and plan every matrix now, so a bad level fails before any step."""
        for key, value in self._fold_defaults.items():
            param_group.setdefault(key, value)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.plan_for(p, group)

    @staticmethod
    def plan_for(p: torch.Tensor, group: dict[str, Any]) -> FoldPlan | None:
        """How ``p``'s momentum is folded; ``None`` when it is stored in full."""
        if group["level"] is None:
            return None
        return make_plan(p.shape, group["level"], group["fold_axis"])

    def planned_state_numel(self) -> int:
        """Momentum elements once every matrix has stepped, from the plans that size them."""
        return sum(
            folded_numel(self.plan_for(p, g), p.numel())
            for g in self.param_groups
            for p in g["params"]
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
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


def _matrix_group(split: ParamSplit, hp: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"params": [p for _, p in split.matrices], "name": "matrices", "lr": hp["lr"] * hp["alpha"]}
    ]


def _muon_settings(hp: dict[str, Any]) -> dict[str, Any]:
    """The keywords Muon and its folded variant share."""
    return {k: hp[k] for k in ("lr", "weight_decay", "momentum", "nesterov", "ns_steps")}


@register("muon", **MUON_OPTIONS)
def _muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch's Muon (Moonlight scale) on the matrices, AdamW on the rest at the base lr."""
    matrices = torch.optim.Muon(
        _matrix_group(split, hp), **_muon_settings(hp), adjust_lr_fn=MATCH_RMS
    )
    return with_adamw_for_others(split, matrices, hp)


@register(
    "foam_muon", level=2, fold_axis="larger", residual=True, semantics="paper", **MUON_OPTIONS
)
def _foam_muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """Muon with the momentum stored folded; ``level=0`` is ``muon``."""
    require_paper_semantics("foam_muon", hp["semantics"])
    matrices = FoldedMuon(
        _matrix_group(split, hp),
        **_muon_settings(hp),
        level=hp["level"],
        fold_axis=hp["fold_axis"],
        residual=hp["residual"],
    )
    return with_adamw_for_others(split, matrices, hp)
