"""The optimizers the benchmarks compare, each built exactly as a training run builds it.

A label is an optim config (``configs/optim/NAME.yaml``: its rank, fold level, gaps and the other
paper settings for the model being measured), composed with Hydra and built by the trainer's
``train.config.build_optimizer``; or ``NAME_eager`` for a FOAM config with the readable eager
step (``optim.implementation=eager``); or one of torch's own AdamW kernels, the reference the
fused FOAM step is judged against. Scripts run as ``python scripts/x.py`` import this module
directly (their own directory is on the path), as they do ``methods``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from repro.methods import TABLE2, TABLE3_ONLY
from train.config import CONFIG_DIR, build_optimizer, options
from train.schema import register_configs, resolve_config

Builder = Callable[[torch.nn.Module], torch.optim.Optimizer]

TORCH_ADAMW: dict[str, dict[str, bool]] = {
    "adamw_fused": {"fused": True},
    "adamw_foreach": {"foreach": True},
}
EAGER_SUFFIX = "_eager"
COMBINATIONS = ("foam8bit", "foam_adam_mini", "foam_muon", "gwt")
"""FOAM's combinations with other memory savers, and GWT at its default level."""

DEFAULT_LABELS: tuple[str, ...] = (
    *TORCH_ADAMW,
    *(m.name for m in TABLE2),
    "foam2" + EAGER_SUFFIX,
    *(m.name for m in TABLE3_ONLY),
    *COMBINATIONS,
)
"""Every method of the paper's tables and FOAM's combinations, the eager FOAM-2 beside the fused."""


def _is_foam(config_name: str) -> bool:
    return config_name.startswith("foam") and config_name not in COMBINATIONS


def available_labels() -> list[str]:
    configs = options("optim")
    eager = [name + EAGER_SUFFIX for name in configs if _is_foam(name)]
    return [*TORCH_ADAMW, *configs, *eager]


def _compose_optim(model_name: str, config_name: str, overrides: list[str]) -> dict[str, Any]:
    """The optim config as the trainer resolves it (a plain dict; its lr the paper's)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"+model={model_name}", f"+optim={config_name}", "logger=none", *overrides],
        )
    return resolve_config(cfg).optim


def builder(label: str, model_name: str) -> Builder:
    """How to build ``label``'s optimizer for a ``model_name`` model (a ``configs/model`` name)."""
    if label in TORCH_ADAMW:
        return lambda model: torch.optim.AdamW(model.parameters(), **TORCH_ADAMW[label])
    if label not in available_labels():
        raise SystemExit(f"unknown optimizer {label!r}; available: {' '.join(available_labels())}")
    overrides = []
    if label.endswith(EAGER_SUFFIX):
        label = label.removesuffix(EAGER_SUFFIX)
        overrides = ["optim.implementation=eager"]
    optim = _compose_optim(model_name, label, overrides)
    return lambda model: build_optimizer(optim, model)
