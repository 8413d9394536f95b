"""FOAM: Adam with block-folded moments plus a per-step residual (the paper's Algorithm 1)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.adamw import adamw as functional_adamw

from foam.folding import (
    FoldPlan,
    add_unfolded_,
    block_views,
    blocks_of,
    fold_plan,
    folded_numel,
    residual,
    unfold,
    validate_fold_settings,
    values_of,
)
from foam.hparams import group_defaults, validate_adam_hparams
from foam.numerics import compute_dtype, ema_, resolve_dtype
from foam.sharding import ShardFold, fold_shard, local, shard_fold, zeros_state
from foam.state import DtypeFaithfulOptimizer

SECOND_MOMENTS = ("square_of_mean", "mean_of_squares")
FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # where torch ships a fused AdamW kernel
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_adamw_applies(p: torch.Tensor) -> bool:
    """Whether torch's fused AdamW kernel can update ``p`` (its device and dtype have one)."""
    return p.device.type in FUSED_DEVICES and p.dtype in FUSED_DTYPES


class FOAM(DtypeFaithfulOptimizer):
    """Adam whose moments are stored as block means along one axis, plus a residual.

    A parameter with at least two dims in a group whose ``level`` is not ``None`` keeps its first
    and second moments folded to blocks of ``2**level`` entries (``level="mini"``: one block per
    row of the smaller dim). A level whose blocks are longer than a small matrix's fold axis folds
    that matrix as one block over the axis (its FOAM-Mini) and says so once in the ``foam`` log.
    Each step re-adds the detail the fold loses, the residual ``R = G - E(A(G))``, to both moments
    (the first as ``E(m) + rho R``, the second as ``E(v) + rho^2 R^2``). Everything else, and
    every group with ``level=None``, takes the plain AdamW update without ``alpha``.

    The constructor's signature is the one home of FOAM's defaults (the registry and the
    trainer's configs read them from it); the hyperparameter rules are
    :func:`foam.hparams.validate_adam_hparams` and :func:`foam.folding.validate_fold_settings`.

    Parameters are processed one at a time, so the transient memory of a step is a few
    temporaries the size of one parameter, never the whole model's.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        level: int | str | None = 2,
        alpha: float = 0.25,
        residual: bool | float = True,
        residual_in_second_moment: bool = True,
        second_moment: str = "square_of_mean",
        bias_correction: bool = True,
        fold_axis: str = "larger",
        state_dtype: torch.dtype | str | None = None,
        fused_adamw: bool = True,
    ) -> None:
        super().__init__(params, group_defaults(locals()))

    # -- configuration -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate every group when it is added, so a bad level fails before any compute."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _validate_group(group)
        for p in group["params"]:
            self.shard_fold_for(p, group)  # plans (and logs a clamped level), checks shards

    plan_for = staticmethod(fold_plan)

    def shard_fold_for(self, p: torch.Tensor, group: dict[str, Any]) -> ShardFold | None:
        """How this rank folds its part of ``p`` (all of it unless ``p`` is a DTensor shard,
        see ``foam/sharding.py``); raises when a block would straddle two ranks."""
        plan = self.plan_for(p, group)
        if plan is None:
            return None
        index = next(i for i, q in enumerate(group["params"]) if q is p)
        return shard_fold(p, plan, f"parameter {index} of group {group.get('name', '')!r}")

    def planned_state_numel(self, per_rank: bool = True) -> int:
        """Elements of moment state this optimizer holds once every parameter has stepped: on
        this rank (``per_rank``), or for the whole, unsharded model.

        Derived from the same fold plans that size the states, so memory estimates made on a
        meta-device model and the states really allocated cannot disagree.
        """
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                if per_rank:
                    fold_of = self.shard_fold_for(p, group)
                    numel = local(p).numel() if fold_of is None else fold_of.local_state_numel()
                else:
                    numel = folded_numel(self.plan_for(p, group), p.numel())
                total += 2 * numel
        return total

    # -- the step --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            fused = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FOAM does not support sparse gradients")
                if self._uses_fused_adamw(p, group):
                    fused.append(p)
                else:
                    self._update(p, group)
            if fused:
                self._fused_adamw(fused, group)
        return loss

    def _uses_fused_adamw(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` takes plain AdamW through torch's fused multi-tensor kernel.

        The kernel does AdamW's arithmetic in float32 whatever the tensors' dtype and needs no
        temporaries, which is what this optimizer promises for the unfolded parameters (for bf16
        embeddings it is several times faster than upcasting copies). It applies to same-dtype
        parameter, gradient and states with bias correction on a device that has the kernel;
        ``fused_adamw=False`` keeps the per-tensor path (bitwise equal to ``AdamW(foreach=False)``).
        """
        return (
            group["fused_adamw"]
            and self.plan_for(p, group) is None
            and group["bias_correction"]
            and fused_adamw_applies(p)
            and p.grad.dtype == p.dtype
            and resolve_dtype(group["state_dtype"], p.dtype) == p.dtype
        )

    def _fused_adamw(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        states = []
        for p in params:
            state = self.state[p]
            if not state:
                self._init_state(p, group, None)
            elif (
                state["step"].device != p.device
            ):  # e.g. loaded from a checkpoint on another device
                state["step"] = state["step"].to(p.device)
            states.append(state)
        beta1, beta2 = group["betas"]
        functional_adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],  # the kernel increments them
            fused=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def _init_state(
        self, p: torch.Tensor, group: dict[str, Any], fold_of: ShardFold | None
    ) -> None:
        state = self.state[p]
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        # The fused kernel reads its step counter on the parameter's device; other paths on the CPU.
        fused = self._uses_fused_adamw(p, group)
        state["step"] = torch.tensor(0.0, device=p.device if fused else "cpu")
        state["exp_avg"] = zeros_state(p, fold_of, dtype)
        state["exp_avg_sq"] = zeros_state(p, fold_of, dtype)

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """One step of ``param``; on a DTensor, the arithmetic runs on this rank's shard."""
        fold_of = self.shard_fold_for(param, group)
        state = self.state[param]
        if not state:
            self._init_state(param, group, fold_of)
        plan = None if fold_of is None else fold_of.local
        p, moments = local(param), (local(state["exp_avg"]), local(state["exp_avg_sq"]))
        state["step"] += 1
        t = int(state["step"].item())
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        bc1 = 1 - beta1**t if group["bias_correction"] else 1.0
        bc2 = 1 - beta2**t if group["bias_correction"] else 1.0

        wide = compute_dtype(p.dtype)
        grad = local(param.grad)
        grad = grad if plan is None else grad.reshape(plan.rows, plan.cols)
        g = grad.to(wide)

        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        if fold_of is not None and fold_of.averages:
            g_folded = fold_shard(g, fold_of, param)
            m = ema_(moments[0], g_folded, beta1, square=False)
            if group["second_moment"] == "mean_of_squares":
                v = ema_(moments[1], fold_shard(g.square(), fold_of, param), beta2, square=False)
            else:
                v = ema_(moments[1], g_folded, beta2, square=True)
            self._residual_step(p, g, g is not grad, g_folded, m / bc1, v / bc2, plan, group)
        else:
            # Identity fold (plain AdamW, or level 0): no residual, and torch.optim.AdamW's exact
            # formula, so level 0 with alpha 1 reproduces it to the last bit.
            m = ema_(moments[0], g, beta1, square=False)
            v = ema_(moments[1], g, beta2, square=True)
            denom = (v.sqrt() / bc2**0.5).add_(eps)
            step_size = lr * (1.0 if plan is None else group["alpha"])
            p.addcdiv_(m.view(p.shape), denom.view(p.shape), value=-step_size / bc1)

    @staticmethod
    def _residual_step(
        p: torch.Tensor,
        g: torch.Tensor,
        g_owned: bool,
        g_folded: torch.Tensor,
        m_hat: torch.Tensor,
        v_hat: torch.Tensor,
        plan: FoldPlan,
        group: dict[str, Any],
    ) -> None:
        """``p -= lr * alpha * (E(m_hat) + rho R) / (sqrt(E(v_hat) + rho^2 R^2) + eps)``.

        ``R = g - E(A(g))``. Per-block values are broadcast over block views instead of
        materialising ``E(.)``, and each pass writes where the next one reads, so a step makes
        about as many full-size passes as AdamW's, with two full-size temporaries: the residual
        (which becomes the numerator; it is ``g`` itself when ``g`` is already a private copy)
        and the denominator.
        """
        rho, eps = float(group["residual"]), group["eps"]
        step_size = group["lr"] * group["alpha"]
        if rho == 0.0:  # the no-residual ablation: a block-constant update
            p.add_(unfold(m_hat / (v_hat.sqrt() + eps), plan).view(p.shape), alpha=-step_size)
            return

        r = residual(g, g_folded, plan, out=g if g_owned else None)  # never write into p.grad

        denom = None
        if group["residual_in_second_moment"]:
            denom = torch.empty_like(r)
            squares = blocks_of(denom, plan), blocks_of(r, plan), values_of(v_hat, plan)
            for d, rb, v in zip(*squares, strict=True):
                torch.addcmul(v, rb, rb, value=rho * rho, out=d)
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


def _validate_group(group: dict[str, Any]) -> None:
    """Reject settings that would otherwise produce silent garbage mid-training."""
    validate_adam_hparams(group)
    validate_fold_settings(group)
    if group["second_moment"] not in SECOND_MOMENTS:
        raise ValueError(
            f"second_moment must be one of {SECOND_MOMENTS}, got {group['second_moment']!r}"
        )
