"""Batched partial sums: every small tensor an optimizer step needs summed across the ranks of a
sharded (FSDP2) step travels in one all-reduce per dtype, not one collective per tensor.

A sharded step that needs a whole-matrix scalar (a norm-growth limiter's norms, a block mean over
a block that spans ranks, a projection ``P^T G`` whose basis lies along the sharded dim) computes
each rank's part, registers it here, and finishes after :meth:`PartialSums.reduce`, which sums
every registered tensor in place. The step is then two passes over its parameters (parts, one
reduction, the rest), which is how one collective serves the whole step: latency, not bytes,
is what a collective per parameter costs (hundreds per step at 7B).

In one process (no group, or a group of one) :meth:`reduce` does nothing, so an optimizer writes
the sharded and unsharded step as one code path.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist


class PartialSums:
    """Tensors to be summed across ``group``'s ranks, summed together by :meth:`reduce`.

    Every rank must register the same tensors (shape, dtype, order): a rank whose shard is empty
    registers zeros of the same shape, or the all-reduce pairs the wrong elements (or hangs).
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self._pending: list[torch.Tensor] = []

    @property
    def spans_ranks(self) -> bool:
        return self.group is not None and dist.get_world_size(self.group) > 1

    def add(self, part: torch.Tensor) -> torch.Tensor:
        """Register ``part`` (this rank's share); it holds the sum after :meth:`reduce`."""
        self._pending.append(part)
        return part

    def reduce(self) -> None:
        """Sum every registered tensor across the ranks, in place: one all-reduce per dtype and
        device, in registration order; then start an empty batch."""
        pending, self._pending = self._pending, []
        if not pending or not self.spans_ranks:
            return
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = defaultdict(list)
        for part in pending:
            by_kind[(part.dtype, part.device)].append(part)
        for parts in by_kind.values():
            flat = torch.cat([part.reshape(-1) for part in parts])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for part in parts:
                part.copy_(flat[offset : offset + part.numel()].view_as(part))
                offset += part.numel()
