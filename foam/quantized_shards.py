"""Block-wise 8-bit states on FSDP2 shards: a rank quantises its piece of a state exactly as the
single process quantises the whole only where the piece is a run of whole blocks.

bitsandbytes quantises a tensor in blocks of ``BLOCK`` consecutive values of its flattened whole,
one float32 scale (absmax) each. A state sharded along a dim cuts that flat order into one run per
rank when every dim before it has size 1 (dim 0 always); those runs must be ``torch.chunk``'s
share of the blocks (``foam.shard_blocks.blocks_follow_rows``), so that the scales are a DTensor
of the whole tensor's ``ceil(numel / BLOCK)`` scales sharded as DTensor and DCP assume. Where that
fails a block would straddle two ranks, and the layout is refused. A replicated state (every rank
holds it whole) is quantised whole by every rank, identically. Whether a state is 8-bit at all is
judged on its whole size, never a shard's, so its precision does not change with the world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.baselines.quantized import BLOCK
from foam.shard_blocks import blocks_follow_rows, chunk_range, placed_zeros


def rank_blocks(shape: Sequence[int], dim: int | None, ranks: int) -> list[int] | None:
    """Each rank's count of quantisation blocks of a state of ``shape`` sharded along ``dim``
    (``None``: replicated) in FSDP2's ``torch.chunk`` pieces; ``None`` when a block would
    straddle two ranks."""
    count = math.ceil(math.prod(shape) / BLOCK)
    if dim is None or ranks == 1:
        return [count] * ranks
    if math.prod(shape[:dim]) != 1:  # a piece is then many runs of the flat order
        return None
    if not blocks_follow_rows(shape[dim], math.prod(shape[dim + 1 :]), count, BLOCK, ranks):
        return None
    return [stop - start for start, stop in (chunk_range(count, ranks, r) for r in range(ranks))]


def placement_dim(tensor: torch.Tensor) -> int | None:
    """The dim a DTensor is sharded along; ``None`` for a replicated or plain tensor."""
    if isinstance(tensor, DTensor) and isinstance(tensor.placements[0], Shard):
        return tensor.placements[0].dim
    return None


def zeros_scales(codes: torch.Tensor) -> torch.Tensor:
    """Zero float32 scales for the 8-bit ``codes``: a DTensor sharded with them (or replicated)
    when they are one, holding this rank's blocks, so DCP saves and reshards them."""
    dim = placement_dim(codes)
    if (
        isinstance(codes, DTensor)
        and rank_blocks(codes.shape, dim, codes.device_mesh.size()) is None
    ):
        raise ValueError(f"8-bit state of shape {tuple(codes.shape)}: blocks straddle its shards")
    placement = Replicate() if dim is None else Shard(0)
    blocks = math.ceil(codes.numel() / BLOCK)
    return placed_zeros(codes, (blocks,), placement, torch.float32)
