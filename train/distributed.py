"""Process group set-up and the few collectives the trainer needs, all no-ops in one process.

Under torchrun every rank runs the Hydra app independently, so each would resolve its own
``${now:...}`` run directory (hydra #2070) and write the same ``.hydra`` files. The fix used here:
non-zero ranks are quietened before Hydra parses argv (no output subdir, no log files, run dir
``.`` unless one was given), and after the process group is up every rank adopts rank 0's run
directory.

Data parallelism (:func:`wrap_ddp`) keeps the gradients as views into DDP's all-reduce buckets.

What may keep ranks waiting for minutes runs on a second, gloo group with a long timeout
(:func:`slow_io_group`), so the default group's watchdog (10 minutes under NCCL) is never what
decides: rank 0 building the whole model under FSDP2 (:func:`barrier_for_slow_io`), DCP writing or
reading a checkpoint on slow shared storage, rank 0 opening the data.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import _redistribute
from torch.distributed.tensor._collective_utils import MeshTopoInfo
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.nn.parallel import DistributedDataParallel

from train import elastic

SLOW_IO_TIMEOUT = timedelta(hours=2)
"""How long ranks wait for one another on the slow-I/O group: a 7B run's checkpoint is tens of GB,
and rank 0 initialises a 7B model on the CPU for minutes (``trainer.slow_io_timeout_s``)."""
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a training collective on the default group waits (``trainer.collective_timeout_s``):
torch's NCCL default, for gloo too (torch's gloo default is 30 min), so a rank that really hangs
mid-step is noticed in minutes and the job restarts."""

_slow_io_group: dist.ProcessGroup | None = None


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


def run_dir_given(argv: list[str]) -> bool:
    """Whether the command names its run directory (``hydra.run.dir=...``)."""
    return any(a.startswith("hydra.run.dir=") for a in argv)


def hydra_argv_for_rank(argv: list[str], rank: int) -> list[str]:
    """Hydra overrides that keep non-zero ranks from creating run dirs and log files."""
    if rank == 0:
        return argv
    extra = [
        "hydra.output_subdir=null",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
    ]
    if not run_dir_given(argv):
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


def init_distributed(
    info: DistInfo,
    device: torch.device,
    slow_io_timeout: timedelta = SLOW_IO_TIMEOUT,
    timeout: timedelta | None = None,
) -> None:
    """Join the process group (NCCL on GPU, gloo on CPU) when launched with several ranks, with
    ``timeout`` (torch's default when None), and create the gloo group of
    :func:`slow_io_group`. Under torchrun the group forms on a store of this attempt's own, so
    that the workers of a restart do not read the dead workers' addresses
    (``train/elastic.py``)."""
    global _slow_io_group
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = None
        if elastic.uses_agent_store():
            store = elastic.attempt_store(info.rank, info.world_size, slow_io_timeout)
        dist.init_process_group(
            backend,
            device_id=device if device.type == "cuda" else None,
            timeout=timeout,
            store=store,
            rank=info.rank if store else -1,
            world_size=info.world_size if store else -1,
        )
    if dist.is_initialized() and _slow_io_group is None:
        _slow_io_group = dist.new_group(backend="gloo", timeout=slow_io_timeout)


def collective_failure(err: BaseException) -> str | None:
    """The one line for ``err`` if a collective raised it because another rank hung or died
    (gloo's timeout or closed connection, torch's ``DistError`` family: NCCL's watchdog, the
    store), else None. Such an error is no bug of this rank: it ends the run so that the job
    restarts from its last checkpoint."""
    text = str(err)
    if not (isinstance(err, dist.DistError) or "gloo/transport" in text):
        return None
    reason = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    reason = reason.split("] ", 1)[-1] if reason.startswith("[") else reason  # gloo's source line
    rank = dist.get_rank() if dist.is_initialized() else env_dist_info().rank
    return (
        f"rank {rank}: a collective failed ({reason}): another rank hung or died; stopping so "
        "that the job restarts from its last checkpoint (trainer.collective_timeout_s bounds "
        "the wait)"
    )


def slow_io_group() -> dist.ProcessGroup | None:
    """The gloo group with ``SLOW_IO_TIMEOUT`` (None without a process group): for collectives
    that wait on storage or on rank 0's set-up, such as DCP's save and load planning."""
    return _slow_io_group


def is_initialized() -> bool:
    """Whether this process is in a process group (torchrun with several ranks)."""
    return dist.is_initialized()


def shutdown(require_stopped: bool = False) -> None:
    """Destroy every process group (the slow-I/O one included) so that gloo's threads stop here,
    while the interpreter is whole.

    ``destroy_process_group`` only forgets the groups: a group lives on while anything still
    refers to it, and so do its gloo threads (two workers and an event loop). Past the end of
    ``main`` one of them may still be dropping the tensors of the last collective when the
    interpreter finalizes; the GIL it needs for that ends the thread inside a ``noexcept``
    destructor, and the rank dies of SIGABRT ("terminate called without an active exception").
    So before the destruction: DTensor's caches are emptied (``release_dtensor_caches``),
    garbage is collected (FSDP2's modules and optimizer states that went out of scope hold the
    meshes through reference cycles), and our own reference is dropped. Two references no
    teardown frees: a model or mesh the caller still holds, and ``torch.distributed.nn``'s
    defaults (``group=group.WORLD``, bound when it is first imported, e.g. through
    ``torch.distributed.fsdp`` or ``.checkpoint``: import those before the group exists).
    ``require_stopped`` (tests, benchmarks) raises where gloo threads outlive the teardown; the
    trainer leaves it off, so that its exit status stays the run's."""
    global _slow_io_group
    _slow_io_group = None
    if dist.is_initialized():
        release_dtensor_caches()
        gc.collect()
        dist.destroy_process_group()
    left = gloo_threads() if require_stopped else []
    if left:
        raise RuntimeError(
            f"{len(left)} gloo threads outlived destroy_process_group: something "
            "still refers to a process group (a model or mesh kept past the teardown, or "
            "torch.distributed.nn imported after init_process_group), and such a thread can "
            "abort the process at exit"
        )


def release_dtensor_caches() -> None:
    """Empty DTensor's caches that last as long as the process, whose entries keep every device
    mesh a DTensor op or redistribution saw, and with it the mesh's process group: the sharding
    propagation's (Python and C++), the redistribution planners, their transform plans and the
    meshes' topologies (torch 2.13; ``shutdown(require_stopped=True)`` finds one missed)."""
    _clear_sharding_prop_cache()
    _redistribute.clear_redistribute_planner_cache()
    _redistribute._gen_transform_infos.cache_clear()
    MeshTopoInfo.build_from_mesh.cache_clear()


def gloo_threads() -> list[str]:
    """The names of this process's threads that belong to gloo process groups (``[]`` where
    ``/proc`` does not list them)."""
    names = []
    for path in Path("/proc/self/task").glob("*/comm"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            names.append(path.read_text().strip())
    return [name for name in names if name.startswith(("pt_gloo", "gloo_"))]


def wrap_ddp(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    """``model`` under DDP, set up for memory as torch's DDP documentation advises.

    ``gradient_as_bucket_view=True``: ``p.grad`` are views into the all-reduce buckets instead
    of a second copy of every gradient (2 bytes per parameter in bf16). The trainer keeps those
    views alive by zeroing gradients in place (``zero_grad(set_to_none=False)``): set to None,
    the next backward would allocate fresh gradients and copy them into the buckets, and under
    gradient accumulation hold both for the whole step. Optimizers must update ``p.grad`` in
    place (LDAdamW's error feedback does).

    Buffers (RoPE's frequencies, the same on every rank) are not re-broadcast before every
    forward: ``forward_sync_buffers=False`` from torch 2.13, ``broadcast_buffers=False`` (its
    predecessor) before.
    """
    accepted = inspect.signature(DistributedDataParallel).parameters
    no_buffer_sync = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in accepted
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **no_buffer_sync,
    )


def world_size() -> int:
    """Ranks in the process group (1 in one process)."""
    return dist.get_world_size() if dist.is_initialized() else 1


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


def all_gather_object(obj: Any, *, slow_io: bool = False) -> list[Any]:
    """Every rank's ``obj``, indexed by rank. ``slow_io``: on the slow-I/O group, for set-up
    steps that the ranks may finish minutes apart (opening the data, building the tokenizer),
    which the default group's watchdog would not wait for."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_slow_io_group if slow_io else None)
    return out


def scatter_from_rank0(shares: list[Any] | None, rank: int) -> Any:
    """Rank ``rank``'s ``shares[rank]`` of rank 0's list (``None`` on the other ranks), sent on
    the slow-I/O group: rank 0 may take minutes to make it. Without a process group, the rank's
    own list."""
    if not dist.is_initialized():
        return shares[rank]
    mine: list[Any] = [None]
    dist.scatter_object_list(mine, shares, src=0, group=_slow_io_group)
    return mine[0]


@contextlib.contextmanager
def failure_stops_every_rank(error_type: type[Exception]) -> Iterator[None]:
    """Around a set-up step that any rank may fail: leaving the block is a collective, and every
    rank raises if any rank's block raised.

    A rank that raised alone would leave the others in the run's next collective until its
    timeout (10 minutes under NCCL, hours for a slow-I/O wait). The failing rank raises its own
    error; the others an ``error_type`` that names the first failing rank and its message. Every
    rank must enter the block, including ranks with nothing to do in it.
    """
    error: Exception | None = None
    try:
        yield
    except Exception as exc:  # any failure, not only ours: the other ranks must hear of it
        error = exc
    reason = None if error is None else (str(error) or type(error).__name__).splitlines()[0]
    failed = [
        (rank, r) for rank, r in enumerate(all_gather_object(reason, slow_io=True)) if r is not None
    ]
    if error is not None:
        raise error
    if failed:
        rank, reason = failed[0]
        raise error_type(f"rank {rank} failed: {reason}")


def barrier_for_slow_io() -> None:
    """Wait for every rank, for up to ``SLOW_IO_TIMEOUT``: while rank 0 writes a checkpoint's
    files or builds the whole model.

    The wait is a gloo barrier on its own group, so the NCCL group's 10-minute watchdog does not
    kill the ranks that wait; the collective that follows then waits for nothing slow.
    """
    if dist.is_initialized():
        dist.barrier(group=_slow_io_group)
