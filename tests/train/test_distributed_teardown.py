"""``train.distributed.shutdown``: after an FSDP2 step and a redistribution, the teardown stops
every gloo thread of the process groups while the interpreter is whole.

A group lives on past ``destroy_process_group`` while anything refers to it, and so do its gloo
threads; one of them still dropping a collective's tensors when the interpreter finalizes dies
in a ``noexcept`` destructor and aborts the rank (SIGABRT, "terminate called without an active
exception": the gloo parity runs and ``scripts/bench_shard_comm.py`` lost a rank to it now and
then). DTensor's caches held every mesh, so every group, to the end of the process: a plain
``destroy_process_group`` left 3 threads a group here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from train.distributed import gloo_threads, shutdown

_KEPT: list = []


def _worker(rank: int, world: int, init_file: str, out: str, keep_mesh: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dist.new_group(backend="gloo")  # a second group, as the trainer's slow-I/O one
    mesh = init_device_mesh("cpu", (world,))
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    fully_shard(model, mesh=mesh)
    model(torch.ones(3, 8)).sum().backward()
    torch.optim.AdamW(model.parameters()).step()
    [p.full_tensor() for p in model.parameters()]  # a redistribution
    if keep_mesh:  # the negative control: a reference the teardown cannot drop
        _KEPT.append(mesh)
    del model, mesh
    try:
        shutdown(require_stopped=True)
        error = None
    except RuntimeError as err:
        error = str(err)
    torch.save({"threads": gloo_threads(), "error": error}, f"{out}.{rank}")
    _KEPT.clear()


def _teardown(keep_mesh: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out")
        args = (2, str(Path(tmp) / "init"), out, keep_mesh)
        mp.spawn(_worker, args=args, nprocs=2)
        return [torch.load(f"{out}.{rank}") for rank in range(2)]


@pytest.mark.distributed
def test_no_gloo_thread_outlives_the_teardown():
    for rank in _teardown(keep_mesh=False):
        assert rank == {"threads": [], "error": None}


@pytest.mark.slow
@pytest.mark.distributed
def test_a_group_kept_past_the_teardown_is_reported_in_one_line():
    for rank in _teardown(keep_mesh=True):
        assert len(rank["threads"]) == 3  # the world group's: two workers, one event loop
        assert rank["error"].startswith("3 gloo threads outlived destroy_process_group")
        assert "\n" not in rank["error"]
