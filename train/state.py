"""``TrainState``: the run's counters, the part of a checkpoint that is neither a module nor data."""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where a run stands. Times sum over resumed segments: ``wall_time_s`` is the wall time of
    the earlier segments, and ``wall_time()`` adds the current one (which began at construction)."""

    world_size: int = 1
    """Ranks of the run; the data position is per rank, so a resume must keep it."""
    step: int = 0
    """Optimizer steps completed."""
    tokens: int = 0
    """Non-pad training tokens seen, all ranks."""
    token_slots: int = 0
    """Token positions computed, padding included (what MFU counts), all ranks."""
    train_time_s: float = 0.0
    """Time in training steps (evaluation and checkpointing excluded)."""
    steady_tokens: int = 0
    """``tokens`` without each segment's first interval (kernel builds, compilation, warm-up)."""
    steady_token_slots: int = 0
    steady_time_s: float = 0.0
    wall_time_s: float = 0.0
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    """One ``{step, tokens, val_loss, val_ppl, val_tokens, val_loss_paper, val_ppl_paper}`` per
    evaluation."""
    run_id: str | None = None
    """The logger's run id, so a resumed run continues the same wandb run."""
    skipped_steps: int = 0
    """Steps whose update ``train/step_guard.py`` skipped (their batches were consumed)."""
    skips_in_row: int = 0
    recent: list[list[float]] = field(default_factory=list)
    """[loss, grad norm] of the latest landed steps: the spike rule's window."""

    def __post_init__(self) -> None:
        self._segment_start = time.perf_counter()

    def wall_time(self) -> float:
        return self.wall_time_s + time.perf_counter() - self._segment_start

    def add_interval(self, tokens: int, token_slots: int, seconds: float, *, steady: bool) -> None:
        """Count the tokens and training time of the steps since the last read; ``steady``
        unless they are the first of this segment (a resumed run warms up again)."""
        self.tokens += tokens
        self.token_slots += token_slots
        self.train_time_s += seconds
        if steady:
            self.steady_tokens += tokens
            self.steady_token_slots += token_slots
            self.steady_time_s += seconds

    def record_eval(self, result: dict[str, Any]) -> dict[str, Any]:
        """Add this step's evaluation (``train.evaluate.evaluate``'s ``val_*`` figures) to the
        history (once per step) and return its entry."""
        entry = {"step": self.step, "tokens": self.tokens, **result}
        if not self.eval_history or self.eval_history[-1]["step"] != self.step:
            self.eval_history.append(entry)
        return entry

    def last_eval(self) -> dict[str, Any] | None:
        """This step's evaluation, if it has one."""
        history = self.eval_history
        return history[-1] if history and history[-1]["step"] == self.step else None

    def state_dict(self) -> dict[str, Any]:
        """Plain values (a weights-only checkpoint loads them), wall time up to now included."""
        return {**dataclasses.asdict(self), "wall_time_s": self.wall_time()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from ``saved``; the current segment's clock keeps running from construction.
        A counter ``saved`` lacks (a checkpoint older than it) keeps its default."""
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, copy.deepcopy(saved[f.name]))
