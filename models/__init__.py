"""LLaMA, Qwen2, GPT-2 and DeBERTa models for pre-training, built on transformers from ``configs/model/*.yaml``.

Public API: :class:`ModelConfig` (the typed config; every function here also takes a plain
mapping, :data:`ModelSpec`), :func:`load_model_config`, :func:`build_model`, :func:`count_params`
(:class:`ParamCounts`), :func:`flops_per_token`, :func:`available_models`,
:func:`enable_gradient_checkpointing`, :func:`materialize`, :func:`allocate_for_loading`,
:func:`validate_model_config`, :func:`is_masked_lm`.
"""

from .build import (
    allocate_for_loading,
    build_model,
    enable_gradient_checkpointing,
    hf_config,
    materialize,
)
from .config import (
    CONFIG_DIR,
    ModelConfig,
    ModelSpec,
    available_models,
    head_dim,
    is_masked_lm,
    load_model_config,
    model_fields,
    validate_model_config,
)
from .counting import ParamCounts, count_params, flops_per_token, matmul_params

__all__ = [
    "CONFIG_DIR",
    "ModelConfig",
    "ModelSpec",
    "ParamCounts",
    "allocate_for_loading",
    "available_models",
    "build_model",
    "count_params",
    "enable_gradient_checkpointing",
    "flops_per_token",
    "head_dim",
    "hf_config",
    "is_masked_lm",
    "load_model_config",
    "materialize",
    "matmul_params",
    "model_fields",
    "validate_model_config",
]
