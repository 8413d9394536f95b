"""The fine-tuning tables' methods for ``transformers.Trainer``: Full-Adam, FOAM, GaLore and APOLLO
from this library (``foam.integrations.transformers``), LoRA from ``peft`` with AdamW on its
adapters.

The memory-efficient methods act on the linear maps inside the repeated blocks (attention and
MLP: the paper's "Where: All"); embeddings, norms and the task head run AdamW at the base lr, as
in pre-training. The level and rank defaults are the paper's: FOAM at level 8 (7 for Gemma3-1B,
which the MMLU grid passes), GaLore, APOLLO and LoRA at rank 4 on GLUE and 8 on MMLU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import foam
from foam.integrations.transformers import trainer_optimizers

METHODS = ("adamw", "foam", "galore", "apollo", "lora")
BLOCK_LINEARS = r".*\.(layer|layers|h)\.\d+\..*"
"""Module names inside a model's repeated blocks (RoBERTa's ``encoder.layer.N``, LLaMA's, Qwen's
and Gemma's ``layers.N``, GPT-2's ``h.N``); of those, the linear maps are the matrices."""
LORA_ALPHA = 16  # peft's usual scale for small ranks; the paper does not give LoRA's
DEFAULT_LEVEL = 8
DEFAULT_RANK = {"glue": 4, "mmlu": 8}


@dataclass(frozen=True)
class MethodSetting:
    """A row of the paper's fine-tuning tables: the method and its knobs."""

    method: str
    lr: float
    level: int | None = None
    """FOAM's fold level."""
    rank: int | None = None
    """GaLore's, APOLLO's and LoRA's rank."""
    alpha: float | None = None
    """The matrices' lr scale (FOAM, GaLore, APOLLO); None: the method's default."""

    def hparams(self) -> dict[str, Any]:
        """``foam.build_optimizer``'s keywords for this setting."""
        knobs: dict[str, Any] = {"lr": self.lr}
        if self.method == "foam":
            knobs["level"] = self.level
        if self.method in ("galore", "apollo"):
            knobs["rank"] = self.rank
        if self.alpha is not None and self.method in ("foam", "galore", "apollo"):
            knobs["alpha"] = self.alpha
        return knobs


def with_lora(model: nn.Module, rank: int, task_type: str) -> nn.Module:
    """``model`` with rank-``rank`` LoRA adapters on every linear map but the output layer
    (``peft``'s ``all-linear``); only the adapters (and a classifier head) train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=LORA_ALPHA, target_modules="all-linear", task_type=task_type
    )
    return get_peft_model(model, config)


def prepare(
    model: nn.Module, setting: MethodSetting, *, max_steps: int, task_type: str
) -> tuple[nn.Module, tuple[torch.optim.Optimizer, Any]]:
    """The model to train (LoRA-wrapped for ``lora``) and ``Trainer(optimizers=...)``'s pair,
    with the paper's schedule (10 % warmup, cosine) over ``max_steps``."""
    if setting.method not in METHODS:
        raise ValueError(f"unknown method {setting.method!r}; known: {', '.join(METHODS)}")
    if setting.method == "lora":
        model = with_lora(model, setting.rank, task_type)
        return model, trainer_optimizers(model, "adamw", max_steps=max_steps, lr=setting.lr)
    targets = None if setting.method == "adamw" else BLOCK_LINEARS
    optimizers = trainer_optimizers(
        model, setting.method, max_steps=max_steps, target_modules=targets, **setting.hparams()
    )
    return model, optimizers


def memory_counts(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What the tables' memory column is computed from: every weight (LoRA's adapters
    included), the trainable ones, and the optimizer state the method plans."""
    return {
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "optimizer_state_numel": foam.planned_state_numel(optimizer),
    }
