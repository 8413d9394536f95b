"""bitsandbytes' block-wise 8-bit states on FSDP2 shards: which layouts quantise each shard
exactly, and the per-block scales laid out so that they shard, and DCP reshards them, with the
state they scale.

bitsandbytes quantises a state as runs of ``BLOCK`` entries of its row-major flattened tensor,
one float32 absmax per run (``quantize_blockwise``, and its fused 8-bit optimizer step). A rank
that holds a shard of the state (``torch.chunk``'s rows for ``Shard(0)``, an even column range
for ``Shard(1)``, as FSDP2 shards) and quantises it alone cuts its own flattened shard into runs
of ``BLOCK``: those are the whole state's blocks exactly when the shard's entries begin on a
block boundary of the whole flattened state (and, for a column shard, each row's part is whole
blocks). Then codes and scales are bitwise what one process computes for the whole state, at any
world size; otherwise some block would straddle two ranks, and ``check_block_origins`` refuses
the layout in one line before any state exists. A replicated state is quantised whole on every
rank.

The scales: a state of ``rows`` x ``cols`` (its 2-d view: dim 0 by the product of the others)
has ``ceil(rows * cols / BLOCK)`` blocks. Every ``group_rows`` rows (the fewest rows that are a
whole number of blocks, ``BLOCK / gcd(cols, BLOCK)``) hold ``group_rows * cols / BLOCK`` blocks,
so the scales are stored as ``(ceil(rows / group_rows), group_rows * cols / BLOCK)`` in block
order, with the state's own placement. That shape depends on the global shape only, so a
checkpoint written on N ranks reads on M. It shards with the state: a row shard's first row is
``r * ceil(rows / W)``, and its entries begin on a block boundary exactly when ``group_rows``
divides ``ceil(rows / W)``, in which case ``torch.chunk`` of the scale rows (``ceil(rows /
(group_rows * W))`` each) is that rank's blocks; a column shard of whole blocks needs ``cols``
to be a multiple of ``BLOCK`` (``group_rows`` 1), whose scale columns split evenly like the
state's columns. A one-dimensional scale vector could not follow an uneven row split (5 rows on
4 ranks are 2, 2, 1, 0 rows, but ``torch.chunk`` of their blocks is not). Where the last group
of rows is short, its trailing scales are padding: zero and never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.shard_blocks import local_shape, placed_zeros
from foam.sharding import ShardingNotSupported, local

BLOCK = 256
"""bitsandbytes' optimizer block size since 0.44."""


@dataclass(frozen=True)
class QuantBlocks:
    """The 8-bit blocks of a state whose 2-d view is ``rows`` x ``cols``."""

    rows: int
    cols: int

    @classmethod
    def of(cls, shape: torch.Size | tuple[int, ...]) -> QuantBlocks:
        rows = shape[0] if len(shape) else 1
        return cls(rows, math.prod(shape[1:]))

    @property
    def group_rows(self) -> int:
        """The fewest rows that hold a whole number of blocks."""
        return BLOCK // math.gcd(self.cols, BLOCK)

    @property
    def absmax_shape(self) -> tuple[int, int]:
        g = self.group_rows
        return math.ceil(self.rows / g), g * self.cols // BLOCK


def blocks(numel: int) -> int:
    """Blocks of a flattened tensor of ``numel`` entries (the last one may be short)."""
    return math.ceil(numel / BLOCK)


def shard_entries(shape: tuple[int, ...], placement: Shard | Replicate, ranks: int) -> int | None:
    """Entries of the flattened state that each rank's shard starts after the previous one's
    (the entries of one row a rank holds, for a column shard), when that is not a whole number of
    blocks, so that a block would straddle two ranks; ``None`` when every shard is whole blocks."""
    if ranks == 1 or not isinstance(placement, Shard):
        return None
    quant = QuantBlocks.of(shape)
    if placement.dim == 0:
        per_rank = math.ceil(quant.rows / ranks)
        entries = per_rank * quant.cols
        return None if per_rank >= quant.rows or entries % BLOCK == 0 else entries
    entries = math.ceil(shape[placement.dim] / ranks)  # FSDP2 splits a dim > 0 evenly
    return None if entries % BLOCK == 0 else entries


def whole_blocks(shape: tuple[int, ...], dim: int | None, ranks: int, smallest: int) -> bool:
    """Whether an 8-bit state of global ``shape`` sharded by ``dim`` (``None``: replicated) over
    ``ranks`` can be stepped (the layout rule ``foam.registry.shard_dims`` follows): a state
    under ``min_8bit_size`` (``smallest``) stays float, any layout; else every shard is whole
    blocks (what ``check_block_origins`` checks on the built optimizer)."""
    placement = Replicate() if dim is None else Shard(dim)
    return math.prod(shape) < smallest or shard_entries(shape, placement, ranks) is None


def check_block_origins(
    p: torch.Tensor,
    state_shape: tuple[int, ...],
    placement: Shard | Replicate,
    method: str,
    where: str,
) -> None:
    """Refuse in one line an 8-bit state of global ``state_shape`` placed by ``placement`` on the
    mesh of ``p`` (the parameter, ``where``) whose shards would not begin on its blocks'
    boundaries; before any state exists. The state is ``p``'s own shape (adamw8bit), FOAM's
    folded one (foam8bit) or GaLore's low-rank moment (galore8bit)."""
    if not isinstance(p, DTensor):
        return
    ranks = p.device_mesh.size()
    entries = shard_entries(state_shape, placement, ranks)
    if entries is None:
        return
    shape = tuple(p.shape)
    state = "" if tuple(state_shape) == shape else f" (its 8-bit state {tuple(state_shape)})"
    unit = "of each row " if placement.dim else ""
    raise ShardingNotSupported(
        f"{method} under FSDP2: {where} of shape {shape}{state} is sharded by dim "
        f"{placement.dim} over {ranks} ranks, {entries} entries {unit}a rank, not whole "
        f"{BLOCK}-entry blocks of its 8-bit state, so a block would straddle two ranks; use a "
        "world size whose shards are whole blocks, a min_8bit_size above "
        f"{math.prod(state_shape)} to keep it in 32 bits, or trainer.parallelism=ddp"
    )


def absmax_zeros(state: torch.Tensor) -> torch.Tensor:
    """Zero float32 scales of ``state``'s blocks (``QuantBlocks.absmax_shape``), a DTensor with
    ``state``'s mesh and placement when ``state`` is one."""
    placement = state.placements[0] if isinstance(state, DTensor) else Replicate()
    shape = QuantBlocks.of(state.shape).absmax_shape
    return placed_zeros(state, shape, placement, torch.float32)


def kernel_absmax(absmax: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """This rank's scales as bitsandbytes takes them: one per block of the local flattened
    ``state``, in order (a view: what the kernel writes lands in ``absmax``)."""
    return local(absmax).view(-1)[: blocks(local(state).numel())]


def quantized_state_bytes(
    like: torch.Tensor, shape: tuple[int, ...], placement: Shard | Replicate, per_rank: bool
) -> int:
    """Bytes of one 8-bit state of global ``shape`` placed by ``placement`` on ``like``'s mesh
    (codes and scales as allocated), on this rank (``per_rank``) or whole."""
    scales = QuantBlocks.of(shape).absmax_shape
    if per_rank:
        shape, scales = local_shape(like, shape, placement), local_shape(like, scales, placement)
    return math.prod(shape) + 4 * math.prod(scales)


def placed_like(like: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """This rank's ``values`` of a state shaped and placed as ``like`` (a DTensor when ``like``
    is one): the float values decoded from codes, or the codes of float values."""
    if not isinstance(like, DTensor):
        return values
    return DTensor.from_local(
        values,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )
