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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from foam.sharding import local
from train.distributed import all_reduce_sum
from train.objective import MLM_LABELS, count_masked, masked_loss_sum
from train.parallelism import no_gradient_sync

Batch = dict[str, torch.Tensor]


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm stopped being finite: the run stops before anything is saved."""


def next_token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of position t predicting label t+1 (labels are aligned with the
    inputs; -100 marks padding). Computed in float32 like transformers' own loss.

    The labels are shifted (one -100 column appended), not the logits: slicing the logits would
    copy them, and the float32 copy cross-entropy needs (none when they are float32 already) is
    then the only one.
    """
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum"
    )


def count_targets(batch: Batch) -> int:
    """Tokens that contribute to the loss (non-pad next-token targets; a masked-LM batch's
    masked positions, ``train/objective.py``)."""
    if MLM_LABELS in batch:
        return count_masked(batch)
    return int((batch["labels"][:, 1:] != -100).sum())


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` without stalling the host: on CUDA the copy is made from pinned
    memory, so it is queued like a kernel (from pageable memory it may wait for the GPU)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A host-side batch on ``device``. An attention mask without padding is left out:
    transformers would check it on the device (a host sync per forward) only to find that the
    plain causal kernel applies, which it then uses without a mask anyway."""
    return {
        k: to_device_async(v, device)
        for k, v in batch.items()
        if k != "attention_mask" or not bool(v.all())
    }


def forward_loss_sum(
    model: nn.Module, batch: Batch, autocast: Callable[[], contextlib.AbstractContextManager]
) -> torch.Tensor:
    with autocast():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")
        ).logits
    if MLM_LABELS in batch:
        return masked_loss_sum(logits, batch[MLM_LABELS])
    return next_token_loss_sum(logits, batch["labels"])


@dataclass
class StepResult:
    """One step's numbers, left on the device (reading them would wait for the GPU)."""

    loss: torch.Tensor
    """Token-weighted mean loss over the global batch (float64 scalar)."""
    counts: torch.Tensor
    """Global (target tokens, non-pad input tokens, token positions with padding), int64."""


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    *,
    device: torch.device,
    world_size: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> StepResult:
    """Forward and backward over this rank's micro-batches; leaves the global gradient in .grad.

    Nothing here waits for the GPU: the counts are taken from the host-side batches and
    all-reduced on the device, and the loss stays a device tensor.
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
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, device)
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_gradient_sync(model):
            loss = forward_loss_sum(model, batch, autocast)
            (loss / denominator).backward()
        loss_sum += loss.detach().double()
    return StepResult(loss=all_reduce_sum(loss_sum) / targets, counts=counts)


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
) -> tuple[StepResult, torch.Tensor, dict[str, float]]:
    """One optimizer step: read ``accumulation`` micro-batches, forward/backward, clip, update,
    advance the schedule. Returns the step's numbers and gradient norm, left on the device
    (``train/step_stats.py`` reads them), and the learning rate each param group used."""
    micro_batches = [next(loader) for _ in range(accumulation)]
    result = accumulate_gradients(
        model, micro_batches, device=device, world_size=world_size, autocast=autocast
    )
    norm = grad_norm_and_clip([p for p in model.parameters() if p.requires_grad], grad_clip)
    lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(
        set_to_none=not isinstance(model, DistributedDataParallel)
    )  # DDP: keep the bucket views
    return result, norm, lrs
