"""APOLLO and APOLLO-Mini (Zhu et al., 2025): SGD-like steps scaled by a random-projection Adam.

Reference: ``apollo_torch.APOLLOAdamW`` (PyPI ``apollo-torch`` 1.0.3) with ``proj="random"``,
reproduced step for step, including its random-number streams.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from foam.errors import OptionError, require_choice
from foam.hparams import group_defaults, signature_defaults
from foam.lowrank import (
    CompressedStep,
    ProjectedAdamW,
    Projection,
    limit_norm_growth,
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

SCALE_TYPES = ("channel", "tensor")
_SEED_ADVANCE = 15  # draws between consecutive seeds of one parameter's chain (the reference's)


def gaussian_basis(plan: Projection, seed: int, device: torch.device, rank: int) -> torch.Tensor:
    """The reference's projection: float32 N(0, 1) from a generator on ``device``, over sqrt(rank).

    Drawn on the gradient's device, so CPU and CUDA runs use different (each reproducible)
    matrices, exactly as the reference does.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    draw = torch.randn(plan.basis_shape, generator=generator, device=device, dtype=torch.float32)
    return draw / math.sqrt(rank)


def next_seed(seed: int) -> int:
    """The next seed of a parameter's chain: the last of 15 int64 draws from a CPU generator."""
    generator = torch.Generator().manual_seed(seed)
    high = torch.iinfo(torch.int64).max
    return int(torch.randint(0, high, (_SEED_ADVANCE,), generator=generator)[-1])


class APOLLO(ProjectedAdamW):
    """The raw gradient rescaled by how Adam rescales its random projection, then SGD-stepped.

    For a 2-d parameter ``G`` (``m x n``) in a group whose ``rank`` is not ``None``:

    1. ``R = project(G)`` with a Gaussian basis (entries N(0, 1/rank)) on the smaller side
       (``proj_type="std"``), redrawn at steps 1, T+1, ... from a per-parameter seed chain that
       starts at the parameter's 1-based position over all groups (the reference's seeding);
    2. HF-style Adam moments of ``R`` and ``N = m / (sqrt(v) + eps)`` (no bias correction here);
    3. scaling ``s = ||N|| / (||R|| + 1e-8)``: per channel of the un-projected dim
       (``scale_type="channel"``, APOLLO) or one scalar (``"tensor"``, APOLLO-Mini);
    4. ``G * s``, then Fira's norm-growth limiter (``norm_growth_limit=1.01``; ``None`` disables
       it), and a factor ``sqrt(alpha)``: ``alpha`` is the reference's ``scale`` (APOLLO-Mini's
       128 multiplies the step by sqrt(128)). ``scale_front=True`` applies ``sqrt(alpha)`` before
       the limiter, as the reference's flag (the 60M/130M Mini scripts set it);
    5. ``W -= lr * sqrt(bc2) / bc1 * update``, then decoupled decay with the group lr.

    Channel norms are taken along the rank axis of ``R``; for ``proj_type="std"`` this is the
    reference's ``norm_dim``, for the other sides the reference's choice does not broadcast.
    Other parameters take HF-style AdamW. Betas default to the paper's (0.9, 0.95); eps to the
    reference's 1e-6.

    State per compressed ``m x n`` parameter: ``exp_avg``, ``exp_avg_sq`` (``max(m, n) x rank``),
    ``basis`` (``rank x min(m, n)``; the paper notes only the seed would need storing, the
    reference stores the matrix and so do we), ``grad_norm`` (one element, with the limiter), all
    ``state_dtype``; the step counter; the integer ``seed``.
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
        alpha: float = 1.0,
        proj_type: str = "std",
        scale_type: str = "channel",
        scale_front: bool = False,
        norm_growth_limit: float | None = 1.01,
        state_dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__(params, group_defaults(locals()))

    def validate_group(self, group: dict[str, Any]) -> None:
        super().validate_group(group)
        require_choice("scale_type", group["scale_type"], SCALE_TYPES)
        limit = group["norm_growth_limit"]
        if limit is not None and not limit >= 1.0:
            raise OptionError(
                "norm_growth_limit", f"norm_growth_limit must be >= 1 or None, got {limit!r}"
            )

    def extra_state_shapes(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, tuple]:
        shapes = super().extra_state_shapes(p, group)
        if shapes and group["norm_growth_limit"] is not None:
            shapes["grad_norm"] = ()
        return shapes

    def init_extra_state(self, p: torch.Tensor, state: dict[str, Any], index: int) -> None:
        state["seed"] = index

    def new_basis(self, g: torch.Tensor, plan: Projection, state: dict[str, Any]) -> torch.Tensor:
        basis = gaussian_basis(plan, state["seed"], g.device, plan.rank)
        state["seed"] = next_seed(state["seed"])
        return basis

    def expand(self, step: CompressedStep) -> torch.Tensor:
        g, low, normalized, group = step.g, step.low, step.normalized, step.group
        if group["scale_type"] == "channel":
            axis = step.context.rank_axis
            scaling = torch.linalg.vector_norm(normalized, dim=axis, keepdim=True) / (
                torch.linalg.vector_norm(low, dim=axis, keepdim=True) + 1e-8
            )
        else:
            scaling = torch.linalg.vector_norm(normalized) / (torch.linalg.vector_norm(low) + 1e-8)
        update = g * scaling
        root_alpha = math.sqrt(group["alpha"])
        if group["scale_front"]:
            update.mul_(root_alpha)
        if group["norm_growth_limit"] is not None:
            update, _ = limit_norm_growth(
                update, step.state["grad_norm"], step.t == 1, group["norm_growth_limit"]
            )
        if not group["scale_front"]:
            update.mul_(root_alpha)
        return update


OPTIONS = ("update_proj_gap", "proj_type", "scale_front", "norm_growth_limit", "state_dtype")


def _build(
    split: ParamSplit, hp: dict[str, Any], rank: int, scale_type: str
) -> torch.optim.Optimizer:
    groups = method_groups(split, {"rank": rank}, {"rank": None}, hp)
    options = {k: hp[k] for k in OPTIONS}
    apollo = APOLLO(
        groups, **adam_settings(hp), alpha=hp["alpha"], scale_type=scale_type, **options
    )
    return with_adamw_for_others(split, apollo, hp, eps=COMMON_DEFAULTS["eps"])


_DEFAULTS = {**signature_defaults(APOLLO, "eps", *OPTIONS), **OTHERS}


@register(
    "apollo", rank=None, rank_fraction=0.25, **signature_defaults(APOLLO, "alpha"), **_DEFAULTS
)
def _apollo(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """APOLLO: channel-wise scaling; ``rank`` overrides ``rank_fraction`` of the hidden size."""
    return _build(split, hp, resolve_rank(split, hp["rank"], hp["rank_fraction"]), "channel")


@register("apollo_mini", alpha=128.0, **_DEFAULTS)
def _apollo_mini(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """APOLLO-Mini: rank 1, tensor-wise scaling, ``alpha`` 128 (the step times sqrt(128))."""
    return _build(split, hp, 1, "tensor")
