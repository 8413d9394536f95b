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
from train.distributed import wrap_ddp
from train.step_stats import StepStats
from train.trainer import (
    StepResult,
    TrainingDiverged,
    accumulate_gradients,
    count_targets,
    forward_loss_sum,
    grad_norm,
    grad_norm_and_clip,
    next_token_loss_sum,
    to_device,
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
    targets, tokens, slots = result.counts.tolist()
    assert targets == sum(count_targets(b) for b in micro)
    assert float(result.loss) == pytest.approx(total / targets, rel=1e-6)
    assert tokens == sum(int(b["attention_mask"].sum()) for b in micro)
    assert slots == sum(b["input_ids"].numel() for b in micro)


def test_accumulation_equals_one_big_batch():
    micro = batches(4, 2)
    one = {k: torch.cat([b[k] for b in micro]) for k in micro[0]}
    a, b = tiny_model(), tiny_model()
    ra, rb = step(a, micro), step(b, [one])
    assert float(ra.loss) == pytest.approx(float(rb.loss), rel=1e-6)
    for ga, gb in zip(grads(a), grads(b), strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_changes_nothing():
    micro = batches(2, 2)
    plain, ckpt = tiny_model(), tiny_model()
    models.enable_gradient_checkpointing(ckpt)
    assert ckpt.is_activation_checkpointing and ckpt.training
    r1, r2 = step(plain, micro), step(ckpt, micro)
    assert torch.equal(r1.loss, r2.loss)
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
        ddp = wrap_ddp(model, CPU)
        micro = batches(4, 2)[rank::world_size]  # this rank's half of the same global batch
        result = step(ddp, micro, world_size=world_size)
        if rank == 0:
            out["loss"] = float(result.loss)
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
    assert loss == pytest.approx(float(expected.loss), rel=1e-6)
    for g1, g2 in zip(grads(single), ddp_grads, strict=True):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)


def _shifted_logits_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The former loss (logits sliced and copied, then cast): the reference for the new one."""
    flat = logits[:, :-1].reshape(-1, logits.size(-1)).float()
    return torch.nn.functional.cross_entropy(
        flat, labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shifting_labels_gives_the_shifted_logits_loss(dtype: torch.dtype) -> None:
    batch = batches(1, 4)[0]
    logits = (3 * torch.randn(4, T, VOCAB, generator=torch.Generator().manual_seed(0))).to(dtype)
    new = next_token_loss_sum(logits, batch["labels"])
    old = _shifted_logits_loss(logits, batch["labels"])
    assert new.dtype == torch.float32
    assert float(new) == pytest.approx(float(old), rel=1e-6)


def _bf16_grads(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in [(64, 48), (300,), (17, 5, 3)]:
        p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16))
        p.grad = (torch.randn(shape, generator=gen) * 40).to(torch.bfloat16)
        params.append(p)
    return params


def test_grad_norm_of_bf16_gradients_is_accumulated_in_float32() -> None:
    params = _bf16_grads()
    exact = torch.cat([p.grad.double().flatten() for p in params]).norm().item()
    norm = grad_norm(params)
    assert norm.dtype == torch.float32
    assert norm.item() == pytest.approx(exact, rel=1e-6)
    # What clip_grad_norm_ reports: per-tensor norms rounded to bf16 (3 significant digits).
    rounded = float(torch.nn.utils.clip_grad_norm_(params, float("inf"), foreach=True))
    assert abs(rounded - exact) / exact > 1e-5


def test_no_clipping_leaves_the_gradients_untouched() -> None:
    params = _bf16_grads()
    before = [(p.grad.clone(), p.grad._version) for p in params]
    norm = grad_norm_and_clip(params, 0.0)
    assert norm.item() > 1.0
    for p, (grad, version) in zip(params, before, strict=True):
        assert p.grad._version == version  # not even a multiplication by 1.0
        assert torch.equal(p.grad, grad)


def test_clipping_scales_the_gradients_to_the_limit() -> None:
    params = _bf16_grads()
    norm = grad_norm_and_clip(params, 1.0)
    assert norm.item() > 100
    assert grad_norm(params).item() == pytest.approx(1.0, rel=1e-2)  # bf16 rounding of grads


def test_step_stats_read_once_per_interval() -> None:
    stats = StepStats(CPU)
    for i, (loss, counts) in enumerate([(2.5, [10, 12, 16]), (2.0, [6, 8, 16])], start=1):
        result = StepResult(
            loss=torch.tensor(loss, dtype=torch.float64), counts=torch.tensor(counts)
        )
        stats.add(i, result, torch.tensor(0.5 * i))
    interval = stats.read()
    assert (interval.steps, interval.loss, interval.grad_norm) == (2, 2.0, 1.0)
    assert (interval.targets, interval.tokens, interval.token_slots) == (16, 20, 32)
    assert interval.seconds >= 0
    assert stats.read().steps == 0  # a new interval


def test_step_stats_name_the_first_non_finite_step() -> None:
    stats = StepStats(CPU)
    counts = torch.tensor([1, 1, 1])
    for i, (loss, norm) in enumerate([(2.0, 1.0), (2.0, float("inf")), (float("nan"), 3.0)], 1):
        stats.add(
            i,
            StepResult(loss=torch.tensor(loss, dtype=torch.float64), counts=counts),
            torch.tensor(norm),
        )
    with pytest.raises(TrainingDiverged, match=r"step 2: loss 2.0, grad norm inf"):
        stats.read()


def test_a_mask_without_padding_is_left_out_with_the_same_loss() -> None:
    padded = batches(1, 2)[0]
    full = {**padded, "attention_mask": torch.ones_like(padded["attention_mask"])}
    assert "attention_mask" in to_device(padded, CPU)
    assert "attention_mask" not in to_device(full, CPU)
    model = tiny_model()
    with torch.no_grad():
        with_mask = forward_loss_sum(model, full, contextlib.nullcontext)
        without = forward_loss_sum(model, to_device(full, CPU), contextlib.nullcontext)
    assert torch.equal(with_mask, without)
