"""FOAM: Adam with block-folded moments plus a per-step residual (the paper's Algorithm 1)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.adamw import adamw as functional_adamw

from foam import fused as fused_foam
from foam.folding import (
    TAIL_BLOCKS,
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
from foam.hparams import group_defaults, signature_defaults, validate_adam_hparams
from foam.numerics import compute_dtype, ema_, resolve_dtype
from foam.sharding import ShardFold, fold_shard, is_sharded, local, shard_fold, zeros_state
from foam.state import DtypeFaithfulOptimizer

SECOND_MOMENTS = ("square_of_mean", "mean_of_squares")
# True: the folded EMAs are corrected before unfolding (FOAM_SPEC section 2); False: none
# (Algorithm 1 as printed); "step_size": one factor sqrt(1 - b2^t) / (1 - b1^t) on the step size
# of every parameter, residual included (the authors' release).
BIAS_CORRECTIONS = (True, False, "step_size")
DECAYS = ("before_update", "after_update")  # when W <- W * (1 - lr * wd) is applied
# The options a ``semantics`` sets, for each semantics. An option passed explicitly (not None)
# overrides its semantics' value, which is how ablations mix the two. Betas are not included:
# the paper uses (0.9, 0.95) and the release class defaults to (0.9, 0.999).
SEMANTICS: dict[str, dict[str, Any]] = {
    "paper": {
        "fold_axis": "larger",
        "second_moment": "square_of_mean",
        "bias_correction": True,
        "tail_block": "mean",
        "decay": "before_update",
    },
    "release": {
        "fold_axis": "last",
        "second_moment": "mean_of_squares",
        "bias_correction": "step_size",
        "tail_block": "zero_pad",
        "decay": "after_update",
    },
}
FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # where torch ships a fused AdamW kernel
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_adamw_applies(p: torch.Tensor) -> bool:
    """Whether torch's fused AdamW kernel can update ``p`` (its device and dtype have one)."""
    return p.device.type in FUSED_DEVICES and p.dtype in FUSED_DTYPES


class FOAM(DtypeFaithfulOptimizer):
    """Adam whose moments are stored as block means along one axis, plus a residual.

    A parameter with at least two dims in a group whose ``level`` is not ``None`` keeps its first
    and second moments folded to blocks of ``2**level`` entries along ``fold_axis``
    (``level="mini"``: one block spanning the axis, so with the paper's ``fold_axis="larger"`` one
    value per row of the smaller dim). A level whose blocks are longer than a small matrix's fold
    axis folds that matrix as one block over the axis (its FOAM-Mini) and says so once in the
    ``foam`` log, except with ``tail_block="zero_pad"``, which keeps the release's one padded
    block. Each step re-adds the detail the fold loses, the residual ``R = G - E(A(G))``, to both
    moments (the first as ``E(m) + rho R``, the second as ``E(v) + rho^2 R^2``). Everything else,
    and every group with ``level=None``, takes the plain Adam update without ``alpha`` (AdamW's,
    or in release semantics the release's step-size-corrected one); a group's ``bias_correction``
    applies to those parameters too, so ``False`` (Algorithm 1, uncorrected) leaves them
    uncorrected unless their group says otherwise.

    ``semantics="paper"`` (default) follows FOAM_SPEC; ``semantics="release"`` follows the
    authors' released class (README, "Paper and release semantics"): fold along the last dim,
    mean-of-squares second moment, bias correction as one step-size factor on every parameter
    (the plain-AdamW ones too), zero-padded tail blocks and weight decay after the update. A
    semantics only fills the options :data:`SEMANTICS` lists that are left at ``None``; options
    passed explicitly override it. Betas are not part of it.

    The constructor's signature is the one home of FOAM's defaults (the registry and the
    trainer's configs read them from it); the hyperparameter rules are
    :func:`foam.hparams.validate_adam_hparams`, :func:`foam.folding.validate_fold_settings` and
    this module's ``_validate_group``.

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
        second_moment: str | None = None,
        bias_correction: bool | str | None = None,
        fold_axis: str | None = None,
        state_dtype: torch.dtype | str | None = None,
        fused_adamw: bool = True,
        semantics: str = "paper",
        tail_block: str | None = None,
        decay: str | None = None,
        implementation: str = "auto",
    ) -> None:
        super().__init__(params, group_defaults(locals()))

    # -- configuration -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate every group when it is added, so a bad level fails before any compute."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _apply_semantics(group)
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
        if not is_sharded(p):
            return ShardFold(plan, plan)
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

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's hook for loaded groups: options added since they were saved take this
        optimizer's defaults (so groups saved before ``semantics`` existed are paper's)."""
        super().__setstate__(state)
        for group in self.param_groups:
            for key in signature_defaults(FOAM):  # options added since it was saved
                if key not in ("semantics", "tail_block", "decay"):  # absent: it was paper's
                    group.setdefault(key, self.defaults[key])
            _apply_semantics(group)

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
        if group["implementation"] == "eager" or not _paper_update(group):
            return False  # the kernels implement the paper's update; the release's runs eagerly
        if is_sharded(p):
            return False  # the kernels take whole matrices; a DTensor shard steps eagerly
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
        plans, states, corrections = [], [], []
        for p in params:
            plan = self.plan_for(p, group)
            state = self.state[p]
            if not state:
                self._init_state(p, group, self.shard_fold_for(p, group))
            plans.append(plan)
            states.append(state)
            bc1, bc2, _ = self._advance_step(state, group)  # step_scale is 1: see _uses_fused_step
            corrections.append((bc1, bc2))
        for device in {p.device for p in params}:
            on = [i for i, p in enumerate(params) if p.device == device]
            fused_foam.fused_step(
                [params[i] for i in on],
                [states[i]["exp_avg"] for i in on],
                [states[i]["exp_avg_sq"] for i in on],
                [plans[i] for i in on],
                [corrections[i] for i in on],
                fused_foam.StepScalars.of_group(group),
            )

    @staticmethod
    def _advance_step(state: dict[str, Any], group: dict[str, Any]) -> tuple[float, float, float]:
        """Count one more step; return ``bias_corrections`` at it: ``(bc1, bc2, step_scale)``."""
        state["step"] += 1
        return bias_corrections(group["bias_correction"], group["betas"], int(state["step"].item()))

    def _uses_fused_adamw(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` takes plain AdamW through torch's fused multi-tensor kernel.

        The kernel does AdamW's arithmetic in float32 whatever the tensors' dtype and needs no
        temporaries, which is what this optimizer promises for the unfolded parameters (for bf16
        embeddings it is several times faster than upcasting copies). It applies to same-dtype
        parameter, gradient and states with bias correction of the moments and decay before the
        update (AdamW's own order) on a device that has the kernel;
        ``fused_adamw=False`` keeps the per-tensor path (bitwise equal to ``AdamW(foreach=False)``).
        """
        return (
            group["fused_adamw"]
            and self.plan_for(p, group) is None
            and group["bias_correction"] is True
            and group["decay"] == "before_update"
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
        bc1, bc2, step_scale = self._advance_step(state, group)
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]

        wide = compute_dtype(p.dtype)
        grad = local(param.grad)
        grad = grad if plan is None else grad.reshape(plan.rows, plan.cols)
        g = grad.to(wide)

        decay = 1 - lr * group["weight_decay"]
        if group["weight_decay"] and group["decay"] == "before_update":
            p.mul_(decay)
        if fold_of is not None and fold_of.averages:
            g_folded = fold_shard(g, fold_of, param)
            m = ema_(moments[0], g_folded, beta1, square=False)
            if group["second_moment"] == "mean_of_squares":
                v = ema_(moments[1], fold_shard(g.square(), fold_of, param), beta2, square=False)
            else:
                v = ema_(moments[1], g_folded, beta2, square=True)
            step_size = lr * group["alpha"] * step_scale
            self._residual_step(
                p, g, g is not grad, g_folded, m / bc1, v / bc2, plan, group, step_size
            )
        else:
            # Identity fold (plain AdamW, or level 0): no residual, and torch.optim.AdamW's exact
            # formula, so level 0 with alpha 1 reproduces it to the last bit (with
            # bias_correction="step_size" it becomes the release's Adam step).
            m = ema_(moments[0], g, beta1, square=False)
            v = ema_(moments[1], g, beta2, square=True)
            denom = (v.sqrt() / bc2**0.5).add_(eps)
            step_size = lr * (1.0 if plan is None else group["alpha"]) * step_scale
            p.addcdiv_(m.view(p.shape), denom.view(p.shape), value=-step_size / bc1)
        if group["weight_decay"] and group["decay"] == "after_update":
            p.mul_(decay)

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
        step_size: float,
    ) -> None:
        """``p -= step_size * (E(m_hat) + rho R) / (sqrt(E(v_hat) + rho^2 R^2) + eps)``.

        ``R = g - E(A(g))``. Per-block values are broadcast over block views instead of
        materialising ``E(.)``, and each pass writes where the next one reads, so a step makes
        about as many full-size passes as AdamW's, with two full-size temporaries: the residual
        (which becomes the numerator; it is ``g`` itself when ``g`` is already a private copy)
        and the denominator.
        """
        rho, eps = float(group["residual"]), group["eps"]
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


def _paper_update(group: dict[str, Any]) -> bool:
    """Bias correction of the moments (or none), mean tail blocks and decay before the update."""
    return (
        group["bias_correction"] != "step_size"
        and group["tail_block"] == "mean"
        and group["decay"] == "before_update"
    )


def bias_corrections(
    mode: bool | str, betas: tuple[float, float], t: int
) -> tuple[float, float, float]:
    """``(bc1, bc2, step_scale)`` at step ``t``: the moments are divided by ``bc1``/``bc2`` and
    the step is multiplied by ``step_scale`` (see :data:`BIAS_CORRECTIONS`)."""
    bc1, bc2 = 1 - betas[0] ** t, 1 - betas[1] ** t
    if mode == "step_size":
        return 1.0, 1.0, math.sqrt(bc2) / bc1
    return (bc1, bc2, 1.0) if mode else (1.0, 1.0, 1.0)


def require_paper_semantics(method: str, semantics: str) -> None:
    """Refuse ``semantics="release"`` for a combination the authors' release does not have.

    The release semantics is a statement about the release's FOAM class (an Adam step); its
    bias-correction, second-moment and decay choices have no counterpart in Muon or Adam-mini, so
    FOAM's combinations keep the paper's (their ``fold_axis`` option is still there).
    """
    if semantics != "paper":
        raise ValueError(
            f"{method} supports semantics='paper' only, got {semantics!r}: the authors' release "
            "has no such combination (release semantics is defined for FOAM's Adam step)"
        )


def _apply_semantics(group: dict[str, Any]) -> None:
    """Fill the options a group leaves at ``None`` (or lacks) from its ``semantics``."""
    semantics = group.setdefault("semantics", "paper")
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {tuple(SEMANTICS)}, got {semantics!r}")
    for key, value in SEMANTICS[semantics].items():
        if group.get(key) is None:
            group[key] = value


def _validate_group(group: dict[str, Any]) -> None:
    """Reject settings that would otherwise produce silent garbage mid-training."""
    validate_adam_hparams(group)
    validate_fold_settings(group)
    if group["second_moment"] not in SECOND_MOMENTS:
        raise ValueError(
            f"second_moment must be one of {SECOND_MOMENTS}, got {group['second_moment']!r}"
        )
    if group["bias_correction"] not in BIAS_CORRECTIONS:
        raise ValueError(
            f"bias_correction must be one of {BIAS_CORRECTIONS}, got {group['bias_correction']!r}"
        )
    if group["tail_block"] not in TAIL_BLOCKS:
        raise ValueError(f"tail_block must be one of {TAIL_BLOCKS}, got {group['tail_block']!r}")
    if group["decay"] not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {group['decay']!r}")
    if group["implementation"] not in fused_foam.IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {fused_foam.IMPLEMENTATIONS}, "
            f"got {group['implementation']!r}"
        )
