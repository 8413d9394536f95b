"""Validation loss and perplexity: token-weighted over the whole validation budget and all ranks.

The GaLore/APOLLO/FOAM harnesses average per-batch means and divide by (n_batches + 1), which
reports a loss biased low by n/(n+1) (about 0.3-3 % in perplexity, depending on batch and world
size). Here loss = (sum of token losses) / (tokens),
both summed over every rank, so the number does not depend on micro-batch or world size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from train.distributed import all_reduce_sum
from train.step import Batch, count_targets, forward_loss_sum, to_device


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> dict[str, float]:
    """``{"val_loss", "val_ppl", "val_tokens"}``; the model is put back in train mode after."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        totals[0] += forward_loss_sum(model, to_device(batch, device), autocast).double()
        totals[1] += count_targets(batch)
    loss_sum, tokens = all_reduce_sum(totals).tolist()
    model.train(was_training)
    loss = loss_sum / max(tokens, 1.0)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 700.0)), "val_tokens": int(tokens)}
