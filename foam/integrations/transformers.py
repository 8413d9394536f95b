"""FOAM (or any optimizer of ``foam.build_optimizer``) inside ``transformers.Trainer``.

``Trainer(optimizers=(optimizer, scheduler))`` is transformers' documented way to train with an
optimizer it does not build itself; the Trainer then steps both, saves their state dicts in every
checkpoint (``optimizer.pt``, ``scheduler.pt``) and loads them on
``trainer.train(resume_from_checkpoint=...)``. :func:`trainer_optimizers` builds that pair::

    optimizers = trainer_optimizers(model, "foam", max_steps=args.max_steps, lr=1e-2, level=2)
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=optimizers)

The matrices the method acts on are chosen as transformers users choose them for GaLore/APOLLO
(``optim_target_modules``): ``target_modules`` names or regexes of ``nn.Linear`` modules
(``foam.param_groups.is_target``); by default the attention and MLP linears, found by structure.
Everything else (embeddings, head, norms) runs plain AdamW at the base lr, as in the paper.
This module needs nothing from transformers at run time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from foam.errors import OptionError
from foam.param_groups import TargetModules
from foam.registry import build_optimizer
from foam.schedule import MIN_LR_RATIO, WARMUP_RATIO, build_scheduler, check_schedule


def trainer_optimizers(
    model: nn.Module,
    name: str = "foam",
    *,
    max_steps: int,
    target_modules: TargetModules | None = None,
    warmup_ratio: float = WARMUP_RATIO,
    min_lr_ratio: float = MIN_LR_RATIO,
    **hparams: Any,
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """``(optimizer, scheduler)`` for ``Trainer(optimizers=...)``.

    ``name`` and ``hparams`` go to ``foam.build_optimizer`` (``foam.available_optimizers()``
    lists them; e.g. ``lr``, ``level``, ``alpha`` for FOAM), so the Trainer's own
    ``learning_rate``/``optim`` arguments are not used. ``max_steps`` is the number of optimizer
    steps the Trainer will run (``TrainingArguments.max_steps``): the paper's schedule warms up
    linearly over ``warmup_ratio`` of them and decays with a cosine to ``min_lr_ratio`` of the
    peak at the last one. Build it after the model is on its training device.
    """
    try:
        check_schedule(max_steps, warmup_ratio, min_lr_ratio)  # before any optimizer state exists
    except OptionError as err:
        if err.key != "max_steps":
            raise
        raise OptionError(
            err.key, f"{err} (set TrainingArguments.max_steps and pass the same value)"
        ) from None
    optimizer = build_optimizer(name, model, target_modules=target_modules, **hparams)
    scheduler = build_scheduler(
        optimizer, max_steps=max_steps, warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio
    )
    return optimizer, scheduler
