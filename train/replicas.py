"""Are the data-parallel replicas still the same model? Checked at every save, before writing.

Under DDP every rank holds the whole model and applies the same update to the same all-reduced
gradients, so the replicas stay bit-identical. A flipped bit in one GPU's memory, or a rank that
took another code path, breaks that silently: DCP writes each replicated tensor once (from one
rank), so the checkpoint would keep one replica's weights and the run would go on training
models that no longer agree. Here each rank sums its parameters' *bits* (each tensor viewed as
integers of its width, summed in int64, wrapping): any single flipped bit changes the sum, and
the cost is one read of the weights and one all-gather of one integer per tensor per save.
FSDP2 shards have no replicas, so nothing is compared there.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from train import distributed as dist

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicasDiffer(RuntimeError):
    """The replicas' parameters differ; the message is the one line naming step, rank and tensor."""


def bit_sums(model: nn.Module) -> torch.Tensor:
    """One int64 per parameter: the wrapping sum of its elements' bits read as integers."""
    sums = [
        p.detach().view(_INT_OF_WIDTH[p.element_size()]).sum(dtype=torch.int64)
        for p in model.parameters()
    ]
    return torch.stack(sums)


def check_replicas_agree(model: nn.Module, step: int) -> None:
    """Raise :class:`ReplicasDiffer` on every rank if any rank's parameters differ from rank 0's
    (a collective: every rank calls it, at the same step). A no-op in one process and under
    FSDP2."""
    if dist.world_size() == 1 or any(isinstance(p, DTensor) for p in model.parameters()):
        return
    names = [name for name, _ in model.named_parameters()]
    gathered = dist.all_gather_object(bit_sums(model).cpu())
    reference = gathered[0]
    for rank, sums in enumerate(gathered[1:], start=1):
        differs = (sums != reference).nonzero()
        if len(differs):
            first = names[int(differs[0])]
            raise ReplicasDiffer(
                f"step {step}: rank {rank}'s parameters differ from rank 0's ({len(differs)} "
                f"tensor(s), first {first}): silent corruption (a faulty GPU or memory?); "
                "stopped before saving, the last checkpoint is the newest"
            )
