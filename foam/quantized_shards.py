"""Block-wise 8-bit states on FSDP2 shards: a rank quantises its piece of a state exactly as the
single process quantises the whole only where the piece is a run of whole blocks.

bitsandbytes quantises a tensor in blocks of ``BLOCK`` consecutive values of its flattened whole,
one float32 scale (absmax) each. A state sharded along a dim cuts that flat order into one run per
rank when every dim before it has size 1 (dim 0 always); the runs are whole blocks when each
starts at a multiple of ``BLOCK``. The scales are then sharded too, as a DTensor of the whole
tensor's ``ceil(numel / BLOCK)`` scales, whose ``torch.chunk`` pieces (what DTensor and DCP
assume) must be exactly each rank's blocks. Where that fails a block would straddle two ranks, so
the layout is refused. A replicated state (every rank holds it whole) is quantised whole by every
rank, identically. Whether a state is 8-bit at all is judged on its whole size, never a shard's,
so its precision does not change with the world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.baselines.quantized import BLOCK


def rank_blocks(shape: Sequence[int], dim: int | None, ranks: int) -> list[int] | None:
    """Each rank's count of quantisation blocks of a state of ``shape`` sharded along ``dim``
    (``None``: replicated) in FSDP2's ``torch.chunk`` pieces; ``None`` when a block would straddle
    two ranks or the scales' own ``torch.chunk`` pieces would not be the ranks' blocks."""
    blocks = math.ceil(math.prod(shape) / BLOCK)
    if dim is None or ranks == 1:
        return [blocks] * ranks
    if math.prod(shape[:dim]) != 1:  # a piece is then many runs of the flat order
        return None
    inner, length = math.prod(shape[dim + 1 :]), shape[dim]
    chunk, scales_chunk = math.ceil(length / ranks), math.ceil(blocks / ranks)
    counts = []
    for rank in range(ranks):
        start = min(rank * chunk, length)
        size = max(0, min(chunk, length - start)) * inner
        held = math.ceil(size / BLOCK)
        if (size and start * inner % BLOCK) or held != max(
            0, min(scales_chunk, blocks - rank * scales_chunk)
        ):
            return None
        counts.append(held)
    return counts


def placement_dim(tensor: torch.Tensor) -> int | None:
    """The dim a DTensor is sharded along; ``None`` for a replicated or plain tensor."""
    if isinstance(tensor, DTensor) and isinstance(tensor.placements[0], Shard):
        return tensor.placements[0].dim
    return None


def zeros_scales(codes: torch.Tensor) -> torch.Tensor:
    """Zero float32 scales for the 8-bit ``codes``: a DTensor sharded with them (or replicated)
    when they are one, holding this rank's blocks, so DCP saves and reshards them."""
    blocks = math.ceil(codes.numel() / BLOCK)
    if not isinstance(codes, DTensor):
        return torch.zeros(blocks, dtype=torch.float32, device=codes.device)
    dim, mesh = placement_dim(codes), codes.device_mesh
    counts = rank_blocks(codes.shape, dim, mesh.size())
    if counts is None:
        raise ValueError(f"8-bit state of shape {tuple(codes.shape)}: blocks straddle its shards")
    held = torch.zeros(counts[mesh.get_local_rank()], dtype=torch.float32, device=codes.device)
    placement = Replicate() if dim is None else Shard(0)
    return DTensor.from_local(
        held, mesh, (placement,), run_check=False, shape=torch.Size((blocks,)), stride=(1,)
    )
