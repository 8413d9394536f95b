"""The pieces of ``foam.lowrank.CompressedAdamW``'s HF-style AdamW step that a sharded (FSDP2)
step of APOLLO or GWT runs on one rank's tensors, between its ``PartialSums`` reductions.

``CompressedAdamW._update`` is the one-process step; these are its arithmetic in the same order,
on local shards (``foam.sharding.local``), so the sharded step ends where it ends.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from foam.numerics import ema_
from foam.sharding import local


def normalized_moments(
    state: dict[str, Any], low: torch.Tensor, group: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m / (sqrt(v) + eps), sqrt(v) + eps)`` after the EMAs of ``low`` (this rank's part)."""
    beta1, beta2 = group["betas"]
    m = ema_(local(state["exp_avg"]), low, beta1, square=False)
    v = ema_(local(state["exp_avg_sq"]), low, beta2, square=True)
    denom = v.sqrt().add_(group["eps"])
    return m / denom, denom


def apply_update(p: torch.Tensor, update: torch.Tensor, group: dict[str, Any], t: int) -> None:
    """``W -= lr sqrt(bc2) / bc1 update``, then the decoupled decay, on this rank's shard."""
    beta1, beta2 = group["betas"]
    shard, lr = local(p), group["lr"]
    shard.add_(update, alpha=-lr * math.sqrt(1 - beta2**t) / (1 - beta1**t))
    if group["weight_decay"]:
        shard.add_(shard, alpha=-lr * group["weight_decay"])
