"""A fine-tuning run's arguments, typed once: the command line (``train/finetune/cli.py``) parses
into this record and the recipes read only it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FinetuneArgs:
    benchmark: str
    """``glue`` or ``mmlu``."""
    model: str
    """A hub name or a local transformers checkpoint directory."""
    task: str | None = None
    """GLUE's task; ``None`` for MMLU (one task)."""
    data_dir: Path | None = None
    """Local ``SPLIT.jsonl`` files instead of the hub."""
    method: str = "foam"
    lr: float | None = None
    level: int | None = None
    rank: int | None = None
    alpha: float | None = None
    epochs: float = 3.0
    batch_size: int | None = None
    """``None``: the task's paper batch size (GLUE), 16 (MMLU)."""
    max_length: int | None = None
    """``None``: 256 (GLUE), 2048 (MMLU)."""
    max_steps: int | None = None
    max_eval: int | None = None
    shots: int = 5
    seed: int = 42
    out: Path = Path("runs/finetune")
