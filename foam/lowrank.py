"""Pieces shared by the compressed-state baselines (GaLore, APOLLO, GWT, LDAdamW).

GaLore, APOLLO and GWT are the same HF-style AdamW skeleton around a method-specific change of
coordinates: compress the gradient, keep Adam's moments in the compressed space, normalise there,
expand the normalised direction back to the parameter's shape. ``CompressedAdamW`` is that
skeleton once; each method supplies the compression, the expansion and the extra state they need.
``ProjectedAdamW`` adds what the projection methods (GaLore, APOLLO, LDAdamW) share: a stored
basis per matrix, its plan, and the rules of ``rank``, ``update_proj_gap`` and ``proj_type``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from foam.errors import OptionError, require_choice
from foam.hparams import validate_adam_hparams
from foam.numerics import compute_dtype, ema_, resolve_dtype
from foam.param_groups import ParamSplit
from foam.state import DtypeFaithfulOptimizer, count_step, new_step_counter, run_closure

PROJ_TYPES = ("std", "reverse_std", "left", "right")


@dataclass(frozen=True)
class Projection:
    """How a ``rows x cols`` matrix is projected to rank ``rank``.

    ``side="right"``: basis ``P`` is ``rank x cols`` and the low-rank gradient is ``G P^T``
    (``rows x rank``). ``side="left"``: basis ``Q`` is ``rows x rank`` and the low-rank gradient
    is ``Q^T G`` (``rank x cols``).
    """

    rows: int
    cols: int
    rank: int
    side: str

    @property
    def basis_shape(self) -> tuple[int, int]:
        return (self.rank, self.cols) if self.side == "right" else (self.rows, self.rank)

    @property
    def low_shape(self) -> tuple[int, int]:
        return (self.rows, self.rank) if self.side == "right" else (self.rank, self.cols)

    @property
    def rank_axis(self) -> int:
        """The axis of the low-rank gradient that has ``rank`` entries."""
        return 1 if self.side == "right" else 0


def plan_projection(shape: torch.Size | tuple[int, ...], rank: int, proj_type: str) -> Projection:
    """The projection of a 2-d parameter, with GaLore's side conventions.

    ``std`` projects the smaller dim (right when ``rows >= cols``), ``reverse_std`` the larger,
    ``left``/``right`` force a side. The rank is capped at the projected dim: an SVD has no more
    singular vectors than that, and a random projection to more dims than it has would use more
    memory than Adam (the APOLLO reference does not cap; no LLaMA/Qwen shape reaches the cap).
    """
    rows, cols = shape
    if proj_type == "std":
        side = "right" if rows >= cols else "left"
    elif proj_type == "reverse_std":
        side = "left" if rows >= cols else "right"
    else:
        side = proj_type
    return Projection(rows, cols, min(rank, cols if side == "right" else rows), side)


def project(g: torch.Tensor, basis: torch.Tensor, side: str) -> torch.Tensor:
    return g @ basis.T if side == "right" else basis.T @ g


def project_back(low: torch.Tensor, basis: torch.Tensor, side: str) -> torch.Tensor:
    return low @ basis if side == "right" else basis @ low


def refresh_due(state: dict[str, Any], group: dict[str, Any], t: int) -> bool:
    """Whether the projection is recomputed at step ``t`` (steps 1, T+1, 2T+1, ...).

    Counts the refreshes in ``state["projections"]``, so a run can report how many projections
    it actually computed (a short run with a long gap may compute only one).
    """
    if (t - 1) % group["update_proj_gap"]:
        return False
    state["projections"] = state.get("projections", 0) + 1
    return True


def resolve_rank(split: ParamSplit, rank: int | None, rank_fraction: float | None) -> int:
    """An explicit ``rank``, or ``rank_fraction`` of the hidden size.

    The papers' "GaLore-1/4" / "APOLLO-1/4" mean rank = d_model/4 for every matrix. The hidden
    size is read off the matrices as the largest of their smaller dims: d_model for LLaMA and
    Qwen, whose attention output projection is d_model x d_model.
    """
    if rank is not None:
        return rank
    if rank_fraction is None:
        raise OptionError("rank", "give rank or rank_fraction")
    if not 0 < rank_fraction <= 1:
        raise OptionError(
            "rank_fraction",
            f"rank_fraction must be in (0, 1] of the hidden size, got {rank_fraction!r}",
        )
    hidden = max(min(p.shape) for _, p in split.matrices)
    return max(1, round(rank_fraction * hidden))


def limit_norm_growth(
    x: torch.Tensor,
    stored: torch.Tensor,
    first: bool,
    gamma: float,
    norm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | float]:
    """Fira's norm-growth limiter as APOLLO and GWT apply it; returns ``(x, divisor)``.

    On the first step the norm of ``x`` is stored. Later, a norm above ``gamma`` times the stored
    one is scaled down to exactly that, and the stored norm becomes the (limited) new norm.
    ``norm`` is the whole matrix's when ``x`` is one rank's shard of it (summed across ranks).
    """
    norm = torch.linalg.vector_norm(x) if norm is None else norm
    if first:
        stored.copy_(norm)
        return x, 1.0
    divisor = torch.clamp(norm / (stored.to(norm.dtype) + 1e-8), min=gamma) / gamma
    stored.copy_(norm / divisor)
    return x / divisor, divisor


def svd_basis(g: torch.Tensor, plan: Projection) -> torch.Tensor:
    """The top-``rank`` singular vectors of ``g`` on the projected side.

    Always a float32 ``torch.linalg.svd`` whatever ``g``'s dtype, as GaLore's reference: another
    SVD routine or precision may flip singular-vector signs, and since the moments are carried
    across refreshes a flip changes the trajectory, not just the rounding.
    """
    u, _, vh = torch.linalg.svd(g.float(), full_matrices=False)
    return vh[: plan.rank] if plan.side == "right" else u[:, : plan.rank]


def validate_projection_group(group: dict[str, Any]) -> None:
    """The rules of the projection keywords (GaLore, APOLLO; LDAdamW has no gap)."""
    rank = group["rank"]
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise OptionError("rank", f"rank must be an int >= 1 or None, got {rank!r}")
    gap = group.get("update_proj_gap", 1)
    if not isinstance(gap, int) or isinstance(gap, bool) or gap < 1:
        raise OptionError("update_proj_gap", f"update_proj_gap must be an int >= 1, got {gap!r}")
    require_choice("proj_type", group["proj_type"], PROJ_TYPES)


@dataclass(frozen=True)
class CompressedStep:
    """What ``CompressedAdamW.expand`` gets of one parameter's step."""

    g: torch.Tensor
    """The full gradient, in the wide compute dtype."""
    low: torch.Tensor
    """The compressed gradient."""
    normalized: torch.Tensor
    """``m / (sqrt(v) + eps)`` in the compressed space."""
    denom: torch.Tensor
    """``sqrt(v) + eps``."""
    context: Any
    """What ``compress`` returned besides the compressed gradient."""
    state: dict[str, Any]
    group: dict[str, Any]
    t: int
    """The parameter's step, from 1."""


class CompressedAdamW(DtypeFaithfulOptimizer):
    """HF-style AdamW (the GaLore/APOLLO/GWT references' fork of transformers' AdamW).

    For every parameter: ``m, v`` EMAs of the (compressed) gradient, ``N = m / (sqrt(v) + eps)``
    with eps on the *un-corrected* sqrt(v), ``W -= lr * sqrt(bc2) / bc1 * expand(N)``, then the
    decoupled decay ``W -= lr * wd * W`` *after* the update with the group lr. Parameters for which
    ``compressed_shape`` is ``None`` take this update uncompressed.

    States are ``state_dtype`` (default: the parameter's dtype, the paper's pure-bf16 setting);
    arithmetic is float32 or wider. Parameters are processed one at a time.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        validate_adam_hparams(group)
        self.validate_group(group)

    def validate_group(self, group: dict[str, Any]) -> None:
        """Method-specific checks of a group (called when it is added)."""

    def compressed_shape(self, p: torch.Tensor, group: dict[str, Any]) -> tuple[int, ...] | None:
        """Shape of ``p``'s moments in compressed space; ``None``: uncompressed AdamW."""
        raise NotImplementedError

    def extra_state_shapes(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, tuple]:
        """Persistent tensors beyond the moments (projectors, stored norms) by state key."""
        return {}

    def compress(
        self, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any], t: int
    ) -> tuple[torch.Tensor, Any]:
        """``(compressed gradient, context for expand)`` of the wide gradient ``g``."""
        raise NotImplementedError

    def expand(self, step: CompressedStep) -> torch.Tensor:
        """The full-size update direction from the normalised compressed one."""
        raise NotImplementedError

    def init_extra_state(self, p: torch.Tensor, state: dict[str, Any], index: int) -> None:
        """Non-tensor state set at initialisation (``index``: 1-based position over all groups)."""

    def planned_state_numel(self) -> int:
        """Elements of state once every parameter has stepped: moments, projectors, norms.

        Read off the same shapes that allocate the states, so it holds on meta-device models.
        """
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                shape = self.compressed_shape(p, group)
                total += 2 * math.prod(p.shape if shape is None else shape)
                if shape is not None:
                    total += sum(math.prod(s) for s in self.extra_state_shapes(p, group).values())
        return total

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = run_closure(closure)
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                self._update(p, group, index)
        return loss

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        state = self.state[p]
        shape = self.compressed_shape(p, group)
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        state["step"] = new_step_counter()
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = torch.zeros(
                p.shape if shape is None else shape, dtype=dtype, device=p.device
            )
        if shape is not None:
            for key, extra in self.extra_state_shapes(p, group).items():
                state[key] = torch.zeros(extra, dtype=dtype, device=p.device)
            self.init_extra_state(p, state, index)

    def _next_step(
        self, p: torch.Tensor, group: dict[str, Any], index: int
    ) -> tuple[dict[str, Any], int]:
        """``p``'s state (made at its first step) with its step counted, and that step's number."""
        state = self.state[p]
        if not state:
            self._init_state(p, group, index)
        return state, count_step(state)

    def _update(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        state, t = self._next_step(p, group, index)
        compressed = self.compressed_shape(p, group) is not None
        beta1, beta2 = group["betas"]

        g = p.grad.to(compute_dtype(p.dtype))
        low, context = self.compress(g, state, group, t) if compressed else (g, None)
        m = ema_(state["exp_avg"], low, beta1, square=False)
        v = ema_(state["exp_avg_sq"], low, beta2, square=True)
        denom = v.sqrt().add_(group["eps"])
        normalized = m / denom
        if compressed:
            update = self.expand(
                CompressedStep(g, low, normalized, denom, context, state, group, t)
            )
        else:
            update = normalized

        lr = group["lr"]
        p.add_(update, alpha=-lr * math.sqrt(1 - beta2**t) / (1 - beta1**t))
        if group["weight_decay"]:
            p.add_(p, alpha=-lr * group["weight_decay"])


class ProjectedAdamW(CompressedAdamW):
    """A ``CompressedAdamW`` whose 2-d parameters are projected on a stored ``basis``.

    Groups take ``rank`` (``None``: uncompressed AdamW) and ``proj_type``; the basis is
    ``plan.basis_shape`` and the moments ``plan.low_shape``.
    """

    def validate_group(self, group: dict[str, Any]) -> None:
        validate_projection_group(group)

    def new_basis(self, g: torch.Tensor, plan: Projection, state: dict[str, Any]) -> torch.Tensor:
        """The basis for the next ``update_proj_gap`` steps, from the wide gradient ``g``."""
        raise NotImplementedError

    def compress(
        self, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any], t: int
    ) -> tuple[torch.Tensor, Projection]:
        """Refresh the basis at steps 1, T+1, 2T+1, ... (``T = update_proj_gap``), project."""
        plan = self.plan_for(g, group)
        if refresh_due(state, group, t):
            state["basis"].copy_(self.new_basis(g, plan, state))
        return project(g, state["basis"].to(g.dtype), plan.side), plan

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
