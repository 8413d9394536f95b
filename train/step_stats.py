"""The training step's numbers, kept on the device and read once per logging interval.

Reading a GPU value on the host (``.item()``, ``float()``, ``.tolist()``) waits for every kernel
queued before it, which empties the queue in front of the optimizer's many small launches. The
trainer therefore hands each step's loss, gradient norm and token counts to :class:`StepStats`
as device tensors and reads them all at once, with one synchronisation, when it logs, evaluates
or saves.

The tradeoff, for divergence: a non-finite loss or gradient norm is noticed at that read, not at
the step it happened. The steps in between still update the weights in memory (with garbage), but
the run stops with :class:`~train.errors.TrainingDiverged` naming the first bad step *before*
any evaluation or checkpoint of those weights, because the trainer reads the stats before every
save and every evaluation. The cost is at most ``trainer.log_every - 1`` wasted steps; the last
checkpoint stays the newest good state to resume from. Skipping such steps instead, and loss
spikes, is ``train/step_guard.py``'s (``trainer.on_nonfinite``, ``trainer.on_spike``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from train.errors import TrainingDiverged
from train.step import StepResult


@dataclass(frozen=True)
class IntervalStats:
    """What happened since the previous read."""

    steps: int
    seconds: float
    """Wall time of those steps, the GPU's work included (the read waits for it)."""
    loss: float
    """Loss of the newest step."""
    grad_norm: float
    """Gradient norm of the newest step."""
    targets: int
    tokens: int
    token_slots: int
    """Sums over the interval's steps, all ranks."""


class StepStats:
    """Accumulates steps on the device; :meth:`read` is the interval's only host sync."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._newest = torch.zeros(2, dtype=torch.float64, device=device)
        """The newest *landed* step's loss and norm: kept across reads, so an interval whose
        every update was skipped logs the last one that landed."""
        self._reset()

    def _reset(self) -> None:
        self._counts = torch.zeros(3, dtype=torch.int64, device=self.device)
        self._first_bad = torch.full((3,), -1.0, dtype=torch.float64, device=self.device)
        self._steps = 0
        self.restart_clock()

    def restart_clock(self) -> None:
        """Start timing here (after an evaluation or a save, which are not training time)."""
        self._start = time.perf_counter()

    def add(self, step: int, result: StepResult, grad_norm: torch.Tensor) -> None:
        """Record optimizer step ``step`` (1-based) without waiting for the GPU. A step whose
        update was skipped (``result.landed`` false, ``train/step_guard.py``) counts its tokens
        only: its loss is neither the newest nor a divergence."""
        self._counts += result.counts
        self._steps += 1
        if not result.landed:
            return
        newest = torch.stack([result.loss.double(), grad_norm.to(self.device).double()])
        bad = newest.isfinite().logical_not().any() & (self._first_bad[0] < 0)
        at = torch.full((1,), float(step), dtype=torch.float64, device=self.device)  # no copy
        step_and_values = torch.cat([at, newest])
        self._first_bad = torch.where(bad, step_and_values, self._first_bad)
        self._newest = newest

    def read(self) -> IntervalStats:
        """Wait for the queued steps, return their numbers and start a new interval.

        Raises :class:`TrainingDiverged` when a step of the interval had a non-finite loss or
        gradient norm (the first such step is named).
        """
        packed = torch.cat([self._counts.double(), self._newest, self._first_bad]).tolist()
        seconds = time.perf_counter() - self._start
        steps = self._steps
        self._reset()
        targets, tokens, slots, loss, norm, bad_step, bad_loss, bad_norm = packed
        if bad_step >= 0:
            raise TrainingDiverged(
                f"step {int(bad_step)}: loss {bad_loss}, grad norm {bad_norm}; stopped before "
                "anything after it was evaluated or checkpointed"
            )
        return IntervalStats(
            steps=steps,
            seconds=seconds,
            loss=loss,
            grad_norm=norm,
            targets=int(targets),
            tokens=int(tokens),
            token_slots=int(slots),
        )
