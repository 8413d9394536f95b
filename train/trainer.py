"""One optimizer step's worth of forward/backward: token-weighted loss over micro-batches and ranks.

The loss of a step is (sum of next-token losses over the global batch) / (non-pad targets in the
global batch). The global target count is all-reduced *before* the backward passes, and each
micro-batch backpropagates its summed loss divided by that count. DDP averages gradients over
ranks, so each rank's loss is multiplied by the world size to turn the average back into the
global sum. Gradients are only all-reduced on the last micro-batch (``no_sync`` elsewhere).
This replaces the references' mean-of-micro-batch-means, which weights short documents more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from train.distributed import all_reduce_sum

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
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, device)
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else no_sync():
            loss = forward_loss_sum(model, batch, autocast)
            (loss / denominator).backward()
        loss_sum += loss.detach().double()
    loss_value = all_reduce_sum(loss_sum).item() / max(targets, 1)
    return StepResult(loss=loss_value, targets=targets, tokens=tokens, token_slots=slots)


def grad_norm_and_clip(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """Global L2 norm of the gradients; clipped to ``max_norm`` when it is > 0."""
    limit = max_norm if max_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit, foreach=True))
