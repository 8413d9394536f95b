"""Process group set-up and the few collectives the trainer needs, all no-ops in one process.

Under torchrun every rank runs the Hydra app independently, so each would resolve its own
``${now:...}`` run directory (hydra #2070) and write the same ``.hydra`` files. The fix used here:
non-zero ranks are quietened before Hydra parses argv (no output subdir, no log files, run dir
``.`` unless one was given), and after the process group is up every rank adopts rank 0's run
directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits; ``world_size == 1`` means no process group at all."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_dist_info() -> DistInfo:
    """Rank and world size as torchrun exports them (defaults: a single process)."""
    return DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def hydra_argv_for_rank(argv: list[str], rank: int) -> list[str]:
    """Hydra overrides that keep non-zero ranks from creating run dirs and log files."""
    if rank == 0:
        return argv
    extra = [
        "hydra.output_subdir=null",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
    ]
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        extra.append("hydra.run.dir=.")
    return [*argv, *extra]


def resolve_device(spec: str, info: DistInfo) -> torch.device:
    """``auto`` is this rank's GPU when CUDA is present, else the CPU."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init_distributed(info: DistInfo, device: torch.device) -> None:
    """Join the process group (NCCL on GPU, gloo on CPU) when launched with several ranks."""
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place global sum (identity in one process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """In-place global element-wise maximum (identity in one process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
