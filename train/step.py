"""One optimizer step: token-weighted loss and gradient over micro-batches and ranks, then the update.

The loss of a step is (sum of next-token losses over the global batch) / (non-pad targets in the
global batch). The global target count is all-reduced *before* the backward passes, and each
micro-batch backpropagates its summed loss divided by that count. DDP averages gradients over
ranks, so each rank's loss is multiplied by the world size to turn the average back into the
global sum (FSDP2's reduce-scatter averages the same way). Gradients are only reduced on the last
micro-batch (``train/parallelism.py``'s ``no_gradient_sync`` elsewhere).
This replaces the references' mean-of-micro-batch-means, which weights short documents more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from train.distributed import all_reduce_sum
from train.parallelism import no_gradient_sync

Batch = dict[str, torch.Tensor]


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm stopped being finite: the run stops before the bad update."""


def next_token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of position t predicting label t+1 (labels are aligned with the
    inputs; -100 marks padding). Computed in float32 like transformers' own loss."""
    shifted = labels[:, 1:].reshape(-1)
    logits = logits[:, :-1].reshape(-1, logits.size(-1)).float()
    return F.cross_entropy(logits, shifted, ignore_index=-100, reduction="sum")


def count_targets(batch: Batch) -> int:
    """Tokens that contribute to the loss (non-pad next-token targets)."""
    return int((batch["labels"][:, 1:] != -100).sum())


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def forward_loss_sum(
    model: nn.Module, batch: Batch, autocast: Callable[[], contextlib.AbstractContextManager]
) -> torch.Tensor:
    with autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return next_token_loss_sum(logits, batch["labels"])


@dataclass
class StepResult:
    loss: float
    """Token-weighted mean loss over the global batch."""
    targets: int
    """Global number of target tokens in the step."""
    tokens: int
    """Global number of non-pad input tokens in the step."""
    token_slots: int
    """Global number of token positions processed (padding included)."""
    grad_norm: float = math.nan
    """Global gradient norm before clipping (``train_step`` only)."""
    lrs: dict[str, float] = field(default_factory=dict)
    """Learning rate of each param group for the update (``train_step`` only)."""
    seconds: float = 0.0
    """Wall time of the step, data included (``train_step`` only)."""


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    *,
    device: torch.device,
    world_size: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> StepResult:
    """Forward and backward over this rank's micro-batches; leaves the global gradient in .grad."""
    counts = torch.tensor(
        [
            sum(count_targets(b) for b in micro_batches),
            sum(int(b["attention_mask"].sum()) for b in micro_batches),
            sum(b["input_ids"].numel() for b in micro_batches),
        ],
        dtype=torch.float64,
        device=device,
    )
    targets, tokens, slots = (int(x) for x in all_reduce_sum(counts).tolist())
    denominator = max(targets, 1) / world_size
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, device)
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_gradient_sync(model):
            loss = forward_loss_sum(model, batch, autocast)
            (loss / denominator).backward()
        loss_sum += loss.detach().double()
    loss_value = all_reduce_sum(loss_sum).item() / max(targets, 1)
    return StepResult(loss=loss_value, targets=targets, tokens=tokens, token_slots=slots)


def grad_norm_and_clip(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """Global L2 norm of the gradients (over all shards under FSDP2); clipped to ``max_norm`` when
    it is > 0."""
    limit = max_norm if max_norm > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


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
    step: int,
) -> StepResult:
    """Optimizer step ``step + 1``: read ``accumulation`` micro-batches, forward/backward, clip,
    update, advance the schedule. Raises ``TrainingDiverged`` before a non-finite update."""
    start = time.perf_counter()
    micro_batches = [next(loader) for _ in range(accumulation)]
    result = accumulate_gradients(
        model, micro_batches, device=device, world_size=world_size, autocast=autocast
    )
    grad_norm = grad_norm_and_clip([p for p in model.parameters() if p.requires_grad], grad_clip)
    if not (math.isfinite(result.loss) and math.isfinite(grad_norm)):
        raise TrainingDiverged(
            f"step {step + 1}: loss {result.loss}, grad norm {grad_norm}; stopped before the "
            "update (nothing of this step was checkpointed)"
        )
    lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return dataclasses.replace(result, grad_norm=grad_norm, lrs=lrs, seconds=seconds)
