"""The trainer's learning-rate schedule is the optimizer library's (``foam/schedule.py``), so the
trainer and ``transformers.Trainer`` users get the same warmup-cosine."""

from foam.schedule import build_scheduler, lr_multiplier, multiplier_fn, warmup_steps

__all__ = ["build_scheduler", "lr_multiplier", "multiplier_fn", "warmup_steps"]
