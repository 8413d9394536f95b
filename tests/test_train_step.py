"""One optimizer step's gradient: token-weighted over micro-batches and ranks, unchanged by
accumulation, gradient checkpointing or data parallelism."""

import contextlib
import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import models
from train.step import (
    accumulate_gradients,
    count_targets,
    next_token_loss_sum,
)

VOCAB, T = 128, 16
CPU = torch.device("cpu")


def tiny_model(seed: int = 0) -> torch.nn.Module:
    cfg = {**models.load_model_config("llama_tiny"), "vocab_size": VOCAB, "num_hidden_layers": 2}
    torch.manual_seed(seed)
    return models.build_model(cfg)


def batches(n: int, rows: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Right-padded documents of very different lengths (so token weighting matters)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(2, VOCAB, (rows, T), generator=gen)
        lengths = torch.randint(2, T + 1, (rows,), generator=gen)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        out.append(
            {
                "input_ids": ids * mask,
                "attention_mask": mask,
                "labels": ids.masked_fill(mask == 0, -100),
            }
        )
    return out


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def step(model, micro, world_size=1):
    return accumulate_gradients(
        model, micro, device=CPU, world_size=world_size, autocast=contextlib.nullcontext
    )


def test_loss_is_the_token_weighted_mean_over_the_global_batch():
    model, micro = tiny_model(), batches(3, 2)
    result = step(model, micro)
    with torch.no_grad():
        total = sum(
            float(
                next_token_loss_sum(
                    model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                    b["labels"],
                )
            )
            for b in micro
        )
    assert result.targets == sum(count_targets(b) for b in micro)
    assert result.loss == pytest.approx(total / result.targets, rel=1e-6)
    assert result.tokens == sum(int(b["attention_mask"].sum()) for b in micro)


def test_accumulation_equals_one_big_batch():
    micro = batches(4, 2)
    one = {k: torch.cat([b[k] for b in micro]) for k in micro[0]}
    a, b = tiny_model(), tiny_model()
    ra, rb = step(a, micro), step(b, [one])
    assert ra.loss == pytest.approx(rb.loss, rel=1e-6)
    for ga, gb in zip(grads(a), grads(b), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_changes_nothing():
    micro = batches(2, 2)
    plain, ckpt = tiny_model(), tiny_model()
    models.enable_gradient_checkpointing(ckpt)
    assert ckpt.is_activation_checkpointing and ckpt.training
    r1, r2 = step(plain, micro), step(ckpt, micro)
    assert r1.loss == r2.loss
    for g1, g2 in zip(grads(plain), grads(ckpt), strict=True):
        torch.testing.assert_close(g1, g2, rtol=1e-6, atol=1e-8)


def _ddp_worker(rank: int, world_size: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A bounded wait: a rank that never arrives (say, its port was taken in between) fails the
    # test instead of hanging it.
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=90))
    try:
        model = tiny_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False)
        micro = batches(4, 2)[rank::world_size]  # this rank's half of the same global batch
        result = step(ddp, micro, world_size=world_size)
        if rank == 0:
            out["loss"] = result.loss
            out["grads"] = grads(model)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_ddp_equals_one_rank_with_the_same_global_batch():
    single = tiny_model()
    expected = step(single, batches(4, 2))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_ddp_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        loss, ddp_grads = out["loss"], out["grads"]
    assert loss == pytest.approx(expected.loss, rel=1e-6)
    for g1, g2 in zip(grads(single), ddp_grads, strict=True):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)
