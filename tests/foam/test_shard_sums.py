"""foam/shard_sums.py: every registered part holds the sum across ranks after one all-reduce per
dtype (gloo ranks on the CPU), and nothing happens in one process."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from foam.shard_sums import PartialSums
from train.distributed import shutdown


def test_one_process_leaves_the_parts_alone():
    sums = PartialSums(None)
    part = sums.add(torch.tensor([1.0, 2.0]))
    sums.reduce()
    assert part.tolist() == [1.0, 2.0]


def _worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    calls = []
    real = dist.all_reduce
    dist.all_reduce = lambda t, **kw: (calls.append(t.dtype), real(t, **kw))[1]
    sums = PartialSums(dist.group.WORLD)
    a = sums.add(torch.full((2, 3), float(rank + 1)))
    b = sums.add(torch.tensor(float(10 * rank), dtype=torch.float64))
    c = sums.add(torch.arange(4.0) * (rank + 1))
    sums.reduce()
    queue.put((rank, a.tolist(), b.item(), c.tolist(), calls))
    shutdown()


@pytest.mark.distributed
def test_every_part_holds_the_sum_one_all_reduce_per_dtype():
    world, queue = 3, mp.get_context("spawn").SimpleQueue()
    port = 29500 + os.getpid() % 1000
    mp.start_processes(_worker, args=(world, port, queue), nprocs=world, start_method="spawn")
    results = sorted(queue.get() for _ in range(world))
    for _, a, b, c, calls in results:
        assert a == [[6.0] * 3] * 2
        assert b == 30.0
        assert c == [0.0, 6.0, 12.0, 18.0]
        assert sorted(calls, key=str) == [torch.float32, torch.float64]
