"""One optimizer step: token-weighted loss and gradient over micro-batches and ranks, then the update.

The loss of a step is (sum of next-token losses over the global batch) / (non-pad targets in the
global batch). The global target count is all-reduced *before* the backward passes, and each
micro-batch backpropagates its summed loss divided by that count. DDP averages gradients over
ranks, so each rank's loss is multiplied by the world size to turn the average back into the
global sum (FSDP2's reduce-scatter averages the same way). DDP reduces gradients on the last
micro-batch only; FSDP2 reduce-scatters every micro-batch into the sharded gradients, which sums
to the same (``train/parallelism.py``'s ``no_gradient_sync`` says why).
This replaces the references' mean-of-micro-batch-means, which weights short documents more.
A masked-LM batch (an encoder's, ``train/objective.py``) is scored the same way on its masked
positions instead of the next tokens.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from foam.sharding import local
from train.distributed import all_reduce_sum
from train.objective import IGNORE_INDEX, MLM_LABELS, count_masked, masked_loss_sum
from train.parallelism import no_gradient_sync

Batch = dict[str, torch.Tensor]


LossSum = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(logits, labels) -> the summed next-token loss: ``next_token_loss_sum`` or its compiled form."""

LOSS_CHUNK_BYTES = 2**28
"""The float32 logits one chunk of the loss holds at a time (256 MiB: 2,048 positions of a
32,000-token vocabulary). Unchunked, the float32 copy of LLaMA-60M's logits at 64 x 256 tokens
(2 GiB) and its gradient were most of a step's peak memory."""


class _ChunkedCrossEntropySum(torch.autograd.Function):
    """Summed cross-entropy of ``logits`` [N, V] against ``targets`` [N] (``IGNORE_INDEX``: not counted),
    ``rows`` positions at a time: each chunk is cast to float32 on its own, the forward keeps
    only the log-sum-exp of each position (N floats), and the backward writes the gradient
    (softmax minus one-hot, times the incoming scalar) chunk by chunk straight into one tensor
    of the logits' dtype. ``F.cross_entropy`` on the float32 copy computes the same numbers."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        lse = torch.cat([part.float().logsumexp(-1) for part in logits.split(rows)])
        counted = targets != IGNORE_INDEX
        picked = logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1).float()
        ctx.save_for_backward(logits, targets, lse)
        ctx.rows = rows
        return ((lse - picked) * counted).sum()

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.size(0), ctx.rows):
            rows = slice(start, start + ctx.rows)
            counted = (targets[rows] != IGNORE_INDEX).float()[:, None]
            softmax = (logits[rows].float() - lse[rows, None]).exp_()
            softmax.scatter_add_(1, targets[rows].clamp(min=0)[:, None], -counted)
            grad[rows] = softmax.mul_(counted * grad_total)
        return grad, None, None


def next_token_loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, *, chunk_rows: int | None = None
) -> torch.Tensor:
    """Summed cross-entropy of position t predicting label t+1 (labels are aligned with the
    inputs; ``IGNORE_INDEX`` marks padding), in float32 like transformers' own loss.

    The labels are shifted (one ``IGNORE_INDEX`` column appended), not the logits, which slicing would copy.
    The positions are taken ``chunk_rows`` at a time (by default as many as ``LOSS_CHUNK_BYTES``
    of float32 logits hold, ``_ChunkedCrossEntropySum``): only a chunk is ever in float32, and
    the gradient is in the logits' dtype. Compiled (``loss_sum_for``), inductor fuses each
    chunk's cast and reductions into one read of it.
    """
    flat = logits.flatten(0, 1)
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).flatten()
    rows = chunk_rows or max(1, LOSS_CHUNK_BYTES // (4 * flat.size(-1)))
    return _ChunkedCrossEntropySum.apply(flat, targets, rows)


@functools.cache
def _compiled_next_token_loss_sum() -> LossSum:
    return torch.compile(next_token_loss_sum)


def loss_sum_for(compiled: bool) -> LossSum:
    """The loss a run takes: compiled where its decoder layers are (``trainer.compile``), so the
    loss joins the compiled region; the same function eager otherwise."""
    return _compiled_next_token_loss_sum() if compiled else next_token_loss_sum


def count_targets(batch: Batch) -> int:
    """Tokens that contribute to the loss (non-pad next-token targets; a masked-LM batch's
    masked positions, ``train/objective.py``)."""
    if MLM_LABELS in batch:
        return count_masked(batch)
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` without stalling the host: on CUDA the copy is made from pinned
    memory, so it is queued like a kernel (from pageable memory it may wait for the GPU)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def mask_changes_no_counted_logit(batch: Batch) -> bool:
    """Whether a causal LM computes the same logits at every counted position without the
    batch's attention mask: each row is its tokens, then its padding (``1..1 0..0``, no padding
    at all included), and no padded position holds a label. A token of a causal LM attends to
    itself and the positions before it, which in such a row are all real tokens; the padded
    positions it would change predict nothing counted. Left padding (``0..0 1..1``) is not such
    a batch: without the mask a real token would attend to the padding before it. Nor is a
    masked-LM batch (``MLM_LABELS``): an encoder's every token attends to every other, padding
    included, unless the mask says otherwise."""
    if MLM_LABELS in batch:
        return False
    mask = batch["attention_mask"]
    right_padded = bool((mask[:, 1:] <= mask[:, :-1]).all())
    return right_padded and bool((batch["labels"][mask == 0] == IGNORE_INDEX).all())


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A host-side batch on ``device``, without its attention mask where the mask changes no
    counted logit (``mask_changes_no_counted_logit``:
    the protocol's right-padded batches, packed ones, any batch without padding); the loss's
    masking is the labels' ``IGNORE_INDEX`` either way. Without a mask, SDPA may take the flash kernel
    (an explicit mask rules it out) and transformers builds no mask on the device (which reads
    the mask back to the host once or twice per forward). A left-padded batch keeps its mask."""
    keep_mask = "attention_mask" in batch and not mask_changes_no_counted_logit(batch)
    return {
        k: to_device_async(v, device)
        for k, v in batch.items()
        if k != "attention_mask" or keep_mask
    }


def forward_loss_sum(
    model: nn.Module,
    batch: Batch,
    autocast: Callable[[], contextlib.AbstractContextManager],
    loss_sum: LossSum = next_token_loss_sum,
) -> torch.Tensor:
    """The summed next-token loss of a device-side batch (``to_device``'s)."""
    with autocast():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")
        ).logits
    if MLM_LABELS in batch:
        return masked_loss_sum(logits, batch[MLM_LABELS])
    return loss_sum(logits, batch["labels"])


@dataclass
class StepResult:
    """One step's numbers, left on the device (reading them would wait for the GPU)."""

    loss: torch.Tensor
    """Token-weighted mean loss over the global batch (float64 scalar)."""
    counts: torch.Tensor
    """Global (target tokens, non-pad input tokens, token positions with padding), int64."""
    landed: bool = True
    """Whether the update was applied (``train/step_guard.py`` may skip it)."""


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    *,
    device: torch.device,
    world_size: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
    loss_sum: LossSum = next_token_loss_sum,
    loss_scale: float | None = None,
) -> StepResult:
    """Forward and backward over this rank's micro-batches; leaves the global gradient in .grad.

    Nothing here waits for the GPU: the counts are taken from the host-side batches and
    all-reduced on the device, the loss stays a device tensor, and a right-padded batch reaches
    the model without a mask (``to_device``), so transformers reads nothing back either.
    ``loss_scale`` multiplies this rank's loss and so its gradients: an injected ``nan`` or
    ``spike:X`` (``train/faults.py``); None (every real step) multiplies nothing.
    """
    local = torch.tensor(
        [
            sum(count_targets(b) for b in micro_batches),
            sum(int(b["attention_mask"].sum()) for b in micro_batches),
            sum(b["input_ids"].numel() for b in micro_batches),
        ],
        dtype=torch.int64,
    )
    counts = all_reduce_sum(to_device_async(local, device))
    targets = counts[0].clamp(min=1).double()
    denominator = (targets / world_size).float()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, device)
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_gradient_sync(model):
            loss = forward_loss_sum(model, batch, autocast, loss_sum)
            if loss_scale is not None:
                loss = loss * loss_scale
            (loss / denominator).backward()
        total += loss.detach().double()
    return StepResult(loss=all_reduce_sum(total) / targets, counts=counts)


def grad_norm(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of the gradients, in float32 whatever their dtype (the per-tensor norms of
    ``clip_grad_norm_`` are rounded to bf16 in pure bf16 training). Under FSDP2 each rank sums
    the squares of its shards and the sums are all-reduced (one mesh over all ranks)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    norms = torch._foreach_norm([local(g) for g in grads], 2.0, dtype=torch.float32)
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.linalg.vector_norm(torch.stack(norms))
    return all_reduce_sum(torch.stack(norms).square().sum()).sqrt()


def grad_norm_and_clip(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The global gradient norm (a device tensor); the gradients are scaled down to ``max_norm``
    when it is > 0 (``clip_grads_with_norm_``'s arithmetic, on each rank's shards) and left
    untouched when it is 0 (no multiplication by 1.0)."""
    norm = grad_norm(params)
    if max_norm > 0:
        grads = [local(p.grad) for p in params if p.grad is not None]
        coefficient = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coefficient.to(grads[0].device))
    return norm


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: Iterator[Batch],
    *,
    accumulation: int,
    device: torch.device,
    world_size: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
    grad_clip: float,
    loss_sum: LossSum = next_token_loss_sum,
    loss_scale: float | None = None,
    allows: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
) -> tuple[StepResult, torch.Tensor, dict[str, float]]:
    """One optimizer step: read ``accumulation`` micro-batches, forward/backward, clip, update,
    advance the schedule. Returns the step's numbers and gradient norm, left on the device
    (``train/step_stats.py`` reads them), and the learning rate each param group used.
    ``allows(loss, grad_norm)`` (``train/step_guard.py``), where given, decides whether the
    update and the schedule's advance happen; a skipped step only drops its gradients."""
    micro_batches = [next(loader) for _ in range(accumulation)]
    result = accumulate_gradients(
        model,
        micro_batches,
        device=device,
        world_size=world_size,
        autocast=autocast,
        loss_sum=loss_sum,
        loss_scale=loss_scale,
    )
    norm = grad_norm_and_clip([p for p in model.parameters() if p.requires_grad], grad_clip)
    lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
    result.landed = allows is None or allows(result.loss, norm)
    if result.landed:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(
        set_to_none=not isinstance(model, DistributedDataParallel)
    )  # DDP: keep the bucket views
    return result, norm, lrs
