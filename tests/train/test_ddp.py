"""DDP as the trainer sets it up (train/distributed.py), built with the installed torch.

An in-process gloo group of world size 1 is a real DDP: gradients go through the reducer's
buckets and its all-reduce, which is what the bucket-view checks need; the two-rank equality
of gradients is in ``tests/train/test_step.py``.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from packaging.requirements import Requirement
from packaging.version import Version

import foam
from tests.helpers.optim import TINY_LLAMA, build, tiny_llama
from train import distributed
from train.distributed import DistInfo, wrap_ddp
from train.step import accumulate_gradients

CPU = torch.device("cpu")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.fixture(scope="module")
def process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    distributed.init_distributed(DistInfo(), CPU)  # adds the slow-I/O group to the one above
    yield
    distributed.shutdown()


def test_installed_torch_meets_the_stated_floor() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    torch_req = next(Requirement(d) for d in dependencies if Requirement(d).name == "torch")
    assert Version(torch.__version__).base_version in torch_req.specifier


def test_ddp_builds_with_the_installed_torch(process_group) -> None:
    ddp = wrap_ddp(tiny_llama(), CPU)
    assert ddp.gradient_as_bucket_view
    sync = getattr(ddp, "forward_sync_buffers", None)
    assert (sync if sync is not None else ddp.broadcast_buffers) is False
    distributed.barrier_for_slow_io()


def test_a_rank_that_fails_a_set_up_step_raises_its_own_error(process_group) -> None:
    """The other ranks' side (an error naming the failing rank) is tested with two ranks in
    tests/train/data/test_val_batches.py."""
    with distributed.failure_stops_every_rank(RuntimeError):
        pass  # no rank failed: nothing raised
    error = OSError("disk gone")
    with pytest.raises(OSError) as raised, distributed.failure_stops_every_rank(RuntimeError):
        raise error
    assert raised.value is error


def test_older_torch_gets_broadcast_buffers(monkeypatch) -> None:
    """torch < 2.13 has no forward_sync_buffers: its predecessor is passed instead."""
    seen = {}

    def old_ddp(module, device_ids=None, broadcast_buffers=True, gradient_as_bucket_view=False):
        seen.update(broadcast_buffers=broadcast_buffers, bucket_view=gradient_as_bucket_view)

    monkeypatch.setattr(distributed, "DistributedDataParallel", old_ddp)
    wrap_ddp(torch.nn.Linear(2, 2), CPU)
    assert seen == {"broadcast_buffers": False, "bucket_view": True}


def _micro_batches(step: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(step)
    out = []
    for _ in range(2):  # two micro-batches: accumulation under no_sync into the bucket views
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 8), generator=gen)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _train(name: str, use_ddp: bool, steps: int = 3) -> tuple[list[torch.Tensor], list[bool]]:
    model = tiny_llama()
    optimizer = build(name, model, lr=1e-2)
    wrapped = wrap_ddp(model, CPU) if use_ddp else model
    for step in range(steps):
        accumulate_gradients(
            wrapped,
            _micro_batches(step),
            device=CPU,
            world_size=1,
            autocast=contextlib.nullcontext,
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=not use_ddp)  # the trainer's choice
    views = [p.grad is not None and p.grad._is_view() for p in model.parameters()]
    return [p.detach().clone() for p in model.parameters()], views


@pytest.mark.parametrize("name", sorted(foam.available_optimizers()))
def test_every_optimizer_trains_the_same_on_bucket_view_gradients(process_group, name) -> None:
    """Each method updates p.grad in place or not at all (LDAdamW's error feedback lives in
    it), so the gradients stay views into DDP's buckets and the weights are those of a run
    without DDP."""
    plain, _ = _train(name, use_ddp=False)
    under_ddp, views = _train(name, use_ddp=True)
    assert all(views)
    for a, b in zip(plain, under_ddp, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _waits_for_a_slow_writer(rank: int, store: str, out: dict) -> None:
    torch.set_num_threads(1)
    # The default group gives up after 2 s; rank 0 "writes a checkpoint" for 5 s.
    dist.init_process_group(
        "gloo", init_method=store, rank=rank, world_size=2, timeout=timedelta(seconds=2)
    )
    try:
        distributed.init_distributed(
            DistInfo(rank=rank, world_size=2), CPU, slow_io_timeout=timedelta(seconds=60)
        )
        if rank == 0:
            time.sleep(5)
        distributed.barrier_for_slow_io()
        out[rank] = "passed the barrier"
    finally:
        distributed.shutdown()


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_wait_for_a_checkpoint_longer_than_the_default_timeout(tmp_path) -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        store = f"file://{tmp_path / 'store'}"
        mp.spawn(_waits_for_a_slow_writer, args=(store, out), nprocs=2, join=True)
        assert dict(out) == {0: "passed the barrier", 1: "passed the barrier"}
