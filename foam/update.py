"""FOAM's update in one place: the scalars of a step and the paper's / the release's update.

For a folded matrix every path (the eager step below, the C++ operator foam/csrc/foam_step.cpp and
the Triton kernel foam/triton_kernels.py, both through foam/fused.py) computes

    m <- b1 m + (1 - b1) A(g),   v <- b2 v + (1 - b2) A(g)^2   (A(g^2) with "mean_of_squares")
    p <- p * decay - step_size * (E(m / bc1) + rho R) / (sqrt(E(v / bc2) + rho_sq R^2) + eps)

with ``R = g - E(A(g))``, and takes its numbers from here: :class:`StepScalars` (a group's, at one
step) and :func:`bias_corrections` (at a matrix's step count). The paper's update divides the
moments by ``bc1``/``bc2`` and decays before the update; the authors' release folds the bias
correction into one step-size factor and decays after it (README, "Paper and release
semantics"); the kernels implement the paper's (:func:`kernels_compute`). This module imports
only torch and the leaves ``foam.folding`` and ``foam.numerics``, so any path can read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from foam.folding import (
    PAPER_TAIL_BLOCK,
    FoldPlan,
    add_unfolded_,
    block_views,
    blocks_of,
    residual,
    unfold,
    values_of,
)
from foam.numerics import compute_dtype, ema_

SECOND_MOMENTS = ("square_of_mean", "mean_of_squares")
# True: the folded EMAs are corrected before unfolding (FOAM_SPEC section 2); False: none
# (Algorithm 1 as printed); "step_size": one factor sqrt(1 - b2^t) / (1 - b1^t) on the step size
# of every parameter, residual included (the authors' release).
BIAS_CORRECTIONS = (True, False, "step_size")
DECAYS = ("before_update", "after_update")  # when W <- W * (1 - lr * wd) is applied


def bias_corrections(
    mode: bool | str, betas: tuple[float, float], t: int
) -> tuple[float, float, float]:
    """``(bc1, bc2, step_scale)`` at step ``t``: the moments are divided by ``bc1``/``bc2`` and
    the step is multiplied by ``step_scale`` (see :data:`BIAS_CORRECTIONS`)."""
    bc1, bc2 = 1 - betas[0] ** t, 1 - betas[1] ** t
    if mode == "step_size":
        return 1.0, 1.0, math.sqrt(bc2) / bc1
    return (bc1, bc2, 1.0) if mode else (1.0, 1.0, 1.0)


def kernels_compute(bias_correction: bool | str, tail_block: str, decay: str) -> bool:
    """Whether the fused kernels compute this update: the paper's (moments corrected or not, mean
    tail blocks, decay before the update); the release's runs eagerly."""
    return (
        bias_correction != "step_size"
        and tail_block == PAPER_TAIL_BLOCK
        and decay == "before_update"
    )


@dataclass(frozen=True)
class StepScalars:
    """The numbers one step of a group needs, beyond each matrix's bias corrections.

    ``decay`` multiplies the parameter before the update (after it when ``decay_after_update``,
    the release's order, which only the eager step takes); ``rho_sq`` is 0 when the residual is
    kept out of the second moment.
    """

    beta1: float
    beta2: float
    rho: float
    rho_sq: float
    eps: float
    step_size: float
    decay: float
    mean_of_squares: bool
    decay_after_update: bool = False

    @classmethod
    def of_group(
        cls, group: Mapping[str, Any], step_scale: float = 1.0, alpha: float | None = None
    ) -> StepScalars:
        """The scalars of ``group``'s step now (an LR schedule changes ``lr`` between steps).

        ``step_scale`` is the release's bias correction of the step (1 otherwise, see
        :func:`bias_corrections`); ``alpha`` the module-wise lr scale, the group's unless given
        (1 for a parameter the group does not fold)."""
        rho = float(group["residual"])
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        return cls(
            beta1=beta1,
            beta2=beta2,
            rho=rho,
            rho_sq=rho * rho if group["residual_in_second_moment"] else 0.0,
            eps=group["eps"],
            step_size=lr * (group["alpha"] if alpha is None else alpha) * step_scale,
            decay=1 - lr * group["weight_decay"],
            mean_of_squares=group["second_moment"] == "mean_of_squares",
            decay_after_update=group["decay"] == "after_update",
        )

    def as_list(self) -> list[float]:
        """The floats in the order the C++ operator reads them."""
        return [
            self.beta1,
            self.beta2,
            self.rho,
            self.rho_sq,
            self.eps,
            self.step_size,
            self.decay,
        ]


def eager_step_(
    p: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    plan: FoldPlan | None,
    fold: Callable[[torch.Tensor], torch.Tensor] | None,
    corrections: tuple[float, float],
    scalars: StepScalars,
) -> None:
    """One eager step of ``p`` (a plain tensor: a DTensor's local shard), in place on it and its
    moments; the readable reference the kernels are tested against.

    ``plan`` is ``p``'s fold (``None``: moments in full); ``fold`` computes A of a full-size 2-d
    tensor (``foam.sharding.fold_shard`` on a shard), ``None`` when the fold averages nothing.
    Without a fold this is torch.optim.AdamW's exact formula, so level 0 with alpha 1 reproduces
    it to the last bit (with the release's step-size bias correction, the release's Adam step).
    """
    bc1, bc2 = corrections
    grad = grad if plan is None else grad.reshape(plan.rows, plan.cols)
    g = grad.to(compute_dtype(p.dtype))
    decays = scalars.decay != 1.0
    if decays and not scalars.decay_after_update:
        p.mul_(scalars.decay)
    if fold is not None:
        g_folded = fold(g)
        m = ema_(exp_avg, g_folded, scalars.beta1, square=False)
        if scalars.mean_of_squares:
            v = ema_(exp_avg_sq, fold(g.square()), scalars.beta2, square=False)
        else:
            v = ema_(exp_avg_sq, g_folded, scalars.beta2, square=True)
        _residual_step(p, g, g is not grad, g_folded, m / bc1, v / bc2, plan, scalars)
    else:
        m = ema_(exp_avg, g, scalars.beta1, square=False)
        v = ema_(exp_avg_sq, g, scalars.beta2, square=True)
        denom = (v.sqrt() / bc2**0.5).add_(scalars.eps)
        p.addcdiv_(m.view(p.shape), denom.view(p.shape), value=-scalars.step_size / bc1)
    if decays and scalars.decay_after_update:
        p.mul_(scalars.decay)


def _residual_step(
    p: torch.Tensor,
    g: torch.Tensor,
    g_owned: bool,
    g_folded: torch.Tensor,
    m_hat: torch.Tensor,
    v_hat: torch.Tensor,
    plan: FoldPlan,
    scalars: StepScalars,
) -> None:
    """``p -= step_size * (E(m_hat) + rho R) / (sqrt(E(v_hat) + rho_sq R^2) + eps)``.

    ``R = g - E(A(g))``. Per-block values are broadcast over block views instead of
    materialising ``E(.)``, and each pass writes where the next one reads, so a step makes
    about as many full-size passes as AdamW's, with two full-size temporaries: the residual
    (which becomes the numerator; it is ``g`` itself when ``g`` is already a private copy)
    and the denominator.
    """
    rho, eps, step_size = scalars.rho, scalars.eps, scalars.step_size
    if rho == 0.0:  # the no-residual ablation: a block-constant update
        p.add_(unfold(m_hat / (v_hat.sqrt() + eps), plan).view(p.shape), alpha=-step_size)
        return

    r = residual(g, g_folded, plan, out=g if g_owned else None)  # never write into p.grad

    denom = None
    if scalars.rho_sq:
        denom = torch.empty_like(r)
        squares = blocks_of(denom, plan), blocks_of(r, plan), values_of(v_hat, plan)
        for d, rb, v in zip(*squares, strict=True):
            torch.addcmul(v, rb, rb, value=scalars.rho_sq, out=d)
        denom.sqrt_().add_(eps)

    if rho != 1.0:
        r.mul_(rho)
    numerator = add_unfolded_(r, m_hat, plan)
    if denom is not None:
        p.addcdiv_(numerator.view(p.shape), denom.view(p.shape), value=-step_size)
        return
    for blocks, d in block_views(numerator, v_hat.sqrt().add_(eps), plan):
        blocks.div_(d)
    p.add_(numerator.view(p.shape), alpha=-step_size)
