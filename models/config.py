"""Model size table: the YAML files in ``configs/model/`` are the single source of truth.

The trainer reads them through Hydra (``+model=llama_60m`` puts the file under ``cfg.model``,
typed as :class:`ModelConfig`); scripts and tests that do not run Hydra read the same files with
:func:`load_model_config`, so a size is never defined twice. Every function of this package that
reads a config takes either (:data:`ModelSpec`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING

from .families import family_of


@dataclass
class ModelConfig:
    """A model size, typed: the trainer's ``model`` group (``train/schema.py`` composes it with
    Hydra, so a key it lacks or a value of the wrong type is refused at compose time). The keys
    every family has are required; a family's own keys default to null, and
    :func:`validate_model_config` requires each family's. It lives here, below the trainer, so
    that this package's functions can take it as well as the plain dicts of
    :func:`load_model_config`."""

    name: str = MISSING
    family: str = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    vocab_size: int = MISSING
    max_position_embeddings: int = MISSING
    tie_word_embeddings: bool = MISSING
    initializer_range: float = MISSING
    bos_token_id: int = MISSING
    eos_token_id: int = MISSING
    pad_token_id: int = MISSING
    # LLaMA / Qwen
    num_key_value_heads: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    # GPT-2 / DeBERTa
    layer_norm_eps: float | None = None
    # DeBERTa
    relative_attention: bool | None = None
    pos_att_type: list[str] | None = None
    position_biased_input: bool | None = None
    max_relative_positions: int | None = None
    type_vocab_size: int | None = None
    mask_token_id: int | None = None


ModelSpec = ModelConfig | Mapping[str, Any]
"""A model config as this package's functions take it: typed, or a plain mapping of its keys."""


def model_fields(cfg: ModelSpec) -> Mapping[str, Any]:
    """The keys and values of a model config, whichever form it comes in."""
    return dataclasses.asdict(cfg) if isinstance(cfg, ModelConfig) else cfg


CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "model"
"""``configs/model`` next to this package (the repository root is the parent of ``models/``)."""


def is_masked_lm(cfg: ModelSpec) -> bool:
    """Whether the model is pre-trained with the masked-LM objective (an encoder)."""
    return family_of(model_fields(cfg)).masked_lm


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


def validate_model_config(cfg: ModelSpec) -> None:
    """Fail early, with the key's name, on configs that would build a silently wrong model."""
    cfg = model_fields(cfg)
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


def kv_heads(cfg: ModelSpec) -> int:
    """Key/value heads: the config's (grouped-query attention), else one per attention head."""
    cfg = model_fields(cfg)
    return int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])


def head_dim(cfg: ModelSpec) -> int:
    """Width of one attention head (``hidden / heads`` unless the config sets ``head_dim``)."""
    cfg = model_fields(cfg)
    if cfg.get("head_dim") is not None:
        return int(cfg["head_dim"])
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
