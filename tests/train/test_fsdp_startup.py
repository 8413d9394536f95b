"""FSDP2 start-up within the default group's timeout (CPU, gloo): rank 0 builds the whole model
while the other ranks wait on the slow-I/O group, not in a collective of the default group.

The default group gets a timeout shorter than rank 0's (slowed) build, as NCCL's 10-minute
watchdog is shorter than rank 0's build of LLaMA-7B on the CPU: waiting in the weights' broadcast
would fail here as it would there.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

import models
from train import distributed
from train.parallelism import fill_from_rank0, parallelize

DEFAULT_GROUP_TIMEOUT = timedelta(seconds=3)
RANK0_BUILD_DELAY_S = 8.0


def tiny_build() -> torch.nn.Module:
    torch.manual_seed(0)
    return models.build_model(models.load_model_config("llama_tiny"))


def _startup_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_RANK=str(rank))
    info = distributed.env_dist_info()
    cpu = torch.device("cpu")
    distributed.init_distributed(info, cpu, timeout=DEFAULT_GROUP_TIMEOUT)
    try:

        def slow_build() -> torch.nn.Module:
            time.sleep(RANK0_BUILD_DELAY_S)
            return tiny_build()

        model = models.build_model(models.load_model_config("llama_tiny"), device="meta")
        parallelize(model, sharded=True, precision="fp32", device=cpu, world_size=2)
        fill_from_rank0(model, slow_build, cpu, is_main=info.is_main)
        out[rank] = {
            name: t.full_tensor() if hasattr(t, "full_tensor") else t.clone()
            for name, t in model.state_dict().items()
        }
        out[f"buffers{rank}"] = {n: b.clone() for n, b in model.named_buffers()}
    finally:
        distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_start_up_outlasts_a_short_default_timeout_while_rank_0_builds():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_startup_worker, args=(free_port(), out), nprocs=2, join=True)
        shards = {rank: out[rank] for rank in (0, 1)}
        buffers = out["buffers1"]
    reference = tiny_build()
    for rank, weights in shards.items():
        assert weights.keys() == reference.state_dict().keys()
        for name, expected in reference.state_dict().items():
            assert torch.equal(weights[name], expected), (rank, name)
    for name, expected in reference.named_buffers():
        assert torch.equal(buffers[name], expected), name
