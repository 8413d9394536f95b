"""What a model family is, one record each: its transformers classes, the keys its configs must
state, the keys it names differently, its objective and its MLP's shape. Adding a family is one
record here and its YAML files in ``configs/model/``.

The classes are named, not imported, so that reading and validating a config (the memory
estimator, the sweep planner) does not import transformers' model code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
"""Keys every family's config states."""


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str
    """The transformers config class (a name in ``transformers``)."""
    model_class: str
    """The transformers model class built for pre-training."""
    own_keys: tuple[str, ...]
    """Keys beyond :data:`COMMON_KEYS` its configs must state explicitly (a null counts as
    absent): transformers' defaults differ between versions and families (Qwen2Config defaults
    to vocab 151936, DebertaConfig to absolute positions where DeBERTa-base uses relative
    attention), so nothing shape-relevant is left to them."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    """Our common key -> the family's transformers field, where the config class does not map it
    itself (GPT2Config maps ``hidden_size``, ``num_hidden_layers``, ... through its
    ``attribute_map``)."""
    masked_lm: bool = False
    """An encoder, pre-trained with the masked-LM objective (``train/objective.py``); the others
    are causal LMs."""
    gated_mlp: bool = False
    """Its MLP has three matrices (gate, up, down); otherwise two (up, down)."""

    @property
    def required_keys(self) -> tuple[str, ...]:
        return (*COMMON_KEYS, *self.own_keys)


_DECODER_KEYS = ("num_key_value_heads", "rope_theta", "rms_norm_eps")

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("llama", "LlamaConfig", "LlamaForCausalLM", _DECODER_KEYS, gated_mlp=True),
        Family("qwen", "Qwen2Config", "Qwen2ForCausalLM", _DECODER_KEYS, gated_mlp=True),
        Family(
            "gpt2",
            "GPT2Config",
            "GPT2LMHeadModel",
            ("layer_norm_eps",),
            renamed={"intermediate_size": "n_inner", "layer_norm_eps": "layer_norm_epsilon"},
        ),
        Family(
            "deberta",
            "DebertaConfig",
            "DebertaForMaskedLM",
            (
                "layer_norm_eps",
                "relative_attention",
                "pos_att_type",
                "position_biased_input",
                "max_relative_positions",
                "type_vocab_size",
                "mask_token_id",
            ),
            masked_lm=True,
        ),
    )
}


def family_of(cfg: Mapping[str, Any]) -> Family:
    """The family record of model config ``cfg``, or a one-line error naming the known ones."""
    family = FAMILIES.get(cfg.get("family"))
    if family is None:
        raise ValueError(
            f"model family must be one of {tuple(FAMILIES)}, got {cfg.get('family')!r}"
        )
    return family
