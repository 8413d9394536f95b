"""Optimizers on DTensor parameters (FSDP2's ``fully_shard``): which methods work, and how FOAM
folds a rank's shard.

FSDP2 shards each parameter along one dim on a 1-d device mesh (``Shard(0)`` by default, another
dim through ``fully_shard(shard_placement_fn=...)``). Dim 0 may split unevenly (``torch.chunk``
sizes: ``ceil(n / ranks)`` per rank, the last ranks fewer or none); a dim > 0 only evenly (torch
2.13's ``FSDPParam`` refuses uneven sharding there), so ``shard_dim`` falls back to dim 0 when
the ranks do not divide it. FOAM's fold runs along one axis of the 2-d view, so each rank folds
its own shard exactly when no block crosses a shard boundary:

* a fold along the dim that is not sharded is always local; the trainer shards every matrix so
  where FSDP2 can (``shard_dim``), which makes any level and FOAM-Mini local;
* a fold along the sharded dim (a matrix whose preferred dim > 0 the ranks do not divide, so it
  is sharded by dim 0) is local when ``2**level`` divides the entries per rank (every shard
  boundary is then a block boundary), checked when the optimizer is built, naming the parameter
  that breaks it;
* FOAM-Mini along the sharded dim (one block over the whole axis) is computed exactly across
  ranks: the block mean is the all-reduced sum of the local entries (one all-reduce of the
  folded state's size per moment and step), and its state is replicated.

A folded state is a DTensor with the parameter's mesh and placement (replicated for the last
case), so a DCP checkpoint records its global shape and reshards it to another world size.

Every method of this library declares ``shards=True`` where it registers
(``foam.registry.register``), and ``SHARDED_METHODS`` is derived from those declarations; a
method refuses in one line, when it is built, the layouts it cannot step exactly (8-bit blocks
that would straddle shards, ``foam/shard_quantized.py``). A method registered without the
declaration (a user's own) is refused by ``check_supported`` before any compute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.folding import PAPER_FOLD_AXIS, FoldPlan, fold, fold_axis_index


class ShardingNotSupported(ValueError):
    """An optimizer was given sharded (DTensor) parameters it cannot update exactly."""


def is_sharded(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` (a view: writing into it writes into the DTensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


_DECLARED_SHARDED: set[str] = set()
"""Methods registered with ``shards=True`` (``foam.registry.register`` calls ``declare_sharded``)."""


def declare_sharded(method: str) -> None:
    """Record that ``method`` trains DTensor parameters exactly (called where it registers)."""
    _DECLARED_SHARDED.add(method)


def __getattr__(name: str) -> tuple[str, ...]:
    """``SHARDED_METHODS``: the registered methods that train DTensor (FSDP2) parameters, sorted;
    read when asked, since the methods declare it as they register, after this module loads."""
    if name == "SHARDED_METHODS":
        return tuple(sorted(_DECLARED_SHARDED))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_supported(method: str, params: Iterable[torch.Tensor]) -> None:
    """Refuse, before any compute, a method that cannot update DTensor parameters."""
    if method in _DECLARED_SHARDED or not any(is_sharded(p) for p in params):
        return
    raise ShardingNotSupported(
        f"optimizer {method!r} does not support FSDP2 (trainer.parallelism=fsdp): it was not "
        "registered with shards=True (its step has not been proven on shards); use "
        "trainer.parallelism=ddp with it, or one of "
        f"{', '.join(sorted(_DECLARED_SHARDED))} under fsdp"
    )


LayoutCheck = Callable[[tuple[int, int], int, int], bool]
"""Whether a method steps a matrix of ``shape`` sharded by ``dim`` over ``ranks`` exactly (its own
layout rule, e.g. 8-bit blocks that must not straddle shards), called as ``(shape, dim, ranks)``."""


def shard_dim(
    shape: torch.Size | tuple[int, ...],
    fold_axis: str = PAPER_FOLD_AXIS,
    ranks: int = 1,
    accepts: LayoutCheck | None = None,
) -> int:
    """The dim to shard a matrix by over ``ranks`` so that FOAM folds every shard locally, at any
    level: the one its fold does not run along (``fold_axis`` as FOAM's), unless that is a dim
    > 0 that ``ranks`` does not divide, which FSDP2 cannot shard: then 0, and the fold runs along
    the sharded dim (``shard_fold`` says whether its blocks align with the shards). A method with
    a layout rule (``accepts``) that refuses that dim gets the other one where FSDP2 can shard it
    and the rule accepts it; where neither is accepted, FOAM's, which the method's build refuses
    in one line naming the parameter. 0 for tensors that are not 2-d."""
    if len(shape) != 2:
        return 0
    preferred = 1 - fold_axis_index(shape, fold_axis)
    dim = preferred if fsdp_can_shard(shape, preferred, ranks) else 0
    if accepts is None or ranks == 1 or accepts(tuple(shape), dim, ranks):
        return dim
    other = 1 - dim
    if fsdp_can_shard(shape, other, ranks) and accepts(tuple(shape), other, ranks):
        return other
    return dim


def fsdp_can_shard(shape: torch.Size | tuple[int, ...], dim: int, ranks: int) -> bool:
    """Whether FSDP2 shards dim ``dim`` over ``ranks``: dim 0 unevenly too, any other evenly."""
    return dim == 0 or shape[dim] % ranks == 0


def _shards(p: DTensor) -> tuple[int, int, int] | None:
    """``(sharded dim, entries per rank along it, ranks)``; ``None`` when every rank holds all of
    ``p``. Layouts other than one ``Shard``/``Replicate`` on a 1-d mesh are refused."""
    if p.device_mesh.ndim != 1:
        raise ShardingNotSupported(f"a {p.device_mesh.ndim}-d device mesh is not supported")
    placement = p.placements[0]
    if isinstance(placement, Replicate):
        return None
    if isinstance(placement, Shard) and (placement.dim == 0 or p.dim() == 2):
        ranks = p.device_mesh.size()
        return placement.dim, math.ceil(p.shape[placement.dim] / ranks), ranks
    raise ShardingNotSupported(
        f"placement {placement} of a {p.dim()}-d parameter is not supported (FOAM folds the 2-d "
        "view (dim 0, the other dims)): shard it by dim 0"
    )


@dataclass(frozen=True)
class ShardFold:
    """How this rank folds its shard of a parameter whose whole-matrix fold is ``plan``."""

    plan: FoldPlan
    """The whole matrix's fold (global shapes)."""
    local: FoldPlan
    """The fold of this rank's shard."""
    across_ranks: bool = False
    """One block over the whole sharded axis: block means are all-reduced, the state replicated."""
    placement: Shard | Replicate = field(default_factory=Replicate)
    """The folded states' placement (the parameter's, unless ``across_ranks``)."""

    @property
    def averages(self) -> bool:
        """Whether the fold averages anything (level 0 on one rank is the identity)."""
        return self.local.block > 1 or self.across_ranks

    @property
    def state_shape(self) -> tuple[int, int]:
        """One moment's shape on this rank: all of the folded matrix when the block spans the
        ranks (it is replicated), even on a rank whose shard is empty."""
        return self.plan.folded_shape if self.across_ranks else self.local.folded_shape

    def local_state_numel(self) -> int:
        """Elements of one moment on this rank."""
        return math.prod(self.state_shape)


def spans_ranks(plan: FoldPlan, dim: int, ranks: int) -> bool:
    """Whether one fold block spans the whole axis sharded by ``dim`` over several ``ranks``
    (FOAM-Mini along it): its mean is all-reduced and the folded state replicated."""
    return plan.axis == dim and ranks > 1 and plan.block == plan.length


def straddled(plan: FoldPlan, dim: int, ranks: int) -> int | None:
    """FOAM's alignment rule for a fold ``plan`` of a matrix sharded by ``dim`` over ``ranks``:
    the entries each rank holds along the fold axis when ``2**level`` does not divide them, so a
    block would straddle two ranks; ``None`` when every block lies on one rank (or spans all)."""
    if plan.axis != dim or ranks == 1 or spans_ranks(plan, dim, ranks):
        return None
    per_rank = math.ceil(plan.length / ranks)
    return per_rank if per_rank % plan.block else None


def shard_fold(p: torch.Tensor, plan: FoldPlan, where: str = "a parameter") -> ShardFold:
    """The fold of ``p``'s local shard for the whole-matrix fold ``plan``, or an error saying which
    parameter (``where``) breaks the block alignment and what to change."""
    if not is_sharded(p):
        return ShardFold(plan, plan)
    shards = _shards(p)
    if shards is None:
        return ShardFold(plan, plan)
    dim, per_rank, ranks = shards
    rows, cols = plan.rows, plan.cols
    if dim == 0:
        rows = p.to_local().shape[0]
    else:
        cols = p.to_local().shape[1]
    local_plan = dataclasses.replace(plan, rows=rows, cols=cols)
    if spans_ranks(plan, dim, ranks):
        mini = dataclasses.replace(local_plan, block=max(local_plan.length, 1))
        return ShardFold(plan, mini, across_ranks=True)
    if straddled(plan, dim, ranks) is not None:
        other = 1 - dim
        if fsdp_can_shard(p.shape, other, ranks):
            instead = f"shard it by dim {other} (foam.sharding.shard_dim)"
        else:  # the trainer's case: FSDP2 shards a dim > 0 only evenly
            instead = (
                f"a number of ranks that divides its dim {other} ({p.shape[other]}: FSDP2 "
                "shards a dim > 0 only evenly, so it is sharded by dim 0)"
            )
        raise ShardingNotSupported(
            f"FOAM under FSDP2: {where} of shape {tuple(p.shape)} folds blocks of {plan.block} "
            f"along its sharded dim {dim}, but each of {ranks} ranks holds {per_rank} of them, "
            f"so a block would straddle two ranks; use a level whose 2**level divides "
            f"{per_rank}, {instead}, or trainer.parallelism=ddp"
        )
    return ShardFold(plan, local_plan, placement=Shard(dim))


def fold_shard(x: torch.Tensor, fold_of: ShardFold, p: torch.Tensor) -> torch.Tensor:
    """A(x) of this rank's 2-d shard ``x``; the block means over all ranks when the block spans
    them (``across_ranks``)."""
    # A rank that torch's chunks left none of the axis adds nothing to the block mean, but joins
    # its all-reduce.
    y = fold(x, fold_of.local) if fold_of.local.length else x.new_zeros(fold_of.state_shape)
    if fold_of.across_ranks:
        y.mul_(fold_of.local.length / fold_of.plan.length)  # local mean -> share of the global mean
        dist.all_reduce(y, group=p.device_mesh.get_group())
    return y


def zeros_state(p: torch.Tensor, fold_of: ShardFold | None, dtype: torch.dtype) -> torch.Tensor:
    """A zero moment for ``p``: full-size when ``fold_of`` is None, else folded; a DTensor with
    ``p``'s mesh (and its placement, or replicated when the block spans the ranks) when ``p`` is."""
    if fold_of is None:
        return torch.zeros_like(p, dtype=dtype)
    local_state = torch.zeros(fold_of.state_shape, dtype=dtype, device=local(p).device)
    if not is_sharded(p):
        return local_state
    shape = torch.Size(fold_of.plan.folded_shape)
    return DTensor.from_local(
        local_state,
        p.device_mesh,
        (fold_of.placement,),
        run_check=False,
        shape=shape,
        stride=(shape[1], 1),
    )
