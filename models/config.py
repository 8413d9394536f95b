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

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "model"
"""``configs/model`` next to this package (the repository root is the parent of ``models/``)."""

FAMILIES = ("llama", "qwen", "gpt2", "deberta")
MASKED_LM_FAMILIES = ("deberta",)
"""Encoders, pre-trained with the masked-LM objective (``train/objective.py``); the others are
causal LMs."""
GATED_MLP_FAMILIES = ("llama", "qwen")
"""Families whose MLP has three matrices (gate, up, down); GPT-2's and DeBERTa's have two."""

COMMON_KEYS = (
    "name",
    "family",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "initializer_range",
)
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "llama": (*COMMON_KEYS, "num_key_value_heads", "rope_theta", "rms_norm_eps"),
    "qwen": (*COMMON_KEYS, "num_key_value_heads", "rope_theta", "rms_norm_eps"),
    "gpt2": (*COMMON_KEYS, "layer_norm_eps"),
    "deberta": (
        *COMMON_KEYS,
        "layer_norm_eps",
        "relative_attention",
        "pos_att_type",
        "position_biased_input",
        "max_relative_positions",
        "type_vocab_size",
        "mask_token_id",
    ),
}
"""Keys every model config of a family must state explicitly (a null counts as absent):
transformers' defaults differ between versions and families (Qwen2Config defaults to vocab
151936, DebertaConfig to absolute positions where DeBERTa-base uses relative attention), so
nothing shape-relevant is left to them."""


def is_masked_lm(cfg: Mapping[str, Any]) -> bool:
    """Whether the model is pre-trained with the masked-LM objective (an encoder)."""
    return cfg["family"] in MASKED_LM_FAMILIES


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
    if cfg.get("family") not in FAMILIES:
        raise ValueError(f"model family must be one of {FAMILIES}, got {cfg.get('family')!r}")
    missing = [k for k in REQUIRED_KEYS[cfg["family"]] if cfg.get(k) is None]
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
