"""One optimizer step's gradient: token-weighted over micro-batches and ranks, unchanged by
accumulation, gradient checkpointing or data parallelism."""

import contextlib
import math
import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import models
from foam.profiling import peak_transient_bytes
from train.distributed import shutdown, wrap_ddp
from train.errors import TrainingDiverged
from train.objective import MLM_LABELS
from train.step import (
    StepResult,
    accumulate_gradients,
    grad_norm,
    grad_norm_and_clip,
    loss_sum_for,
    mask_changes_no_counted_logit,
    next_token_loss_sum,
    to_device,
)
from train.step_stats import StepStats

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


def hf_targets(batch: dict[str, torch.Tensor]) -> int:
    """Next-token targets as transformers counts them: labels after the shift that are not -100."""
    return int((batch["labels"][:, 1:] != -100).sum())


def test_loss_and_gradient_match_transformers_own_loss():
    """The reference is transformers' ``model(..., labels=...).loss`` (which shifts the labels
    and ignores -100, our padding label), weighted by each micro-batch's target count: the
    token-weighted mean over the whole step, and its gradient."""
    micro = batches(3, 2)
    ours, ref = tiny_model(), tiny_model()
    result = step(ours, micro)
    counts = [hf_targets(b) for b in micro]
    total = sum(
        ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
        * n
        for b, n in zip(micro, counts, strict=True)
    )
    (total / sum(counts)).backward()
    assert len(set(counts)) > 1  # uneven micro-batches: a mean of means would differ
    assert int(result.counts[0]) == sum(counts)
    assert float(result.loss) == pytest.approx(float(total.detach()) / sum(counts), rel=1e-6)
    assert int(result.counts[1]) == sum(int(b["attention_mask"].sum()) for b in micro)
    assert int(result.counts[2]) == sum(b["input_ids"].numel() for b in micro)
    for g_ours, g_ref in zip(grads(ours), grads(ref), strict=True):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-7)


def test_padding_targets_do_not_count():
    """A row that is all padding after its first token adds nothing: no target, no loss."""
    (batch,) = batches(1, 2)
    padded = {k: v.clone() for k, v in batch.items()}
    padded["labels"][1, 1:] = -100
    padded["attention_mask"][1, 1:] = 0
    only_first = {k: v[:1] for k, v in batch.items()}
    a, b = tiny_model(), tiny_model()
    ra, rb = step(a, [padded]), step(b, [only_first])
    assert int(ra.counts[0]) == int(rb.counts[0]) == hf_targets(only_first)
    assert float(ra.loss) == pytest.approx(float(rb.loss), rel=1e-6)


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


def test_one_target_and_no_target_steps():
    """Edge counts: a single target is its own mean; a step of padding only has loss 0 and a
    zero (not NaN) gradient."""
    (batch,) = batches(1, 1)
    one = {k: v.clone() for k, v in batch.items()}
    one["labels"][0, 2:] = -100
    one["attention_mask"][0, 2:] = 0
    ours, ref = tiny_model(), tiny_model()
    result = step(ours, [one])
    expected = ref(**one).loss  # input_ids, attention_mask and labels
    expected.backward()
    assert int(result.counts[0]) == 1
    assert float(result.loss) == pytest.approx(float(expected.detach()), rel=1e-6)
    for g_ours, g_ref in zip(grads(ours), grads(ref), strict=True):
        # The softmax of the gradient is exp(logit - log-sum-exp), transformers' the log-softmax
        # backward's: one position's float32 roundings, not averaged over many.
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-4, atol=1e-7)

    empty = {k: v.clone() for k, v in batch.items()}
    empty["labels"][:] = -100
    model = tiny_model()
    result = step(model, [empty])
    assert int(result.counts[0]) == 0 and float(result.loss) == 0.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads(model))


def test_each_rank_scales_its_loss_by_the_world_size():
    """DDP averages gradients over ranks, so a rank's gradient must be world_size times its share
    of the global token sum (checked here in one process, where the all-reduce is the identity)."""
    micro = batches(2, 2)
    one, two = tiny_model(), tiny_model()
    r1, r2 = step(one, micro, world_size=1), step(two, micro, world_size=2)
    assert float(r1.loss) == pytest.approx(float(r2.loss), rel=1e-12)
    for g1, g2 in zip(grads(one), grads(two), strict=True):
        torch.testing.assert_close(g2, 2 * g1, rtol=1e-6, atol=1e-9)


class SyncRecorder(torch.nn.Module):
    """A stand-in for DDP that records, per forward, whether it ran under ``no_sync``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.syncing, self.seen = model, True, []

    def forward(self, **inputs):
        self.seen.append(self.syncing)
        return self.model(**inputs)

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True


def test_gradients_are_all_reduced_only_on_the_last_micro_batch():
    wrapper = SyncRecorder(tiny_model())
    step(wrapper, batches(3, 2))
    assert wrapper.seen == [False, False, True]


def gradients_with_norm(norm: float) -> list[torch.Tensor]:
    """Three parameters whose gradients have total L2 norm ``norm``."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.zeros(shape, requires_grad=True) for shape in ((3, 4), (5,), (2, 2, 2))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    total = math.sqrt(sum(float(p.grad.double().square().sum()) for p in params))
    for p in params:
        p.grad.mul_(norm / total)
    return params


def test_clipping_reports_the_total_norm_and_scales_gradients_to_the_limit():
    params = gradients_with_norm(4.0)
    before = [p.grad.clone() for p in params]
    assert grad_norm_and_clip(params, max_norm=1.0) == pytest.approx(4.0, rel=1e-6)
    for p, g in zip(params, before, strict=True):
        torch.testing.assert_close(p.grad, g / 4.0, rtol=1e-5, atol=0)
    after = math.sqrt(sum(float(p.grad.square().sum()) for p in params))
    assert after == pytest.approx(1.0, rel=1e-5)  # 1.0: the GaLore 7B recipe's grad_clip


@pytest.mark.parametrize("max_norm", [0.0, 8.5])
def test_clipping_off_or_under_the_limit_leaves_gradients_alone(max_norm):
    params = gradients_with_norm(8.0)
    before = [p.grad.clone() for p in params]
    assert grad_norm_and_clip(params, max_norm=max_norm) == pytest.approx(8.0, rel=1e-6)
    for p, g in zip(params, before, strict=True):
        assert torch.equal(p.grad, g)


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
        shutdown()


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


def model_of(name: str, seed: int = 0) -> torch.nn.Module:
    cfg = {**models.load_model_config(name), "vocab_size": VOCAB}
    torch.manual_seed(seed)
    return models.build_model(cfg)


def left_padded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same documents with their padding moved to the front of each row."""
    lengths = batch["attention_mask"].sum(1)
    shift = {k: torch.stack([row.roll(int(n)) for row, n in zip(v, T - lengths, strict=True)])
             for k, v in batch.items()}  # fmt: skip
    return shift


@pytest.mark.parametrize("name", ["llama_tiny", "qwen_tiny"])
def test_counted_logits_are_the_same_without_the_mask_of_a_right_padded_batch(name) -> None:
    """A causal LM's token sees only itself and what precedes it, all real tokens in a
    right-padded row: the mask changes no logit at a real position (LLaMA; Qwen2 with GQA, q/k/v
    biases and tied embeddings), and the batch reaches the model without it."""
    batch = batches(1, 4)[0]
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # padded
    model = model_of(name)
    with torch.no_grad():
        masked = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        unmasked = model(input_ids=batch["input_ids"])
    torch.testing.assert_close(unmasked.logits[mask], masked.logits[mask], rtol=1e-5, atol=1e-5)
    assert "attention_mask" not in to_device(batch, CPU)


def test_a_left_padded_batch_keeps_its_mask_which_changes_its_logits() -> None:
    """Left padding puts padding before real tokens: without the mask they would attend to it."""
    batch = left_padded(batches(1, 4)[0])
    mask = batch["attention_mask"].bool()
    assert not mask[:, 0].all() and mask[:, -1].all()
    assert not mask_changes_no_counted_logit(batch)
    assert torch.equal(to_device(batch, CPU)["attention_mask"], batch["attention_mask"])
    model = model_of("llama_tiny")
    with torch.no_grad():
        masked = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        unmasked = model(input_ids=batch["input_ids"])
    assert not torch.allclose(unmasked.logits[mask], masked.logits[mask], atol=1e-3)


def test_a_padded_position_holding_a_label_keeps_the_mask() -> None:
    """Dropping the mask is exact only because padded positions predict nothing counted."""
    batch = batches(1, 4)[0]
    assert mask_changes_no_counted_logit(batch)
    labelled = {**batch, "labels": batch["input_ids"].clone()}  # padding labelled 0, not -100
    assert not mask_changes_no_counted_logit(labelled)
    assert "attention_mask" in to_device(labelled, CPU)


class InputRecorder(torch.nn.Module):
    """The model, recording the attention mask each forward was given."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.masks = model, []

    def forward(self, input_ids, attention_mask=None):
        self.masks.append(attention_mask)
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def test_no_mask_reaches_the_model_in_a_training_step_unless_left_padded() -> None:
    padded = batches(1, 4)[0]
    packed = {**padded, "attention_mask": torch.ones_like(padded["attention_mask"])}
    recorder = InputRecorder(tiny_model())
    step(recorder, [padded, packed, left_padded(padded)])
    assert recorder.masks[0] is None and recorder.masks[1] is None
    assert torch.equal(recorder.masks[2], left_padded(padded)["attention_mask"])


def test_a_masked_lm_batch_keeps_its_mask_whatever_its_padding() -> None:
    """An encoder's tokens attend to the padding after them too: only the mask stops it."""
    padded = batches(1, 4)[0]
    masked_lm = {k: v for k, v in padded.items() if k != "labels"}
    masked_lm[MLM_LABELS] = padded["labels"]
    assert mask_changes_no_counted_logit(padded)
    assert not mask_changes_no_counted_logit(masked_lm)
    on_device = to_device(masked_lm, torch.device("cpu"))
    assert torch.equal(on_device["attention_mask"], padded["attention_mask"])


def whole_tensor_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss before chunking: the whole logits tensor cast to float32 for cross-entropy."""
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100).flatten()
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), targets, ignore_index=-100, reduction="sum"
    )


def reference_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor):
    leaf = logits.detach().requires_grad_()
    loss = whole_tensor_loss(leaf, labels)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [None, 1, 5, 64])
def test_the_chunked_loss_equals_the_whole_tensors_loss_and_gradient(dtype, chunk_rows) -> None:
    """Chunks of 1, 5 (a short last chunk: 4 x 16 positions), 64 (all) and the default: the
    same loss (float32 sums in another order) and, per position, the same gradient."""
    batch = batches(1, 4)[0]
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(4, T, VOCAB, generator=gen)).to(dtype)
    expected, expected_grad = reference_loss_and_grad(logits, batch["labels"])
    leaf = logits.clone().requires_grad_()
    loss = next_token_loss_sum(leaf, batch["labels"], chunk_rows=chunk_rows)
    loss.backward()
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(float(expected), rel=1e-6)
    assert leaf.grad.dtype == dtype
    torch.testing.assert_close(leaf.grad, expected_grad)  # bf16: within one rounding


def test_the_loss_never_holds_the_whole_logits_in_float32() -> None:
    """bf16 logits of 8 x 16 positions x 4,096 tokens (1 MiB; 2 MiB in float32): forward and
    backward in chunks of 16 positions allocate less than the float32 copy the unchunked loss
    made, and the unchunked one more than it."""
    labels = torch.randint(2, 4096, (8, T), generator=torch.Generator().manual_seed(0))
    logits = torch.randn(8, T, 4096, dtype=torch.bfloat16)
    float_copy = logits.numel() * 4

    def forward_backward(loss_sum) -> None:
        leaf = logits.detach().requires_grad_()
        loss_sum(leaf).backward()

    chunked, _ = peak_transient_bytes(
        lambda: forward_backward(lambda x: next_token_loss_sum(x, labels, chunk_rows=16))
    )
    before, _ = peak_transient_bytes(
        lambda: forward_backward(lambda x: whole_tensor_loss(x, labels))
    )
    assert chunked < float_copy < before


def test_without_gradients_the_loss_is_the_same() -> None:
    batch = batches(1, 4)[0]
    logits = 3 * torch.randn(4, T, VOCAB, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        chunked = next_token_loss_sum(logits, batch["labels"], chunk_rows=7)
    assert float(chunked) == pytest.approx(
        float(reference_loss_and_grad(logits, batch["labels"])[0]), rel=1e-6
    )


@pytest.mark.slow
def test_the_compiled_loss_gives_the_eager_loss_and_gradient() -> None:
    """``trainer.compile``'s loss, built by inductor for the CPU (about a minute)."""
    batch = batches(1, 4)[0]
    logits = (3 * torch.randn(4, T, VOCAB, generator=torch.Generator().manual_seed(2))).to(
        torch.bfloat16
    )
    results = []
    for loss_sum in (loss_sum_for(False), loss_sum_for(True)):
        leaf = logits.clone().requires_grad_()
        loss = loss_sum(leaf, batch["labels"])
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(results[1][1], results[0][1])
