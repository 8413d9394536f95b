"""Run by ``tests/helpers/fsdp_parity.py``: under ``torchrun --nproc_per_node 2`` (gloo, CPU)
train a tiny LLaMA with FSDP2 on two ranks; as a plain process, the same model unsharded on the
whole batch.
Prints one JSON line per optimizer: the loss curve, the bytes of its moments on rank 0 (step
counters left out: every rank holds all of them) and which step FOAM's matrices took
(``foam.steps_run``), or the refusal.

Each rank takes half of every global batch as two micro-batches (so gradient accumulation is
exercised); the reference takes the whole batch as two micro-batches. Under FSDP2 the record also
says whether, at every step's second forward, each parameter's gradient from the first micro-batch
was already a sharded DTensor of the parameter's layout (reduce-scattered, not held unsharded until
the last micro-batch). Gradient clipping is on, at a norm the first steps exceed, so the global
norm over shards is exercised too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import foam
import models
from foam.sharding import local
from models.config import load_model_config
from train.distributed import shutdown
from train.parallelism import parallelize
from train.step import train_step

STEPS = 5
BATCH, SEQ = 8, 16
CLIP = 0.5


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = {**load_model_config("llama_tiny"), "vocab_size": 256}
    model = models.build_model(cfg)
    model.config.use_cache = False
    return model


def batches(rank: int, world: int) -> list[dict[str, torch.Tensor]]:
    """Every step's micro-batches for ``rank``: its share of the global batch, in two halves."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(2, 256, (BATCH, SEQ), generator=g)
        lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
        mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
        mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        ids, mask = ids[mine], mask[mine]
        half = ids.shape[0] // 2
        for part in (slice(0, half), slice(half, None)):
            out.append(
                {
                    "input_ids": ids[part],
                    "attention_mask": mask[part],
                    "labels": ids[part].masked_fill(mask[part] == 0, -100),
                }
            )
    return out


def grads_sharded_between_micro_batches(model: torch.nn.Module) -> list[bool]:
    """One entry per forward after a step's first: whether every parameter then held a gradient
    sharded like itself (its ``.grad`` a DTensor with its placements and local shape)."""
    params = list(model.parameters())  # the sharded DTensors (forward swaps in unsharded ones)
    seen: list[bool] = []
    forwards = itertools.count()

    def check(module: torch.nn.Module, args: object) -> None:
        if next(forwards) % 2:  # the second of a step's two micro-batches
            seen.append(
                all(
                    isinstance(p.grad, DTensor)
                    and p.grad.placements == p.placements
                    and p.grad.to_local().shape == p.to_local().shape
                    for p in params
                )
            )

    model.register_forward_pre_hook(check)
    return seen


def train(
    name: str, world: int, rank: int, sharded: bool
) -> tuple[list[float], int, list[bool], dict]:
    model = tiny_model()
    replica = parallelize(
        model,
        sharded=sharded,
        precision="fp32",
        device=torch.device("cpu"),
        world_size=world if sharded else 1,
        optimizer=name,
    )
    sharded_grads = grads_sharded_between_micro_batches(model) if sharded else []
    optimizer = foam.build_optimizer(name, model, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loader = iter(batches(rank if sharded else 0, world if sharded else 1))
    losses = []
    for _ in range(STEPS):
        result, _, _ = train_step(
            replica,
            optimizer,
            scheduler,
            loader,
            accumulation=2,
            device=torch.device("cpu"),
            world_size=world if sharded else 1,
            autocast=contextlib.nullcontext,
            grad_clip=CLIP,
        )
        losses.append(float(result.loss))
    steps = sum(  # Muon keeps no step counter, bitsandbytes a Python int
        local(s["step"]).numel() * s["step"].element_size()
        for s in optimizer.state.values()
        if isinstance(s.get("step"), torch.Tensor)
    )
    moments = foam.state_bytes(optimizer) - steps  # without step counters
    return losses, moments, sharded_grads, foam.steps_run(optimizer)


def main(names: list[str]) -> None:
    """Under torchrun: FSDP2 over the ranks; as a plain process: the unsharded reference."""
    sharded = "RANK" in os.environ
    if sharded:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    for name in names:
        try:
            losses, state_bytes, sharded_grads, foam_steps = train(name, world, rank, sharded)
        except foam.sharding.ShardingNotSupported as err:
            if rank == 0:
                print(json.dumps({"optimizer": name, "refused": str(err)}), flush=True)
            continue
        if rank == 0:
            record = {
                "optimizer": name,
                "losses": losses,
                "moment_bytes": state_bytes,
                "sharded_grads_between_micro_batches": sharded_grads,
                "foam_steps": foam_steps,
            }
            print(json.dumps(record), flush=True)
    if sharded:
        shutdown(require_stopped=True)


if __name__ == "__main__":
    main(sys.argv[1:])
