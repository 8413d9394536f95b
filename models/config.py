"""Model size table: the YAML files in ``configs/model/`` are the single source of truth.

The trainer reads them through Hydra (``+model=llama_60m`` puts the file under ``cfg.model``);
scripts and tests that do not run Hydra read the same files with :func:`load_model_config`, so a
size is never defined twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .families import family_of

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "model"
"""``configs/model`` next to this package (the repository root is the parent of ``models/``)."""


def is_masked_lm(cfg: Mapping[str, Any]) -> bool:
    """Whether the model is pre-trained with the masked-LM objective (an encoder)."""
    return family_of(cfg).masked_lm


def available_models() -> list[str]:
    """Names accepted by :func:`load_model_config` (the file stems in ``configs/model``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_model_config(name: str) -> dict[str, Any]:
    """Read ``configs/model/<name>.yaml`` into a plain dict (the ``cfg.model`` the trainer sees)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown model config {name!r}; available: {', '.join(available_models())} "
            f"(files in {CONFIG_DIR})"
        )
    with path.open() as f:
        cfg = yaml.safe_load(f)
    validate_model_config(cfg)
    return cfg


def validate_model_config(cfg: Mapping[str, Any]) -> None:
    """Fail early, with the key's name, on configs that would build a silently wrong model."""
    missing = [k for k in family_of(cfg).required_keys if cfg.get(k) is None]
    if missing:
        raise ValueError(f"model config {cfg.get('name', '?')!r} lacks keys: {missing}")
    heads, kv = int(cfg["num_attention_heads"]), kv_heads(cfg)
    if int(cfg["hidden_size"]) % heads:
        raise ValueError(
            f"hidden_size {cfg['hidden_size']} is not divisible by num_attention_heads {heads}"
        )
    if heads % kv:
        raise ValueError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
        )


def kv_heads(cfg: Mapping[str, Any]) -> int:
    """Key/value heads: the config's (grouped-query attention), else one per attention head."""
    return int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])


def head_dim(cfg: Mapping[str, Any]) -> int:
    """Width of one attention head (``hidden / heads`` unless the config sets ``head_dim``)."""
    if cfg.get("head_dim") is not None:
        return int(cfg["head_dim"])
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
