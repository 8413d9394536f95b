"""A tiny live run (a linear model, AdamW, a constant schedule, a counting data position) and its
save, for the checkpoint tests that need one in process or in a process they kill."""

from __future__ import annotations

from pathlib import Path

import torch

from train import checkpoint as ckpt
from train.state import TrainState


class Position:
    """A train loader's stand-in: its position is a counter."""

    def __init__(self) -> None:
        self.records = 0

    def state_dict(self) -> dict:
        return {"records": self.records}

    def load_positions(self, positions: list[dict]) -> None:
        self.records = positions[0]["records"]


def live(width: int = 4) -> ckpt.Resumable:
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return ckpt.Resumable(model, optimizer, scheduler, Position())


def save(run_dir: Path, run: ckpt.Resumable, step: int, keep_last: int = 2) -> Path:
    """Save ``run`` at ``step``, its weights all equal to ``step`` (which tells saves apart)."""
    with torch.no_grad():
        run.model.weight.fill_(float(step))
    state = TrainState(step=step, tokens=10 * step)
    return ckpt.save_training_state(run_dir, run, state, rank=0, keep_last=keep_last)
