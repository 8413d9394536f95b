"""The paper's learning-rate schedule: linear warmup then cosine decay, per optimizer step.

One home for the trainer (``train/pretrain.py``) and for ``transformers.Trainer`` users
(``foam/integrations/transformers.py``); the paper's defaults are 10 % warmup and a cosine down
to 10 % of the peak.

The reference harnesses (GaLore/APOLLO/FOAM) start the warmup at a multiplier of exactly 0, so their
first update runs at lr 0, and they run N+1 updates. Here the k-th optimizer step (k = 0 .. N-1)
uses ``(k + 1) / warmup`` during warmup, so the first update already moves the weights, the peak
is reached on the last warmup step, and the cosine ends exactly at ``min_lr_ratio`` on step N-1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from foam.errors import OptionError


def warmup_steps(max_steps: int, warmup_ratio: float) -> int:
    """Number of warmup steps: ``round(ratio * max_steps)``, kept below ``max_steps``."""
    return min(max(round(warmup_ratio * max_steps), 0), max_steps - 1)


def lr_multiplier(step: int, *, max_steps: int, warmup: int, min_lr_ratio: float) -> float:
    """The factor applied to the peak lr for optimizer step ``step`` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    decay_steps = max(max_steps - warmup, 1)
    progress = min((step - warmup + 1) / decay_steps, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def multiplier_fn(
    max_steps: int, warmup_ratio: float, min_lr_ratio: float
) -> Callable[[int], float]:
    """``lr_multiplier`` bound to one run's settings (a plain function: LambdaLR then leaves it
    out of its state dict, so a checkpoint holds only numbers)."""
    warmup = warmup_steps(max_steps, warmup_ratio)

    def fn(step: int) -> float:
        return lr_multiplier(step, max_steps=max_steps, warmup=warmup, min_lr_ratio=min_lr_ratio)

    return fn


WARMUP_RATIO = 0.1
MIN_LR_RATIO = 0.1


def check_schedule(max_steps: int, warmup_ratio: float, min_lr_ratio: float) -> None:
    """The schedule's rules: a positive int of steps, a warmup shorter than the run, and a floor
    between 0 and the peak (outside them the multiplier goes negative or above 1 without a word)."""
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps <= 0:
        raise OptionError(
            "max_steps",
            f"max_steps must be a positive number of optimizer steps, got {max_steps!r}",
        )
    if not 0.0 <= warmup_ratio < 1.0:
        raise OptionError("warmup_ratio", f"warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise OptionError("min_lr_ratio", f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    max_steps: int,
    warmup_ratio: float = WARMUP_RATIO,
    min_lr_ratio: float = MIN_LR_RATIO,
) -> LambdaLR:
    """A LambdaLR stepped once per optimizer step; every param group follows the same shape
    relative to its own peak lr (so a group at ``lr * alpha`` keeps that ratio)."""
    check_schedule(max_steps, warmup_ratio, min_lr_ratio)
    return LambdaLR(optimizer, multiplier_fn(max_steps, warmup_ratio, min_lr_ratio))
