"""LDAdamW (Robert et al., 2025): low-rank Adam with subspace transport and error feedback.

Reference: ``LDAdamW`` of github.com/IST-DASLab/LDAdam (``ldadamw_torch``, HEAD ``f3c5daf``),
GitHub-only; tests compare against golden trajectories in ``tests/data/``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import torch

from foam.errors import OptionError, require_choice
from foam.hparams import group_defaults, signature_defaults
from foam.lowrank import (
    ProjectedAdamW,
    Projection,
    basis_along_sharded_dim,
    local_parts,
    project,
    project_back,
    resolve_rank,
    svd_basis,
)
from foam.numerics import compute_dtype
from foam.param_groups import ParamSplit
from foam.registry import (
    OTHERS,
    adam_settings,
    method_groups,
    register,
    with_adamw_for_others,
)
from foam.shard_owners import Layout, Owners, layout_of
from foam.shard_sums import PartialSums
from foam.sharding import local

PROJ_METHODS = ("power_iteration", "svd")


def orthonormalize(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns by QR, always in float32 as the reference (even for float64 input)."""
    return torch.linalg.qr(x.float()).Q.to(x.dtype)


def power_iteration(b: torch.Tensor, previous: torch.Tensor, side: str) -> torch.Tensor:
    """One block power-iteration step for ``b``'s top subspace, warm-started at ``previous``."""
    if side == "left":
        return orthonormalize(b @ (b.T @ previous))
    return orthonormalize(b.T @ (b @ previous.T)).T


class LDAdamW(ProjectedAdamW):
    """Adam in a slowly rotating low-rank subspace, with the compression error fed back.

    For a 2-d parameter in a group whose ``rank`` is not ``None``, at step ``t = 1, 2, ...``:

    1. ``a = p.grad``, which holds the new gradient *plus the previous error*: with
       ``error_feedback`` this class's ``zero_grad`` leaves those gradients alone and ``step``
       writes the error into them (the reference's design; no separate buffer);
    2. new basis: at ``t = 1`` the top singular vectors of ``a``; later of ``b = rho *
       back_old(m) / (1 - beta1**(t-1)) + (1 - rho) * a``, by one block power-iteration step from
       the old basis (``proj_method="power_iteration"``) or an SVD (``"svd"``). QR and SVD run in
       float32 as in the reference;
    3. ``low = project(a)``; ``m`` and ``v`` are transported to the new basis (``R`` = overlap of
       the bases: ``m' = R m``; the variance ``v/bc2 - m^2/bc1^2`` is mapped by ``R o R`` and
       re-combined with ``m'^2``); the errors of the gradient and of the momentum transport are
       stored in ``p.grad``;
    4. torch-style Adam in the low-rank space, ``d = (m / bc1) / (sqrt(v / bc2) + eps)``;
    5. ``W *= 1 - lr * wd`` *before* ``W -= lr * back(d)``; no scale factor.

    The state layout, accounting and loading are ``CompressedAdamW``'s; the update is not (it is
    torch-style, not HF-style). Other parameters take torch-style AdamW (eps after bias
    correction, decay first), as the reference's full-rank groups. Differences from the
    reference: the step counter is per parameter (the reference counts optimizer steps; equal
    when every parameter has a gradient at every step); for ``proj_type="std"`` square matrices are projected on the left, as the
    reference; the rank is capped at the projected dim where the reference raises;
    ``svd_lowrank`` (randomised) is not offered. Defaults: betas (0.9, 0.95) (paper; the
    reference's are (0.908, 0.99)), eps 1e-8, rho 0.908.

    State per compressed parameter: ``exp_avg``, ``exp_avg_sq`` (``max(m, n) x rank``) and
    ``basis`` (``rank x min(m, n)``), all ``state_dtype``, plus the step counter; the error
    buffer is the gradient itself (``m x n`` in the gradient's dtype, not optimizer state; the
    state dict carries it under ``"error"`` so that a resumed run continues exactly).

    Under FSDP2 step 2 runs on each matrix's owner (``before_updates``) and the rest on each
    rank's shard, the error staying in the sharded gradient: within rounding of the unsharded
    step (``tests/test_fsdp_lowrank8bit.py``).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        rank: int | None = 16,
        rho: float = 0.908,
        proj_type: str = "std",
        proj_method: str = "power_iteration",
        error_feedback: bool = True,
        state_dtype: torch.dtype | str | None = None,
    ) -> None:
        self._from_owners: dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]] = {}
        """This step's new basis (and projection) of each sharded matrix, from its owner."""
        super().__init__(params, group_defaults(locals()))

    def validate_group(self, group: dict[str, Any]) -> None:
        super().validate_group(group)
        if not 0.0 <= group["rho"] < 1.0:
            raise OptionError("rho", f"rho must be in [0, 1), got {group['rho']!r}")
        require_choice("proj_method", group["proj_method"], PROJ_METHODS)

    @staticmethod
    def plan_for(p: torch.Tensor, group: dict[str, Any]) -> Projection | None:
        """As GaLore's, but square matrices are projected on the left (as the reference)."""
        square = p.dim() == 2 and p.shape[0] == p.shape[1]
        if square and group["proj_type"] in ("std", "reverse_std"):
            group = {**group, "proj_type": "left"}
        return ProjectedAdamW.plan_for(p, group)

    grad_state_key = "error"
    refreshes_on_owners = True

    def keeps_grad_state(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p.grad`` holds an error-feedback buffer between steps (saved as "error")."""
        return group["error_feedback"] and self.plan_for(p, group) is not None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, except those that carry the error feedback of low-rank parameters."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.keeps_grad_state(p, group):
                    continue
                if set_to_none:
                    p.grad = None
                else:  # torch's way: DDP's bucket-view gradients refuse detach_()
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def state_layouts(
        self, plan: Projection, layout: Layout
    ) -> tuple[tuple[str, tuple[int, int], int | None], ...]:
        """A sharded matrix's basis is replicated (every rank rotates its moments by the overlap
        of the whole old and new bases); its moments are sharded with the weight where their
        shape keeps its sharded dim (the basis on the unsharded side), else replicated."""
        moments = None if basis_along_sharded_dim(plan, layout) else layout.dim
        return (
            ("exp_avg", plan.low_shape, moments),
            ("exp_avg_sq", plan.low_shape, moments),
            ("basis", plan.basis_shape, None),
        )

    def before_updates(self, todo: list[tuple[torch.Tensor, dict[str, Any], int]]) -> None:
        """The new bases of this step's sharded matrices, on their owners (one ``all_to_all``
        each way for all of them, once per ``step()``, whatever the micro-batches).

        Each rank sends its piece of the matrix whose top subspace is sought: the gradient at
        the first step, else the blend ``b`` (its piece is local: the moments or the basis are
        sharded with the weight). Where the basis lies along the sharded dim the projection
        ``low`` is a sum over the ranks, so the owner computes it too, from the whole gradient
        (it then sends the gradient and blends it there, its moments being replicated): every
        rank receives the basis (and ``low``) whole, as the single-process step computes them.
        """
        self._from_owners.clear()
        due = list(self.sharded_todo(todo))
        if not due:
            return
        wide = compute_dtype(due[0][0].dtype)
        if any(compute_dtype(p.dtype) != wide for p, *_ in due):
            raise ValueError("LDAdamW: sharded matrices of mixed dtypes")
        pieces = []
        for p, group, plan, layout, t in due:
            a = local(p.grad).to(wide)
            if t > 1 and not basis_along_sharded_dim(plan, layout):
                parts = local_parts(self.state[p])
                a = blend(a, parts["exp_avg"].to(wide), parts["basis"].to(wide), plan, group, t)
            pieces.append(a)
        owners = Owners([layout for *_, layout, _ in due], due[0][0].device_mesh.get_group())
        results = {}
        for j, whole in owners.gather(pieces, wide).items():
            p, group, plan, layout, t = due[j]
            state = self.state[p]
            old = local(state["basis"]).to(wide)
            if basis_along_sharded_dim(plan, layout):
                new = next_basis(whole, local(state["exp_avg"]).to(wide), old, plan, group, t)
                low = project(whole, new, plan.side)
                results[j] = torch.cat((new.reshape(-1), low.reshape(-1))).view(1, -1)
            else:
                new = (
                    svd_basis(whole, plan).to(wide) if t == 1 else basis_of(whole, old, plan, group)
                )
                results[j] = new.reshape(1, -1)
        layouts = [owner_results_layout(plan, layout) for _, _, plan, layout, _ in due]
        received = owners.scatter(results, layouts, wide, pieces[0].device)
        for (p, _, plan, _, _), flat in zip(due, received, strict=True):
            basis_numel = math.prod(plan.basis_shape)
            new = flat[0, :basis_numel].view(plan.basis_shape)
            low = (
                flat[0, basis_numel:].view(plan.low_shape) if flat.shape[1] > basis_numel else None
            )
            self._from_owners[p] = (new, low)

    def _update(
        self, p: torch.Tensor, group: dict[str, Any], index: int, sums: PartialSums
    ) -> None:
        """The whole step at once (a sharded matrix's on its shard, with the basis and, where it
        lies along the sharded dim, the projection from its owner: ``sums`` stays empty)."""
        state, t = self._next_step(p, group, index)
        beta1, beta2 = group["betas"]
        plan = self.plan_for(p, group)
        wide = compute_dtype(p.dtype)
        from_owner = self._from_owners.pop(p, None)
        parts = local_parts(state)
        a = local(p.grad).to(wide)
        basis = parts["basis"] if plan is not None else None
        if plan is None:
            m, v, low = parts["exp_avg"].to(wide), parts["exp_avg_sq"].to(wide), a
        else:
            m, v, low, basis = self._transport(p, a, plan, parts, group, t, from_owner)
        m.mul_(beta1).add_(low, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(low, low, value=1 - beta2)
        parts["exp_avg"].copy_(m)
        parts["exp_avg_sq"].copy_(v)
        direction = (m / (1 - beta1**t)).div_((v / (1 - beta2**t)).sqrt_().add_(group["eps"]))
        if plan is not None:
            direction = project_back(direction, basis, plan.side)
        weight = local(p)
        weight.mul_(1 - group["lr"] * group["weight_decay"])
        weight.add_(direction, alpha=-group["lr"])

    def _transport(
        self,
        p: torch.Tensor,
        a: torch.Tensor,
        plan: Projection,
        state: dict[str, Any],
        group: dict[str, Any],
        t: int,
        from_owner: tuple[torch.Tensor, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Steps 2-3: the new basis, the projected gradient, moments moved to the new basis.

        Returns wide ``(m', v', low, this rank's piece of the new basis as stored)``; stores the
        new basis and (with error feedback) the error. ``state`` and ``a`` are this rank's
        pieces, and ``from_owner`` the new basis (and the projection, or ``None``) of a sharded
        matrix.
        """
        beta1 = group["betas"][0]
        side = plan.side
        m = state["exp_avg"].to(a.dtype)
        v = state["exp_avg_sq"].to(a.dtype)
        old = state["basis"].to(a.dtype)  # zeros before the first step
        cut = whole_piece
        if from_owner is None:
            new = next_basis(a, m, old, plan, group, t)
            low = project(a, new, side)
        else:
            new, low = from_owner
            if low is None:  # the basis on the unsharded side: the projection is the shard's
                low = project(a, new, side)
            else:  # the basis along the sharded dim: this rank's rows (columns) of it
                layout = layout_of(p)
                pieces = Layout(plan.basis_shape, layout.dim, layout.ranks)
                cut = functools.partial(pieces.cut, rank=p.device_mesh.get_local_rank())
        old_piece, new_piece = cut(old), cut(new)
        rotation = new.T @ old if side == "left" else old @ new.T
        m_new = rotation @ m if side == "left" else m @ rotation

        if group["error_feedback"]:
            error = a.sub_(project_back(low, new_piece, side))
            k = beta1 / (1 - beta1)
            error.add_(project_back(m, old_piece, side), alpha=k)
            error.sub_(project_back(m_new, new_piece, side), alpha=k)
            local(p.grad).copy_(error)

        if t > 1:
            bc1, bc2 = 1 - beta1 ** (t - 1), 1 - group["betas"][1] ** (t - 1)
            variance = v.div(bc2).addcmul_(m, m, value=-1 / bc1**2)
            squared = rotation * rotation
            variance = squared @ variance if side == "left" else variance @ squared
            v = variance.addcmul_(m_new, m_new, value=1 / bc1**2).mul_(bc2).abs_()
        state["basis"].copy_(new)
        return m_new, v, low, cut(state["basis"].to(a.dtype))


def whole_piece(x: torch.Tensor) -> torch.Tensor:
    """The piece of a replicated basis that one rank's shard uses: all of it."""
    return x


def blend(
    a: torch.Tensor,
    m: torch.Tensor,
    old: torch.Tensor,
    plan: Projection,
    group: dict[str, Any],
    t: int,
) -> torch.Tensor:
    """``b = rho * back_old(m) / (1 - beta1**(t-1)) + (1 - rho) * a``, whose top subspace is the
    next basis (of pieces of ``a`` and ``m`` when those are a shard's)."""
    b = project_back(m, old, plan.side).div_(1 - group["betas"][0] ** (t - 1)).mul_(group["rho"])
    return b.add_(a, alpha=1 - group["rho"])


def basis_of(
    b: torch.Tensor, old: torch.Tensor, plan: Projection, group: dict[str, Any]
) -> torch.Tensor:
    """The new basis from the whole blend ``b``: an SVD, or one power-iteration step from ``old``."""
    if group["proj_method"] == "svd":
        return svd_basis(b, plan).to(b.dtype)
    return power_iteration(b, old, plan.side)


def next_basis(
    a: torch.Tensor,
    m: torch.Tensor,
    old: torch.Tensor,
    plan: Projection,
    group: dict[str, Any],
    t: int,
) -> torch.Tensor:
    """Step 2's basis from the whole gradient ``a``, moments ``m`` and old basis ``old``."""
    if t == 1:
        return svd_basis(a, plan).to(a.dtype)
    return basis_of(blend(a, m, old, plan, group, t), old, plan, group)


def owner_results_layout(plan: Projection, layout: Layout) -> Layout:
    """What an owner sends every rank of a sharded matrix, in one row: the new basis, then the
    projection where the basis lies along the sharded dim (a sum over ranks done there)."""
    numel = math.prod(plan.basis_shape)
    if basis_along_sharded_dim(plan, layout):
        numel += math.prod(plan.low_shape)
    return Layout((1, numel), None, layout.ranks)


OPTIONS = ("rho", "proj_type", "proj_method", "error_feedback", "state_dtype")


@register(
    "ldadamw",
    shards=True,
    rank=None,
    rank_fraction=0.25,
    **signature_defaults(LDAdamW, *OPTIONS),
    **OTHERS,
)
def _ldadamw(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """LDAdamW on the attention/MLP matrices, torch-style AdamW at the base lr on the rest.

    ``rank`` overrides ``rank_fraction`` of the hidden size (0.25: Table 2 of the FOAM paper
    gives LDAdamW the memory of GaLore-1/4).
    """
    rank = resolve_rank(split, hp["rank"], hp["rank_fraction"])
    groups = method_groups(split, {"rank": rank}, {"rank": None}, hp)
    ldadamw = LDAdamW(groups, **adam_settings(hp), **{k: hp[k] for k in OPTIONS})
    return with_adamw_for_others(split, ldadamw, hp)
