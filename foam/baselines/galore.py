"""GaLore (Zhao et al., 2024): Adam moments in the span of the gradient's top singular vectors.

Reference: ``galore_torch.GaLoreAdamW`` (PyPI ``galore-torch`` 1.0), reproduced step for step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from foam.hparams import group_defaults, signature_defaults
from foam.lowrank import (
    CompressedStep,
    ProjectedAdamW,
    Projection,
    project_back,
    resolve_rank,
    svd_basis,
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


class GaLore(ProjectedAdamW):
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

    Under FSDP2 the SVD runs on the matrix's owner and each rank projects its shard
    (``foam.lowrank``'s docstring says how): the sharded step is the unsharded one.
    """

    refreshes_on_owners = True

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
        super().__init__(params, group_defaults(locals()))

    def new_basis(self, g: torch.Tensor, plan: Projection, state: dict[str, Any]) -> torch.Tensor:
        return svd_basis(g, plan)

    def expand(self, step: CompressedStep) -> torch.Tensor:
        basis = step.state["basis"].to(step.g.dtype)
        return project_back(step.normalized, basis, step.context.side).mul_(step.group["alpha"])


OPTIONS = ("update_proj_gap", "alpha", "proj_type", "state_dtype")


@register(
    "galore",
    shards=True,
    rank=None,
    rank_fraction=0.25,
    **signature_defaults(GaLore, "eps", *OPTIONS),
    **OTHERS,
)
def _galore(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """GaLore on the attention/MLP matrices, HF-style AdamW at the base lr on the rest.

    ``rank`` overrides ``rank_fraction`` (of the hidden size; 0.25 is the paper's GaLore-1/4).
    """
    rank = resolve_rank(split, hp["rank"], hp["rank_fraction"])
    groups = method_groups(split, {"rank": rank}, {"rank": None}, hp)
    galore = GaLore(groups, **adam_settings(hp), **{k: hp[k] for k in OPTIONS})
    return with_adamw_for_others(split, galore, hp, eps=COMMON_DEFAULTS["eps"])
