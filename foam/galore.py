"""GaLore (Zhao et al., 2024): Adam moments in the span of the gradient's top singular vectors.

Reference: ``galore_torch.GaLoreAdamW`` (PyPI ``galore-torch`` 1.0), reproduced step for step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from foam.lowrank import (
    PROJ_TYPES,
    CompressedAdamW,
    Projection,
    plan_projection,
    project,
    project_back,
    refresh_due,
    resolve_rank,
)
from foam.param_groups import ParamSplit
from foam.registry import (
    COMMON_DEFAULTS,
    OTHERS,
    adam_settings,
    method_groups,
    register,
    with_adamw_for_others,
)


def svd_basis(g: torch.Tensor, plan: Projection) -> torch.Tensor:
    """The top-``rank`` singular vectors of ``g`` on the projected side.

    Always a float32 ``torch.linalg.svd`` whatever ``g``'s dtype, as the reference: another SVD
    routine or precision may flip singular-vector signs, and since the moments are carried across
    refreshes a flip changes the trajectory, not just the rounding.
    """
    u, _, vh = torch.linalg.svd(g.float(), full_matrices=False)
    return vh[: plan.rank] if plan.side == "right" else u[:, : plan.rank]


class GaLore(CompressedAdamW):
    """HF-style AdamW whose moments of 2-d parameters live in a rank-``rank`` SVD subspace.

    For a 2-d parameter in a group whose ``rank`` is not ``None``: every ``update_proj_gap``
    steps (steps 1, T+1, 2T+1, ...) the basis is recomputed from the SVD of the current gradient
    (``proj_type="std"``: the smaller side, so moments are ``max(m, n) x rank``); the gradient is
    projected, Adam runs in the low-rank space, and the normalised step is projected back and
    multiplied by ``alpha``. As in the reference the moments are neither reset nor rotated when
    the basis changes, weight decay uses the group lr (never ``alpha``-scaled) after the update,
    and eps sits on the un-corrected sqrt(v) (default 1e-6, the reference's). Other parameters
    take the same HF-style AdamW uncompressed. Betas default to the paper's (0.9, 0.95); the
    reference's default is (0.9, 0.999).

    State per compressed ``m x n`` parameter: ``exp_avg``, ``exp_avg_sq`` (low-rank shape) and
    ``basis`` (``rank x min(m, n)``), all ``state_dtype`` (the reference keeps the basis in the
    gradient's dtype), plus the step counter.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        rank: int | None = 128,
        update_proj_gap: int = 200,
        alpha: float = 0.25,
        proj_type: str = "std",
        state_dtype: torch.dtype | str | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            rank=rank,
            update_proj_gap=update_proj_gap,
            alpha=alpha,
            proj_type=proj_type,
            state_dtype=state_dtype,
        )
        super().__init__(params, defaults)

    def validate_group(self, group: dict[str, Any]) -> None:
        validate_projection_group(group)

    @staticmethod
    def plan_for(p: torch.Tensor, group: dict[str, Any]) -> Projection | None:
        """The projection of ``p``; ``None`` when it takes uncompressed AdamW."""
        if group["rank"] is None or p.dim() != 2:
            return None
        return plan_projection(p.shape, group["rank"], group["proj_type"])

    def compressed_shape(self, p: torch.Tensor, group: dict[str, Any]) -> tuple[int, ...] | None:
        plan = self.plan_for(p, group)
        return None if plan is None else plan.low_shape

    def extra_state_shapes(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, tuple]:
        plan = self.plan_for(p, group)
        return {} if plan is None else {"basis": plan.basis_shape}

    def compress(
        self, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any], t: int
    ) -> tuple[torch.Tensor, Projection]:
        plan = plan_projection(g.shape, group["rank"], group["proj_type"])
        if refresh_due(state, group, t):
            state["basis"].copy_(svd_basis(g, plan))
        return project(g, state["basis"].to(g.dtype), plan.side), plan

    def expand(
        self,
        g: torch.Tensor,
        low: torch.Tensor,
        normalized: torch.Tensor,
        denom: torch.Tensor,
        context: Projection,
        state: dict[str, Any],
        group: dict[str, Any],
        t: int,
    ) -> torch.Tensor:
        back = project_back(normalized, state["basis"].to(g.dtype), context.side)
        return back.mul_(group["alpha"])


def validate_projection_group(group: dict[str, Any]) -> None:
    """Checks shared by the projection methods (GaLore, APOLLO)."""
    rank = group["rank"]
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise ValueError(f"rank must be an int >= 1 or None, got {rank!r}")
    gap = group["update_proj_gap"]
    if not isinstance(gap, int) or isinstance(gap, bool) or gap < 1:
        raise ValueError(f"update_proj_gap must be an int >= 1, got {gap!r}")
    if group["proj_type"] not in PROJ_TYPES:
        raise ValueError(f"proj_type must be one of {PROJ_TYPES}, got {group['proj_type']!r}")
    if not group["alpha"] >= 0:
        raise ValueError(f"alpha must be >= 0, got {group['alpha']!r}")


@register(
    "galore",
    rank=None,
    rank_fraction=0.25,
    update_proj_gap=200,
    alpha=0.25,
    proj_type="std",
    eps=1e-6,
    state_dtype=None,
    **OTHERS,
)
def _galore(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """GaLore on the attention/MLP matrices, HF-style AdamW at the base lr on the rest.

    ``rank`` overrides ``rank_fraction`` (of the hidden size; 0.25 is the paper's GaLore-1/4).
    """
    rank = resolve_rank(split, hp["rank"], hp["rank_fraction"])
    groups = method_groups(split, {"rank": rank}, {"rank": None}, hp)
    galore = GaLore(
        groups,
        **adam_settings(hp),
        update_proj_gap=hp["update_proj_gap"],
        alpha=hp["alpha"],
        proj_type=hp["proj_type"],
        state_dtype=hp["state_dtype"],
    )
    return with_adamw_for_others(split, galore, hp, eps=COMMON_DEFAULTS["eps"])
