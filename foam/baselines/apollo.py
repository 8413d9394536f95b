"""APOLLO and APOLLO-Mini (Zhu et al., 2025): SGD-like steps scaled by a random-projection Adam.

Reference: ``apollo_torch.APOLLOAdamW`` (PyPI ``apollo-torch`` 1.0.3) with ``proj="random"``,
reproduced step for step, including its random-number streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard

from foam.errors import OptionError, require_choice
from foam.hparams import group_defaults, signature_defaults
from foam.lowrank import (
    CompressedStep,
    ProjectedAdamW,
    Projection,
    limit_norm_growth,
    project,
    refresh_due,
    resolve_rank,
)
from foam.numerics import compute_dtype, resolve_dtype
from foam.param_groups import ParamSplit
from foam.registry import (
    COMMON_DEFAULTS,
    OTHERS,
    adam_settings,
    method_groups,
    register,
    with_adamw_for_others,
)
from foam.shard_blocks import chunk_range, local_shape, mesh_group, placed_zeros
from foam.shard_sums import PartialSums
from foam.sharded_steps import apply_update, normalized_moments
from foam.sharding import is_sharded, local
from foam.state import count_step, new_step_counter, run_closure

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
        scaled = self.scaled(step.g, step.low, step.normalized, step.group, step.context)
        return self.limited(scaled, step.state, step.group, step.t)

    @staticmethod
    def scaled(
        g: torch.Tensor,
        low: torch.Tensor,
        normalized: torch.Tensor,
        group: dict[str, Any],
        plan: Projection,
        norms: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``G * s`` (``sqrt(alpha)`` too with ``scale_front``); ``norms`` are the tensor-wise
        ``(||N||, ||R||)`` when ``low`` is one rank's shard of the projection."""
        if group["scale_type"] == "channel":
            axis = plan.rank_axis
            scaling = torch.linalg.vector_norm(normalized, dim=axis, keepdim=True) / (
                torch.linalg.vector_norm(low, dim=axis, keepdim=True) + 1e-8
            )
        else:
            if norms is None:
                norms = torch.linalg.vector_norm(normalized), torch.linalg.vector_norm(low)
            scaling = norms[0] / (norms[1] + 1e-8)
        update = g * scaling
        if group["scale_front"]:
            update.mul_(math.sqrt(group["alpha"]))
        return update

    @staticmethod
    def limited(
        update: torch.Tensor,
        state: dict[str, Any],
        group: dict[str, Any],
        t: int,
        norm: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The norm-growth limiter (``norm``: the whole matrix's, when ``update`` is a shard),
        then ``sqrt(alpha)`` unless ``scale_front``."""
        if group["norm_growth_limit"] is not None:
            update, _ = limit_norm_growth(
                update, local(state["grad_norm"]), t == 1, group["norm_growth_limit"], norm
            )
        if not group["scale_front"]:
            update.mul_(math.sqrt(group["alpha"]))
        return update

    def planned_param_numel(self, p: torch.Tensor, group: dict[str, Any], per_rank: bool) -> int:
        """``p``'s share of the state on this rank (``per_rank``): its shard of the moments, or
        all of them where the projection is summed across ranks, and the replicated basis and
        norm; otherwise as ``CompressedAdamW`` counts it."""
        plan = self.plan_for(p, group)
        if not per_rank or plan is None or not is_sharded(p):
            return super().planned_param_numel(p, group, per_rank)
        placement = Replicate() if self._spans(p, plan) else p.placements[0]
        moments = 2 * math.prod(local_shape(p, plan.low_shape, placement))
        return moments + math.prod(plan.basis_shape) + (group["norm_growth_limit"] is not None)

    # -- the sharded (FSDP2) step: parts, one reduction, the rest, twice --------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """On DTensor parameters (FSDP2) each rank steps its shard: the basis is drawn whole on
        every rank (the same seeds), a projection whose basis lies along the sharded dim is summed
        across ranks, and so are the tensor-wise norms of a projection each rank holds its part
        of, then the limiter's norms: two ``PartialSums`` reductions a step in all."""
        group_of_ranks = mesh_group(p for g in self.param_groups for p in g["params"])
        if group_of_ranks is None:
            return super().step(closure)
        loss = run_closure(closure)
        sums, shards, index = PartialSums(group_of_ranks), [], 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is not None:
                    shards.append(self._project_shard(p, group, index, sums))
        sums.reduce()  # projections along the sharded dim, tensor-wise norms of local ones
        for shard in shards:
            self._scale_shard(shard, sums)
        sums.reduce()  # the limiter's norms
        for shard in shards:
            self._apply_shard(shard)
        return loss

    def _spans(self, p: torch.Tensor, plan: Projection | None) -> bool:
        """Whether ``p``'s projection is summed across ranks: its basis lies along the dim the
        ranks shard (``G P^T`` of a column shard, ``Q^T G`` of a row shard)."""
        if not is_sharded(p) or not isinstance(p.placements[0], Shard):
            return False
        dim = p.placements[0].dim
        return plan is not None and dim == (1 if plan.side == "right" else 0)

    def _init_shard_state(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        """States with ``p``'s placement (DCP reshards them): the moments sharded like the
        projection's rows/columns the rank holds, or replicated when it is summed across ranks;
        the basis replicated."""
        state, plan = self.state[p], self.plan_for(p, group)
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        state["step"] = new_step_counter()
        if plan is None:
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
            return
        placement = Replicate() if self._spans(p, plan) else p.placements[0]
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = placed_zeros(p, plan.low_shape, placement, dtype)
        state["basis"] = placed_zeros(p, plan.basis_shape, Replicate(), dtype)
        if group["norm_growth_limit"] is not None:
            state["grad_norm"] = torch.zeros((), dtype=dtype, device=local(p).device)
        self.init_extra_state(p, state, index)

    def _project_shard(
        self, p: torch.Tensor, group: dict[str, Any], index: int, sums: PartialSums
    ) -> _Shard:
        if p.grad.is_sparse:
            raise RuntimeError("APOLLO does not support sparse gradients")
        if not self.state[p]:
            self._init_shard_state(p, group, index)
        state, plan = self.state[p], self.plan_for(p, group)
        shard = _Shard(p, group, state, count_step(state), local(p.grad).to(compute_dtype(p.dtype)))
        shard.plan, shard.spans = plan, self._spans(p, plan)
        if plan is None:
            shard.low = shard.g
        else:
            if refresh_due(state, group, shard.t):
                local(state["basis"]).copy_(self.new_basis(shard.g, plan, state))
            basis = local(state["basis"]).to(shard.g.dtype)
            if shard.spans:  # the basis rows/columns of this rank's part of the sharded dim
                mesh, dim = p.device_mesh, p.placements[0].dim
                start, stop = chunk_range(p.shape[dim], mesh.size(), mesh.get_local_rank())
                basis = basis[:, start:stop] if plan.side == "right" else basis[start:stop]
                shard.low = sums.add(project(shard.g, basis, plan.side))
                return shard
            shard.low = project(shard.g, basis, plan.side)
        self._moments(shard)
        if plan is not None and group["scale_type"] == "tensor":
            shard.norms = sums.add(
                torch.stack([shard.normalized.square().sum(), shard.low.square().sum()])
            )
        return shard

    @staticmethod
    def _moments(shard: _Shard) -> None:
        shard.normalized, _ = normalized_moments(shard.state, shard.low, shard.group)

    def _scale_shard(self, shard: _Shard, sums: PartialSums) -> None:
        if shard.plan is None:
            shard.update = shard.normalized
            return
        if shard.spans:
            self._moments(shard)
        norms = None if shard.norms is None else tuple(shard.norms.sqrt())
        shard.update = self.scaled(
            shard.g, shard.low, shard.normalized, shard.group, shard.plan, norms
        )
        if shard.group["norm_growth_limit"] is not None:
            shard.limit_norm = sums.add(shard.update.square().sum())

    def _apply_shard(self, shard: _Shard) -> None:
        update, group = shard.update, shard.group
        if shard.plan is not None:
            norm = None if shard.limit_norm is None else shard.limit_norm.sqrt()
            update = self.limited(update, shard.state, group, shard.t, norm)
        apply_update(shard.p, update, group, shard.t)


@dataclass
class _Shard:
    """One parameter's sharded APOLLO step between its passes (local tensors)."""

    p: torch.Tensor
    group: dict[str, Any]
    state: dict[str, Any]
    t: int
    g: torch.Tensor
    plan: Projection | None = None
    spans: bool = False
    low: torch.Tensor | None = None
    """The projection: this rank's rows/columns of it, or (``spans``) all of it once summed."""
    normalized: torch.Tensor | None = None
    norms: torch.Tensor | None = None
    """Tensor-wise scaling of a projection held in parts: ``(||N||^2, ||R||^2)`` once summed."""
    update: torch.Tensor | None = None
    limit_norm: torch.Tensor | None = None
    """The limiter's ``||update||^2`` of the whole matrix once summed."""


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
    "apollo",
    shards=True,
    rank=None,
    rank_fraction=0.25,
    **signature_defaults(APOLLO, "alpha"),
    **_DEFAULTS,
)
def _apollo(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """APOLLO: channel-wise scaling; ``rank`` overrides ``rank_fraction`` of the hidden size."""
    return _build(split, hp, resolve_rank(split, hp["rank"], hp["rank_fraction"]), "channel")


@register("apollo_mini", shards=True, alpha=128.0, **_DEFAULTS)
def _apollo_mini(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """APOLLO-Mini: rank 1, tensor-wise scaling, ``alpha`` 128 (the step times sqrt(128))."""
    return _build(split, hp, 1, "tensor")
