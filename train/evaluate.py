"""Evaluation loss and perplexity: token-weighted over the whole evaluation budget and all ranks.

Here loss = (sum of token losses) / (tokens), both summed over every rank, so the number does
not depend on micro-batch or world size. The GaLore/APOLLO/FOAM harnesses report another figure
(`../shared/ref/benchmark_protocol.md`, "Evaluation"): each rank averages its per-batch mean
losses and divides by (n_batches + 1), and the ranks' results are averaged, which is biased low
by n/(n+1) (about 0.3-3 % in perplexity, depending on batch and world size) and weights every
batch alike. It is logged beside ours as ``*_ppl_paper`` so that a run of this framework can be
laid beside the papers' tables number for number; ours stays the one every reading uses.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection

import torch
from torch import nn

from train.distributed import all_reduce_max, all_reduce_sum, world_size
from train.step import Batch, count_targets, forward_loss_sum, to_device


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Collection[Batch],
    *,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    sharded: bool = False,
    split: str = "val",
) -> dict[str, float]:
    """``{"<split>_loss", "<split>_ppl", "<split>_tokens", "<split>_loss_paper",
    "<split>_ppl_paper"}``; the model is put back in train mode after.

    Under FSDP2 (``sharded``, the run plan's) every forward is a collective, so a rank with fewer
    batches repeats its last one, uncounted, until all ranks have run as many forwards."""
    was_training = model.training
    model.eval()
    # token loss sum, tokens, and the harness's sum of per-batch means and batch count
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    forwards = len(batches)
    if sharded:
        forwards = int(all_reduce_max(torch.tensor(forwards, device=device)).item())
    batch = None
    for batch in batches:
        loss_sum = forward_loss_sum(model, to_device(batch, device), autocast).double()
        targets = count_targets(batch)
        totals[0] += loss_sum
        totals[1] += targets
        if targets:
            totals[2] += loss_sum / targets
            totals[3] += 1
    for _ in range(forwards - len(batches)):
        forward_loss_sum(model, to_device(batch, device), autocast)
    rank_paper_loss = totals[2] / (totals[3] + 1)  # the harness's n + 1, on each rank
    reduced = all_reduce_sum(torch.stack([totals[0], totals[1], rank_paper_loss])).tolist()
    loss_sum, tokens, paper_loss_sum = reduced
    model.train(was_training)
    loss = loss_sum / max(tokens, 1.0)
    paper_loss = paper_loss_sum / world_size()
    return {
        f"{split}_loss": loss,
        f"{split}_ppl": perplexity(loss),
        f"{split}_tokens": int(tokens),
        f"{split}_loss_paper": paper_loss,
        f"{split}_ppl_paper": perplexity(paper_loss),
    }
