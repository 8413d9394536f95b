"""Which optimizer updates may land: non-finite steps and loss / gradient-norm spikes.

Two policies, ``trainer.on_nonfinite`` and ``trainer.on_spike``:

* ``on_nonfinite=stop`` (the default): a non-finite loss or gradient norm stops the run with exit
  status 3 before anything after it is evaluated, checkpointed or exported, so the last checkpoint
  is the newest good state. The check is made on the device at every step (``train/step_stats.py``
  keeps the first bad step) and read with the interval's one host sync, so it costs nothing per
  step; the weights in memory after the bad step are thrown away with the process.
* ``on_nonfinite=skip``: such a step's update does not land, nor does the schedule advance: the
  optimizer's state, its step counts and the learning rate are as if the batch had never been
  drawn (the batch itself is consumed, and the step is counted in ``skipped_steps``). After
  ``trainer.max_skips_in_row`` skips in a row the run stops as under ``stop``: a run that cannot
  make one good update in that many batches is not recovering by itself.
* ``on_spike=skip``: also skip an update whose loss or pre-clipping gradient norm lies more than
  ``trainer.spike_sigma`` standard deviations above the mean of the last ``trainer.spike_window``
  updates that landed (OLMo-core's skip-step rule). The defaults, 6 sigma over 128 steps, are
  OLMo-core's: a window that long makes the mean and deviation of a noisy loss stable, and at 6
  sigma a normal step is skipped about once in 10^9, so what is skipped is a real spike. The rule
  waits for a full window, and only values above the mean count: a falling loss is never a spike.

Skipping reads the step's loss and gradient norm on the host before the update (one sync of two
numbers per step): FOAM and torch's AdamW count their steps on the host (their bias corrections
are host scalars), so no device-side flag can leave their step counts as if the update never
happened; torch's ``GradScaler`` makes the same read for every optimizer without a fused kernel.
``stop`` alone needs no such read. The window and the counters live in ``TrainState``, so a
resumed run makes the same decisions as the uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from train.errors import TrainingDiverged
from train.schema import OnNonFinite, OnSpike, TrainerConfig
from train.state import TrainState
from train.summary import DIVERGED_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuardPolicy:
    """The trainer's options of the same names, with their defaults (``train/schema.py``)."""

    on_nonfinite: OnNonFinite = TrainerConfig.on_nonfinite
    on_spike: OnSpike = TrainerConfig.on_spike
    spike_sigma: float = TrainerConfig.spike_sigma
    spike_window: int = TrainerConfig.spike_window
    max_skips_in_row: int = TrainerConfig.max_skips_in_row

    @classmethod
    def of(cls, trainer: TrainerConfig) -> GuardPolicy:
        """The policy a run's ``cfg.trainer`` sets."""
        return cls(
            trainer.on_nonfinite,
            trainer.on_spike,
            trainer.spike_sigma,
            trainer.spike_window,
            trainer.max_skips_in_row,
        )

    @property
    def reads_every_step(self) -> bool:
        """Whether updates are judged before they land (anything but the default)."""
        return self.on_nonfinite == OnNonFinite.skip or self.on_spike == OnSpike.skip


class StepGuard:
    """Judges each update before it lands; its record is ``state``'s ``skipped_steps``,
    ``skips_in_row`` and ``recent`` (the window of landed steps' loss and gradient norm)."""

    def __init__(self, policy: GuardPolicy, state: TrainState) -> None:
        self.policy = policy
        self.state = state

    def allows(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether the update of the step about to land (``state.step + 1``) may; raises
        :class:`TrainingDiverged` when the policy says stop."""
        step = self.state.step + 1
        pair = torch.stack([loss.double(), grad_norm.double().to(loss.device)])
        loss_value, norm_value = pair.tolist()  # the one read: see the module docstring
        reason = self._reason_to_skip(loss_value, norm_value)
        if reason is None:
            self.state.skips_in_row = 0
            self.state.recent = [*self.state.recent, [loss_value, norm_value]][
                -self.policy.spike_window :
            ]
            return True
        nonfinite = not (math.isfinite(loss_value) and math.isfinite(norm_value))
        if nonfinite and self.policy.on_nonfinite == OnNonFinite.stop:
            raise TrainingDiverged(
                f"step {step}: loss {loss_value}, grad norm {norm_value}; stopped before its "
                "update (trainer.on_nonfinite=stop)"
            )
        self.state.skipped_steps += 1
        self.state.skips_in_row += 1
        log.warning(
            "step %d: update skipped (%s); %d in a row, %d in all",
            step,
            reason,
            self.state.skips_in_row,
            self.state.skipped_steps,
        )
        if self.state.skips_in_row > self.policy.max_skips_in_row:
            raise TrainingDiverged(
                f"step {step}: {self.state.skips_in_row} updates in a row skipped ({reason}); "
                f"stopped (trainer.max_skips_in_row={self.policy.max_skips_in_row})"
            )
        return False

    def _reason_to_skip(self, loss: float, grad_norm: float) -> str | None:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return f"loss {loss}, grad norm {grad_norm}"
        if (
            self.policy.on_spike != OnSpike.skip
            or len(self.state.recent) < self.policy.spike_window
        ):
            return None
        for name, value, column in (("loss", loss, 0), ("grad norm", grad_norm, 1)):
            history = [entry[column] for entry in self.state.recent]
            mean, deviation = statistics.fmean(history), statistics.pstdev(history)
            if value > mean + self.policy.spike_sigma * deviation:
                return (
                    f"{name} {value:.4g} beyond {self.policy.spike_sigma:g} sigma of the last "
                    f"{len(history)} ({mean:.4g} +- {deviation:.4g})"
                )
        return None


def repeated(err: TrainingDiverged, run_dir: Path, step: int) -> TrainingDiverged:
    """``err``, saying so where the previous attempt of this run (its ``DIVERGED_FILE``) stopped
    at the same step: a resume is exact, so requeueing the run would only repeat it."""
    try:
        before = json.loads((Path(run_dir) / DIVERGED_FILE).read_text())["stopped_at_step"]
    except (OSError, ValueError, KeyError):
        return err
    if before != step:
        return err
    return TrainingDiverged(
        f"{err}; the previous attempt diverged at this step too, and resuming is exact, so a "
        "requeue repeats it: change the run (a lower lr, trainer.on_nonfinite=skip, "
        "trainer.on_spike=skip) before resuming"
    )
