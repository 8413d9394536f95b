"""Pieces shared by the compressed-state baselines (GaLore, APOLLO, GWT, LDAdamW).

GaLore, APOLLO and GWT are the same HF-style AdamW skeleton around a method-specific change of
coordinates: compress the gradient, keep Adam's moments in the compressed space, normalise there,
expand the normalised direction back to the parameter's shape. ``CompressedAdamW`` is that
skeleton once; each method supplies the compression, the expansion and the extra state they need.
``ProjectedAdamW`` adds what the projection methods (GaLore, APOLLO, LDAdamW) share: a stored
basis per matrix, its plan, and the rules of ``rank``, ``update_proj_gap`` and ``proj_type``.

Under FSDP2 (a matrix a DTensor sharded by dim ``d``) a projection method whose basis comes from
the whole gradient (``refreshes_on_owners``: GaLore's SVD) steps each rank's shard exactly:

* the refresh runs on the matrix's owner (``foam.shard_owners``: the gradients of every matrix due
  for a refresh go to their owners in one ``all_to_all``, the bases come back in one more;
  LDAdamW, whose basis moves every step, overrides how, ``foam.baselines.ldadam``);
* where the basis lies on the unsharded side (it spans the dim the shard keeps whole), the
  basis is replicated and the projection, the moments (``Shard(d)``) and the update are the
  shard's own rows or columns: no communication;
* where it lies along the sharded dim, the basis is sharded with the weight, each rank projects
  its part, and the parts are summed in the step's one all-reduce (``foam.shard_sums``); the
  low-rank moments are then replicated (every rank needs all of them to expand its part).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from foam.errors import OptionError, require_choice
from foam.hparams import validate_adam_hparams
from foam.numerics import compute_dtype, ema_, resolve_dtype
from foam.param_groups import ParamSplit
from foam.shard_owners import Layout, Owners, layout_of, zeros_like_layout
from foam.shard_sums import PartialSums
from foam.sharding import local
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

    def planned_state_numel(self, per_rank: bool = True) -> int:
        """Elements of state once every parameter has stepped: moments, projectors, norms; on
        this rank (``per_rank``) or for the whole model (they differ under FSDP2).

        Read off the same shapes that allocate the states, so it holds on meta-device models.
        """
        return sum(
            self.planned_param_numel(p, group, per_rank)
            for group in self.param_groups
            for p in group["params"]
        )

    def planned_param_numel(self, p: torch.Tensor, group: dict[str, Any], per_rank: bool) -> int:
        """``planned_state_numel``'s share of ``p``: an uncompressed state has ``p``'s layout
        (this rank's shard of it per rank); a compressed one is held whole on every rank."""
        shape = self.compressed_shape(p, group)
        if shape is None:
            return 2 * (local(p) if per_rank else p).numel()
        extra = sum(math.prod(s) for s in self.extra_state_shapes(p, group).values())
        return 2 * math.prod(shape) + extra

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Every parameter's step; a sharded one may finish only after the one sum across ranks
        of its projection (``_update`` then returns the rest of its step)."""
        loss = run_closure(closure)
        todo, index = [], 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                todo.append((p, group, index))
        self.before_updates(todo)
        sums = PartialSums(shard_group(p for p, _, _ in todo))
        rests = [self._update(p, group, index, sums) for p, group, index in todo]
        sums.reduce()
        for rest in rests:
            if rest is not None:
                rest()
        return loss

    def before_updates(self, todo: list[tuple[torch.Tensor, dict[str, Any], int]]) -> None:
        """Work on whole matrices that a step's parameters share (bases refreshed on owners)."""

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        state = self.state[p]
        shape = self.compressed_shape(p, group)
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        state["step"] = new_step_counter()
        for key in ("exp_avg", "exp_avg_sq"):  # an uncompressed DTensor's: DTensors like it
            state[key] = (
                torch.zeros_like(p, dtype=dtype)
                if shape is None
                else torch.zeros(shape, dtype=dtype, device=p.device)
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

    def _update(
        self, p: torch.Tensor, group: dict[str, Any], index: int, sums: PartialSums
    ) -> Callable[[], None] | None:
        """One parameter's step, or (sharded) its first part, returning the rest."""
        state, t = self._next_step(p, group, index)
        if self.compressed_shape(p, group) is None:  # elementwise: a DTensor's shard is local
            g = local(p.grad).to(compute_dtype(p.dtype))
            self._finish(p, group, local_parts(state), t, g, g, None)
            return None
        g = p.grad.to(compute_dtype(p.dtype))
        low, context = self.compress(g, state, group, t)
        self._finish(p, group, state, t, g, low, context)
        return None

    def _finish(
        self,
        p: torch.Tensor,
        group: dict[str, Any],
        state: dict[str, Any],
        t: int,
        g: torch.Tensor,
        low: torch.Tensor,
        context: Any,
    ) -> None:
        """Adam on the compressed gradient ``low`` (``context`` ``None``: uncompressed), the
        step expanded and applied to ``p`` (this rank's part of it: ``state``'s tensors and
        ``g`` are then local too)."""
        beta1, beta2 = group["betas"]
        m = ema_(state["exp_avg"], low, beta1, square=False)
        v = ema_(state["exp_avg_sq"], low, beta2, square=True)
        denom = v.sqrt().add_(group["eps"])
        normalized = m / denom
        if context is not None:
            update = self.expand(
                CompressedStep(g, low, normalized, denom, context, state, group, t)
            )
        else:
            update = normalized

        lr = group["lr"]
        weight = local(p)
        weight.add_(update, alpha=-lr * math.sqrt(1 - beta2**t) / (1 - beta1**t))
        if group["weight_decay"]:
            weight.add_(weight, alpha=-lr * group["weight_decay"])


def local_parts(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each DTensor replaced by this rank's part of it (a view)."""
    return {k: local(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def shard_group(params: Any) -> Any:
    """The process group of the first sharded parameter (all share FSDP2's mesh), or ``None``."""
    for p in params:
        if isinstance(p, DTensor):
            return p.device_mesh.get_group()
    return None


def basis_along_sharded_dim(plan: Projection, layout: Layout) -> bool:
    """Whether the basis spans the sharded dim (so projections are sums over ranks)."""
    return layout.dim == (1 if plan.side == "right" else 0)


def sharded_state_layouts(
    plan: Projection, layout: Layout
) -> tuple[tuple[str, tuple[int, int], int | None], ...]:
    """``(state key, global shape, sharded dim or None: replicated)`` of a sharded matrix's
    moments and basis when its basis is refreshed on owners: the basis sharded with the weight
    where it lies along the sharded dim (the moments then replicated), else the other way."""
    along = basis_along_sharded_dim(plan, layout)
    return (
        ("exp_avg", plan.low_shape, None if along else layout.dim),
        ("exp_avg_sq", plan.low_shape, None if along else layout.dim),
        ("basis", plan.basis_shape, layout.dim if along else None),
    )


class ProjectedAdamW(CompressedAdamW):
    """A ``CompressedAdamW`` whose 2-d parameters are projected on a stored ``basis``.

    Groups take ``rank`` (``None``: uncompressed AdamW) and ``proj_type``; the basis is
    ``plan.basis_shape`` and the moments ``plan.low_shape``.
    """

    refreshes_on_owners = False
    """Whether ``new_basis`` needs the whole gradient, so a sharded matrix's refresh runs on its
    owner (GaLore's SVD); methods whose basis needs none of it (APOLLO's seeded random one)
    leave it off."""

    def validate_group(self, group: dict[str, Any]) -> None:
        validate_projection_group(group)

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        """As the base's; a sharded matrix's moments and basis are DTensors on its mesh, each
        sharded along the weight's sharded dim or replicated (see the module's docstring)."""
        super()._init_state(p, group, index)
        plan = self.plan_for(p, group)
        layout = None if plan is None else layout_of(p)
        if plan is None or layout is None or not self.refreshes_on_owners:
            return
        state = self.state[p]
        for key, shape, dim in self.state_layouts(plan, layout):
            state[key] = zeros_like_layout(p, shape, dim, state[key].dtype)

    def state_layouts(
        self, plan: Projection, layout: Layout
    ) -> tuple[tuple[str, tuple[int, int], int | None], ...]:
        """Where a sharded matrix's moments and basis lie (``sharded_state_layouts``' form)."""
        return sharded_state_layouts(plan, layout)

    def planned_param_numel(self, p: torch.Tensor, group: dict[str, Any], per_rank: bool) -> int:
        """As the base's, but a matrix refreshed on owners holds its states in the layouts of
        ``state_layouts``: this rank's pieces of them per rank."""
        plan = self.plan_for(p, group)
        layout = None if plan is None else layout_of(p)
        if not per_rank or plan is None or layout is None or not self.refreshes_on_owners:
            return super().planned_param_numel(p, group, per_rank)
        rank = p.device_mesh.get_local_rank()
        return sum(
            Layout((shape[0], shape[1]), dim, layout.ranks).piece_numel(rank)
            for _, shape, dim in self.state_layouts(plan, layout)
        )

    def sharded_todo(
        self, todo: list[tuple[torch.Tensor, dict[str, Any], int]]
    ) -> Iterator[tuple[torch.Tensor, dict[str, Any], Projection, Layout, int]]:
        """This step's sharded matrices that take a projection (their state made where it is
        missing), each with its group, plan, layout and the step it is about to take."""
        for p, group, index in todo:
            plan = self.plan_for(p, group)
            layout = None if plan is None else layout_of(p)
            if plan is None or layout is None:
                continue
            if not self.state[p]:
                self._init_state(p, group, index)
            yield p, group, plan, layout, int(self.state[p]["step"].item()) + 1

    def before_updates(self, todo: list[tuple[torch.Tensor, dict[str, Any], int]]) -> None:
        """The bases of the sharded matrices due for a refresh, computed on their owners."""
        if not self.refreshes_on_owners:
            return
        due = [
            (p, plan, layout, self.state[p])
            for p, group, plan, layout, t in self.sharded_todo(todo)
            if refresh_due(self.state[p], group, t)
        ]
        if not due:
            return
        grads = [local(p.grad) for p, _, _, _ in due]
        basis_dtype = due[0][3]["basis"].dtype
        if any(g.dtype != grads[0].dtype for g in grads) or any(
            s["basis"].dtype != basis_dtype for _, _, _, s in due
        ):
            raise ValueError(f"{type(self).__name__}: sharded matrices of mixed dtypes")
        owners = Owners([layout for _, _, layout, _ in due], due[0][0].device_mesh.get_group())
        wholes = owners.gather(grads, grads[0].dtype)
        bases = {
            j: self.new_basis(whole.to(compute_dtype(whole.dtype)), due[j][1], due[j][3]).to(
                basis_dtype
            )
            for j, whole in wholes.items()
        }
        layouts = [
            Layout(
                plan.basis_shape,
                layout.dim if basis_along_sharded_dim(plan, layout) else None,
                layout.ranks,
            )
            for _, plan, layout, _ in due
        ]
        pieces = owners.scatter(bases, layouts, basis_dtype, grads[0].device)
        for (_, _, _, state), piece in zip(due, pieces, strict=True):
            local(state["basis"]).copy_(piece)

    def _update(
        self, p: torch.Tensor, group: dict[str, Any], index: int, sums: PartialSums
    ) -> Callable[[], None] | None:
        """A sharded matrix's projection (summed across ranks where the basis lies along the
        sharded dim), returning the rest of its step; otherwise the base's step."""
        plan = self.plan_for(p, group)
        layout = None if plan is None else layout_of(p)
        if plan is None or layout is None or not self.refreshes_on_owners:
            return super()._update(p, group, index, sums)
        state, t = self._next_step(p, group, index)  # the basis is this step's (before_updates)
        g = local(p.grad).to(compute_dtype(p.dtype))
        parts = local_parts(state)
        low = project(g, parts["basis"].to(g.dtype), plan.side)
        if basis_along_sharded_dim(plan, layout):
            sums.add(low)
        return lambda: self._finish(p, group, parts, t, g, low, plan)

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
