"""FOAM: Adam with block-folded moments plus a per-step residual (the paper's Algorithm 1).

This module decides which path steps each parameter and keeps the states; the arithmetic is
foam/update.py's (eager) and foam/fused.py's (kernels), the group's options foam/settings.py's.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from foam import fused as fused_foam
from foam import shard_adamw
from foam.batching import FoldedBatch, Routes, grad_key
from foam.errors import OptionError
from foam.folding import FoldPlan, folded_numel
from foam.hparams import group_defaults, signature_defaults
from foam.settings import DEFAULT_SEMANTICS, SEMANTICS, FoamSettings
from foam.sharding import ShardFold, fold_shard, is_sharded, local, shard_fold, zeros_state
from foam.state import DtypeFaithfulOptimizer, count_step, new_step_counter, run_closure
from foam.update import StepScalars, bias_corrections, eager_step_

__all__ = ["FOAM", "SEMANTICS", "fused_adamw_applies", "steps_run"]

FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # where torch ships a fused AdamW kernel
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_adamw_applies(p: torch.Tensor) -> bool:
    """Whether torch's fused AdamW kernel can update ``p`` (its device and dtype have one)."""
    return p.device.type in FUSED_DEVICES and p.dtype in FUSED_DTYPES


@dataclass
class _Resolved:
    """A group as it was resolved when added, and the steps its folded matrices have taken."""

    group: dict[str, Any]
    settings: FoamSettings
    ran: set[str] = field(default_factory=set)
    routes: Routes | None = None


class FOAM(DtypeFaithfulOptimizer):
    """Adam whose moments are stored as block means along one axis, plus a residual.

    A parameter with at least two dims in a group whose ``level`` is not ``None`` keeps its first
    and second moments folded to blocks of ``2**level`` entries along ``fold_axis``
    (``level="mini"``: one block spanning the axis, so with the paper's ``fold_axis="larger"`` one
    value per row of the smaller dim). A level whose blocks are longer than every axis of one of
    a group's matrices is refused when the group is added (an ``OptionError`` naming the largest
    level the group's matrices allow); with ``fold_axis="last"`` a block longer than a matrix's
    last axis only is one block over that axis (its mean, said once in the ``foam`` log, or with
    ``tail_block="zero_pad"`` the release's one padded block). Each step re-adds the detail the
    fold loses, the residual ``R = G - E(A(G))``, to both moments (the first as
    ``E(m) + rho R``, the second as ``E(v) + rho^2 R^2``). Everything else, and every group with
    ``level=None``, takes the plain Adam update without ``alpha`` (AdamW's, or in release
    semantics the release's step-size-corrected one); a group's ``bias_correction`` applies to
    those parameters too, so ``False`` (Algorithm 1, uncorrected) leaves them uncorrected unless
    their group says otherwise.

    ``semantics="paper"`` (default) follows FOAM_SPEC; ``semantics="release"`` follows the
    authors' released class (README, "Paper and release semantics"): fold along the last dim,
    mean-of-squares second moment, bias correction as one step-size factor on every parameter
    (the plain-AdamW ones too), zero-padded tail blocks and weight decay after the update. A
    semantics only fills the options :data:`foam.settings.SEMANTICS` lists that are left at
    ``None``; options passed explicitly override it. Betas are not part of it.

    The constructor's signature is the one home of FOAM's defaults (the registry and the
    trainer's configs read them from it); each group is resolved and checked once, when it is
    added (:class:`foam.settings.FoamSettings`), and a bad value raises
    :class:`foam.errors.OptionError` naming its key.

    Parameters are processed one at a time, so the transient memory of a step is a few
    temporaries the size of one parameter, never the whole model's.

    ``implementation`` picks how folded matrices step: ``"eager"`` is the readable reference
    (foam/update.py); ``"fused"`` runs the one-pass kernels of foam/fused.py (C++ on the CPU,
    Triton on CUDA) and raises at construction if the device's kernel cannot build, run and agree
    with the eager step; ``"auto"`` (default) uses them where they apply and warns at construction
    when they cannot run, those matrices then stepping eagerly. A sharded (FSDP2) parameter's
    local shard takes the kernels like any matrix, folded along the axis the shard keeps whole.
    Level 0, float16/float64 parameters and FOAM-Mini along a sharded dim (its block mean is
    all-reduced) always step eagerly, and so does the release's update. :meth:`steps_run` says
    which step each group's folded matrices took. The fused matrices of a group take one kernel
    call per device and dtypes, with what that needs decided at the group's first step
    (foam/batching.py).
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
        semantics: str = DEFAULT_SEMANTICS,
        tail_block: str | None = None,
        decay: str | None = None,
        implementation: str = "auto",
    ) -> None:
        self._resolved: dict[int, _Resolved] = {}
        super().__init__(params, group_defaults(locals()))

    # -- configuration -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Resolve and check every group when it is added, so a bad option fails before any
        compute, and say now which of its matrices cannot take their device's fused kernel."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        settings = self._resolve(group)
        for p in group["params"]:
            self.shard_fold_for(p, group)  # checks shard alignment now, not at the first step
        if settings.implementation != "eager" and settings.kernels_compute:
            covered = {p.device.type for p in group["params"] if self._kernel_covers(p, group)}
            for device_type in sorted(covered):
                self._kernel_runs(device_type, group)

    def _resolve(self, group: dict[str, Any]) -> FoamSettings:
        settings = FoamSettings.of_group(group)
        self._resolved[id(group)] = _Resolved(group, settings)
        return settings

    def _entry(self, group: dict[str, Any]) -> _Resolved:
        entry = self._resolved.get(id(group))
        if entry is None or entry.group is not group:  # a group put in place by hand
            self._resolve(group)
            entry = self._resolved[id(group)]
        return entry

    def settings_of(self, group: dict[str, Any]) -> FoamSettings:
        """``group``'s options as resolved and checked when it was added."""
        return self._entry(group).settings

    def plan_for(self, p: torch.Tensor, group: dict[str, Any]) -> FoldPlan | None:
        """How ``p`` is folded in ``group`` (``None``: its moments are stored in full)."""
        return self.settings_of(group).fold.plan(p)

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

    def steps_run(self) -> dict[str, str]:
        """Which step each group's folded matrices took so far, by group name (its index when it
        has none): ``"cpp"``, ``"triton"`` or ``"eager"`` (joined by ``+`` when they took more
        than one); groups that folded nothing are left out."""
        ran = {}
        for index, group in enumerate(self.param_groups):
            entry = self._entry(group)
            if entry.ran:
                ran[str(group.get("name", index))] = "+".join(sorted(entry.ran))
        return ran

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's hook for loaded groups: options added since they were saved take this
        optimizer's defaults (so groups saved before ``semantics`` existed are paper's)."""
        super().__setstate__(state)
        self._resolved = {}
        for group in self.param_groups:
            for key in signature_defaults(FOAM):  # options added since it was saved
                if key not in ("semantics", "tail_block", "decay"):  # absent: it was paper's
                    group.setdefault(key, self.defaults[key])
            self._resolve(group)

    # -- the step --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = run_closure(closure)
        for group in self.param_groups:
            routes = self._routes(group)
            if routes.adamw:
                self._fused_adamw(routes.adamw, group)
            if routes.folded is not None:
                routes.folded.step(group, StepScalars.of_group(group))
                self._entry(group).ran.update(routes.folded.kernels)
            for p in routes.eager:
                self._update(p, group)
        return loss

    def _routes(self, group: dict[str, Any]) -> Routes:
        """``group``'s routes (foam/batching.py), made again when what they depend on changed."""
        entry = self._entry(group)
        key = grad_key(group["params"])
        if entry.routes is None or entry.routes.key != key:
            entry.routes = None  # the old ones hold kernel tables: free them first
            entry.routes = self._route(group, key)
        return entry.routes

    def _route(self, group: dict[str, Any], key: tuple) -> Routes:
        """Which path each parameter with a gradient takes; the folded matrices' states are made
        here, before their first step."""
        routes, folded = Routes(key), []
        for p, seen in zip(group["params"], key, strict=True):
            if seen is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("FOAM does not support sparse gradients")
            if self._uses_fused_adamw(p, group):
                routes.adamw.append(p)
            elif self._uses_fused_step(p, group):
                fold_of = self.shard_fold_for(p, group)
                if not self.state[p]:
                    self._init_state(p, group, fold_of)
                folded.append((p, self.state[p], fold_of.local))
            else:
                routes.eager.append(p)
        routes.folded = FoldedBatch(folded) if folded else None
        return routes

    def _kernel_covers(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` (its local shard, folded along the axis the shard keeps whole) is a
        matrix the fused kernels take (foam/fused.py ``covers``); a block that spans the ranks
        (FOAM-Mini along the sharded dim) needs an all-reduce, so the eager step."""
        fold_of = self.shard_fold_for(p, group)
        plan = None if fold_of is None or fold_of.across_ranks else fold_of.local
        return fused_foam.covers(local(p), plan, self.settings_of(group).state_dtype_for(p))

    def _kernel_runs(self, device_type: str, group: dict[str, Any]) -> bool:
        """Whether the fused kernel of ``device_type`` runs here; when it does not, an error
        with ``implementation="fused"`` and a warning (once) with ``"auto"``."""
        if fused_foam.kernel_available(device_type):
            return True
        problem = (
            f"the fused FOAM step ({fused_foam.KERNELS[device_type]}) cannot run on "
            f"{device_type} (the foam.fused log says why)"
        )
        if self.settings_of(group).implementation == "fused":
            raise OptionError(
                "implementation",
                f"implementation='fused' but {problem}; use implementation='auto' or 'eager'",
            )
        warnings.warn(
            f"FOAM: {problem}, so group {group.get('name', '')!r} steps its folded matrices "
            "eagerly, which is slower (implementation='eager' chooses that without this warning)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    def _uses_fused_step(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` takes the fused FOAM step of foam/fused.py (see ``implementation``)."""
        settings = self.settings_of(group)
        return (
            settings.implementation != "eager"
            and settings.kernels_compute
            and self._kernel_covers(p, group)
            and fused_foam.grad_fits(local(p.grad))
            and self._kernel_runs(p.device.type, group)
        )

    @staticmethod
    def _advance_step(state: dict[str, Any], group: dict[str, Any]) -> tuple[float, float, float]:
        """Count one more step; return ``bias_corrections`` at it: ``(bc1, bc2, step_scale)``."""
        return bias_corrections(group["bias_correction"], group["betas"], count_step(state))

    def _uses_fused_adamw(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p`` takes plain AdamW through torch's fused multi-tensor kernel.

        The kernel does AdamW's arithmetic in float32 whatever the tensors' dtype and needs no
        temporaries, which is what this optimizer promises for the unfolded parameters (for bf16
        embeddings it is several times faster than upcasting copies). It applies to same-dtype
        parameter, gradient and states with bias correction of the moments and decay before the
        update (AdamW's own order) on a device that has the kernel;
        ``fused_adamw=False`` keeps the per-tensor path (bitwise equal to ``AdamW(foreach=False)``).
        """
        settings = self.settings_of(group)
        return (
            settings.fused_adamw
            and self.plan_for(p, group) is None
            and settings.bias_correction is True
            and settings.decay == "before_update"
            and fused_adamw_applies(p)
            and p.grad.dtype == p.dtype
            and settings.state_dtype_for(p) == p.dtype
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
        shard_adamw.fused_adamw(
            params,
            states,  # the kernel increments their steps
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
        )

    def _init_state(
        self, p: torch.Tensor, group: dict[str, Any], fold_of: ShardFold | None
    ) -> None:
        state = self.state[p]
        dtype = self.settings_of(group).state_dtype_for(p)
        fused = self._uses_fused_adamw(p, group)
        state["step"] = new_step_counter(p.device if fused else "cpu")
        state["exp_avg"] = zeros_state(p, fold_of, dtype)
        state["exp_avg_sq"] = zeros_state(p, fold_of, dtype)

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """One eager step of ``param`` (foam/update.py); on a DTensor, on this rank's shard."""
        fold_of = self.shard_fold_for(param, group)
        state = self.state[param]
        if not state:
            self._init_state(param, group, fold_of)
        bc1, bc2, step_scale = self._advance_step(state, group)
        plan, fold = None, None
        if fold_of is not None:
            plan = fold_of.local
            self._entry(group).ran.add("eager")
            if fold_of.averages:
                fold = functools.partial(fold_shard, fold_of=fold_of, p=param)
        eager_step_(
            local(param),
            local(param.grad),
            local(state["exp_avg"]),
            local(state["exp_avg_sq"]),
            plan,
            fold,
            (bc1, bc2),
            StepScalars.of_group(group, step_scale, alpha=None if plan is not None else 1.0),
        )


def steps_run(optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """Which step each FOAM group of ``optimizer`` ran (:meth:`FOAM.steps_run`), the parts of a
    ``Composite`` included; empty for the other methods."""
    ran: dict[str, str] = {}
    for part in getattr(optimizer, "parts", [optimizer]):
        if isinstance(part, FOAM):
            ran.update(part.steps_run())
    return ran
