"""FOAM: Adam with block-folded moments plus a per-step residual (FOAM_SPEC sections 1-3)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.adamw import adamw as functional_adamw

from foam import fused as fused_foam
from foam.folding import (
    FOLD_AXES,
    FoldPlan,
    add_unfolded_,
    block_views,
    blocks_of,
    fold,
    folded_numel,
    make_plan,
    residual,
    unfold,
    values_of,
)
from foam.state import load_state_dict_keeping_dtypes

SECOND_MOMENTS = ("square_of_mean", "mean_of_squares")
FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # where torch ships a fused AdamW kernel
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def resolve_dtype(value: torch.dtype | str | None, fallback: torch.dtype) -> torch.dtype:
    """``None`` -> ``fallback``; ``"float32"``/``"bfloat16"``/... (config files) -> the torch dtype."""
    if value is None:
        return fallback
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"state_dtype must be a floating torch dtype or its name, got {value!r}")
    return dtype


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or the parameter's dtype when it is wider (float64 parameters stay float64)."""
    return torch.promote_types(dtype, torch.float32)


def ema_(state: torch.Tensor, value: torch.Tensor, beta: float, *, square: bool) -> torch.Tensor:
    """Update an EMA state in place in wide arithmetic; return the wide updated value.

    ``square=True`` accumulates ``value**2``. The lerp / mul-addcmul forms are the ones
    ``torch.optim.AdamW`` uses, so level 0 reproduces it to rounding.
    """
    wide = state.to(value.dtype)
    if square:
        wide.mul_(beta).addcmul_(value, value, value=1 - beta)
    else:
        wide.lerp_(value, 1 - beta)
    if wide is not state:
        state.copy_(wide)
    return wide


class FOAM(torch.optim.Optimizer):
    """Adam whose moments are stored as block means along one axis, plus a residual.

    A parameter with at least two dims in a group whose ``level`` is not ``None`` keeps its first
    and second moments folded to blocks of ``2**level`` entries (``level="mini"``: one block per
    row of the smaller dim). Each step re-adds the detail the fold loses, the residual
    ``R = G - E(A(G))``, to both moments (FOAM_SPEC section 2). Everything else, and every group
    with ``level=None``, takes the plain AdamW update without ``alpha``.

    Parameters are processed one at a time, so the transient memory of a step is a few
    temporaries the size of one parameter, never the whole model's.

    ``implementation`` picks how folded matrices step: ``"eager"`` is the readable reference in
    this file; ``"fused"`` runs the one-pass kernels of foam/fused.py (C++ on the CPU, Triton on
    CUDA) and fails if the device's kernel cannot be built; ``"auto"`` (default) uses them where
    they apply and build, else the eager step. Level 0, float16/float64 and sharded parameters
    always step eagerly.
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
        implementation: str = "auto",
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            level=level,
            alpha=alpha,
            residual=residual,
            residual_in_second_moment=residual_in_second_moment,
            second_moment=second_moment,
            bias_correction=bias_correction,
            fold_axis=fold_axis,
            state_dtype=state_dtype,
            fused_adamw=fused_adamw,
            implementation=implementation,
        )
        super().__init__(params, defaults)

    # -- configuration -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate every group when it is added, so a bad level fails before any compute."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _validate_group(group)
        for p in group["params"]:
            self.plan_for(p, group)  # raises for a level beyond the matrix

    @staticmethod
    def plan_for(p: torch.Tensor, group: dict[str, Any]) -> FoldPlan | None:
        """How ``p`` is folded in ``group``; ``None`` when it takes plain AdamW."""
        if group["level"] is None or p.dim() < 2:
            return None
        return make_plan(p.shape, group["level"], group["fold_axis"])

    def planned_state_numel(self) -> int:
        """Elements of moment state this optimizer holds once every parameter has stepped.

        Derived from the same fold plans that size the states, so memory estimates made on a
        meta-device model and the states really allocated cannot disagree.
        """
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                plan = self.plan_for(p, group)
                total += 2 * folded_numel(plan, p.numel())
        return total

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        load_state_dict_keeping_dtypes(self, super().load_state_dict, state_dict)

    # -- the step --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            fused, folded = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FOAM does not support sparse gradients")
                if self._uses_fused_adamw(p, group):
                    fused.append(p)
                elif self._uses_fused_step(p, group):
                    folded.append(p)
                else:
                    self._update(p, group)
            if fused:
                self._fused_adamw(fused, group)
            if folded:
                self._fused_step(folded, group)
        return loss

    def _uses_fused_step(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` takes the fused FOAM step of foam/fused.py (see ``implementation``)."""
        if group["implementation"] == "eager":
            return False
        plan = self.plan_for(p, group)
        if not fused_foam.applies(p, plan, resolve_dtype(group["state_dtype"], p.dtype)):
            return False
        if fused_foam.kernel_available(p.device.type):
            return True
        if group["implementation"] == "fused":
            raise RuntimeError(
                f"implementation='fused' but the fused FOAM kernel for {p.device.type} is "
                "unavailable (see the log); use implementation='auto' or 'eager'"
            )
        return False

    def _fused_step(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        plans, states, bias_corrections = [], [], []
        for p in params:
            plan = self.plan_for(p, group)
            state = self.state[p]
            if not state:
                self._init_state(p, group, plan)
            plans.append(plan)
            states.append(state)
            bias_corrections.append(self._advance_step(state, group))
        for device in {p.device for p in params}:
            on = [i for i, p in enumerate(params) if p.device == device]
            fused_foam.fused_step(
                [params[i] for i in on],
                [states[i]["exp_avg"] for i in on],
                [states[i]["exp_avg_sq"] for i in on],
                [plans[i] for i in on],
                [bias_corrections[i] for i in on],
                fused_foam.StepScalars.of_group(group),
            )

    @staticmethod
    def _advance_step(state: dict[str, Any], group: dict[str, Any]) -> tuple[float, float]:
        """Count one more step; return the bias corrections ``(1 - b1^t, 1 - b2^t)`` (or ones)."""
        state["step"] += 1
        if not group["bias_correction"]:
            return 1.0, 1.0
        t = int(state["step"].item())
        beta1, beta2 = group["betas"]
        return 1 - beta1**t, 1 - beta2**t

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
            and p.device.type in FUSED_DEVICES
            and p.dtype in FUSED_DTYPES
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

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], plan: FoldPlan | None) -> None:
        state = self.state[p]
        shape = p.shape if plan is None else plan.folded_shape
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        # The fused kernel reads its step counter on the parameter's device; other paths on the CPU.
        fused = self._uses_fused_adamw(p, group)
        state["step"] = torch.tensor(0.0, device=p.device if fused else "cpu")
        state["exp_avg"] = torch.zeros(shape, dtype=dtype, device=p.device)
        state["exp_avg_sq"] = torch.zeros(shape, dtype=dtype, device=p.device)

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        plan = self.plan_for(p, group)
        state = self.state[p]
        if not state:
            self._init_state(p, group, plan)
        bc1, bc2 = self._advance_step(state, group)
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]

        wide = compute_dtype(p.dtype)
        grad = p.grad if plan is None else p.grad.reshape(plan.rows, plan.cols)
        g = grad.to(wide)

        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        if plan is not None and plan.block > 1:
            g_folded = fold(g, plan)
            m = ema_(state["exp_avg"], g_folded, beta1, square=False)
            if group["second_moment"] == "mean_of_squares":
                v = ema_(state["exp_avg_sq"], fold(g.square(), plan), beta2, square=False)
            else:
                v = ema_(state["exp_avg_sq"], g_folded, beta2, square=True)
            self._residual_step(p, g, g is not grad, g_folded, m / bc1, v / bc2, plan, group)
        else:
            # Identity fold (plain AdamW, or level 0): no residual, and torch.optim.AdamW's exact
            # formula, so level 0 with alpha 1 reproduces it to the last bit.
            m = ema_(state["exp_avg"], g, beta1, square=False)
            v = ema_(state["exp_avg_sq"], g, beta2, square=True)
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
    level = group["level"]
    if (
        level is not None
        and level != "mini"
        and (not isinstance(level, int) or isinstance(level, bool) or level < 0)
    ):
        raise ValueError(f"level must be an int >= 0, 'mini' or None, got {level!r}")
    if not group["lr"] >= 0:
        raise ValueError(f"lr must be >= 0, got {group['lr']!r}")
    if not group["eps"] >= 0:
        raise ValueError(f"eps must be >= 0, got {group['eps']!r}")
    if not group["weight_decay"] >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {group['weight_decay']!r}")
    betas = group["betas"]
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    if not float(group["residual"]) >= 0:
        raise ValueError(f"residual must be a bool or a scale >= 0, got {group['residual']!r}")
    if group["second_moment"] not in SECOND_MOMENTS:
        raise ValueError(
            f"second_moment must be one of {SECOND_MOMENTS}, got {group['second_moment']!r}"
        )
    if group["fold_axis"] not in FOLD_AXES:
        raise ValueError(f"fold_axis must be one of {FOLD_AXES}, got {group['fold_axis']!r}")
    resolve_dtype(group["state_dtype"], torch.float32)
    if group["implementation"] not in fused_foam.IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {fused_foam.IMPLEMENTATIONS}, "
            f"got {group['implementation']!r}"
        )
