"""Contiguous blocks of a parameter on its FSDP2 shard: Adam-mini's per-head / per-row blocks and
8-bit quantisation's blocks of 256 are runs of ``size`` entries of the row-major flattened tensor.

A rank holds a row range (``Shard(0)``) or a column range (``Shard(1)`` of a matrix) of the
tensor, ``torch.chunk``'s share. The blocks are **local** when every block lies on one rank and
the ranks' blocks are ``torch.chunk``'s share of the block list too: then a per-block state is a
DTensor sharded like the blocks (``Shard(0)``) and a rank computes its blocks alone, exactly as
one process computes them. Otherwise some block **spans** ranks (a head cut by a row shard, every
row of a column shard, a norm gain's one block): each rank adds its entries' part of every block
to one ``foam.shard_sums.PartialSums`` and the per-block state is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.sharding import ShardingNotSupported, is_sharded, local


def mesh_group(params: Iterable[torch.Tensor]) -> dist.ProcessGroup | None:
    """The process group of the first DTensor among ``params`` (FSDP2 puts them all on one
    mesh), for the step's ``PartialSums``; ``None`` when nothing is sharded."""
    return next((p.device_mesh.get_group() for p in params if is_sharded(p)), None)


def chunk_range(length: int, ranks: int, rank: int) -> tuple[int, int]:
    """``torch.chunk``'s share of ``length`` entries for ``rank`` (FSDP2's: ceil-sized, the last
    ranks fewer or none), as ``[start, stop)``."""
    size = math.ceil(length / ranks) if length else 0
    return min(rank * size, length), min((rank + 1) * size, length)


@dataclass(frozen=True)
class ShardBlocks:
    """How ``count`` row-major blocks of ``size`` entries fall on this rank's shard."""

    count: int
    size: int
    local: bool
    """Every block on one rank, the ranks holding ``torch.chunk``'s share of the blocks."""
    first: int = 0
    """This rank's first block (local blocks)."""
    local_count: int = 0
    """This rank's blocks (local blocks); 0 on a rank whose shard is empty."""
    ids: torch.Tensor | None = None
    """The block of each local entry (blocks that span ranks), in the shard's shape."""


def shard_blocks(p: torch.Tensor, size: int) -> ShardBlocks:
    """The blocks of ``size`` entries of ``p`` (their count must divide ``p.numel()``, which the
    caller's layout guarantees) on this rank's shard of ``p``."""
    count = p.numel() // size
    if not is_sharded(p) or isinstance(p.placements[0], Replicate):
        return ShardBlocks(count, size, local=True, first=0, local_count=count)
    placement, mesh = p.placements[0], p.device_mesh
    if mesh.ndim != 1 or not isinstance(placement, Shard):
        raise ShardingNotSupported(f"placement {p.placements} on a {mesh.ndim}-d mesh")
    dim, ranks, rank = placement.dim, mesh.size(), mesh.get_local_rank()
    rows = p.shape[0]
    cols = p.numel() // rows if rows else 0
    if dim == 0 and blocks_follow_rows(rows, cols, count, size, ranks):
        first, stop = chunk_range(count, ranks, rank)
        return ShardBlocks(count, size, local=True, first=first, local_count=stop - first)
    if dim not in (0, 1) or (dim == 1 and p.dim() != 2):
        raise ShardingNotSupported(
            f"a {p.dim()}-d tensor sharded by dim {dim}: shard it by dim 0 or as a matrix"
        )
    start, _ = chunk_range(p.shape[dim], ranks, rank)
    shard = local(p)
    if dim == 0:
        flat = torch.arange(shard.numel(), device=shard.device) + start * cols
    else:
        row = torch.arange(shard.shape[0], device=shard.device).unsqueeze(1) * cols
        flat = row + start + torch.arange(shard.shape[1], device=shard.device)
    return ShardBlocks(count, size, local=False, ids=(flat // size).view(shard.shape))


def blocks_follow_rows(rows: int, cols: int, count: int, size: int, ranks: int) -> bool:
    """Whether every rank's rows are exactly ``torch.chunk``'s share of the blocks (the last
    block may be short: 8-bit quantisation's of a tensor whose size 256 does not divide)."""
    numel = rows * cols
    return all(
        (start * cols, stop * cols)
        == tuple(min(size * b, numel) for b in chunk_range(count, ranks, rank))
        for rank in range(ranks)
        for start, stop in [chunk_range(rows, ranks, rank)]
    )


def block_sums(x: torch.Tensor, blocks: ShardBlocks) -> torch.Tensor:
    """This rank's part of each block's sum of ``x`` (the local shard, entries in ``blocks.ids``'
    layout): ``(count,)``, zero for blocks it holds none of. Blocks that span ranks only."""
    sums = x.new_zeros(blocks.count)
    return sums.index_add_(0, blocks.ids.reshape(-1), x.reshape(-1))


def per_entry(values: torch.Tensor, blocks: ShardBlocks) -> torch.Tensor:
    """A per-block ``(count, 1)`` tensor spread to the local shard's entries (spanning blocks)."""
    return values.reshape(-1)[blocks.ids]


def block_state(
    p: torch.Tensor, blocks: ShardBlocks, dtype: torch.dtype, width: int = 1
) -> torch.Tensor:
    """A zero ``(count, width)`` per-block state: a DTensor on ``p``'s mesh, sharded like the
    blocks when they are local and replicated when they span ranks, when ``p`` is a DTensor."""
    sharded = is_sharded(p) and blocks.local and isinstance(p.placements[0], Shard)
    return placed_zeros(p, (blocks.count, width), Shard(0) if sharded else Replicate(), dtype)


def placed_zeros(
    p: torch.Tensor, shape: tuple[int, ...], placement: Shard | Replicate, dtype: torch.dtype
) -> torch.Tensor:
    """A zero state of global ``shape``: a DTensor on ``p``'s mesh with ``placement`` (this
    rank's ``torch.chunk`` share of a sharded dim, as FSDP2 and DCP lay it out) when ``p`` is a
    DTensor, else a plain tensor."""
    device = local(p).device
    if not is_sharded(p):
        return torch.zeros(shape, dtype=dtype, device=device)
    return DTensor.from_local(
        torch.zeros(local_shape(p, shape, placement), dtype=dtype, device=device),
        p.device_mesh,
        (placement,),
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape, device="meta").stride(),
    )


def local_shape(
    p: torch.Tensor, shape: tuple[int, ...], placement: Shard | Replicate
) -> tuple[int, ...]:
    """This rank's part of a state of global ``shape`` placed like ``placement`` on ``p``'s mesh
    (all of it for a plain ``p``)."""
    if not is_sharded(p) or not isinstance(placement, Shard):
        return tuple(shape)
    mesh = p.device_mesh
    start, stop = chunk_range(shape[placement.dim], mesh.size(), mesh.get_local_rank())
    return tuple(stop - start if d == placement.dim else n for d, n in enumerate(shape))
