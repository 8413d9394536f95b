"""Build LLaMA / Qwen2 / GPT-2 causal LMs and DeBERTa masked LMs from a model config, on any
device (``"meta"`` included)."""

from __future__ import annotations

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

from .config import ModelSpec, model_fields, validate_model_config
from .families import family_of

_OWN_KEYS = ("name", "family", "mask_token_id")
"""Keys of our YAML files that are ours, not transformers config fields (the masked-LM objective
reads ``mask_token_id``: the protocol's T5 vocabulary has no mask token, so DeBERTa's embedding
has one row more for it)."""


def hf_config(cfg: ModelSpec) -> PretrainedConfig:
    """The transformers config for ``cfg``.

    Every key other than ``name``/``family`` is handed to the config class; keys the class does
    not know raise instead of being stored silently (transformers accepts any keyword), so a typo
    like ``num_kv_heads`` cannot fall back to a default shape.
    """
    cfg = model_fields(cfg)
    validate_model_config(cfg)
    family = family_of(cfg)
    config_cls = getattr(transformers, family.config_class)
    renamed = family.renamed
    kwargs = {  # a null is a key of another family (the trainer's schema has them all)
        renamed.get(k, k): v for k, v in cfg.items() if k not in _OWN_KEYS and v is not None
    }
    reference = config_cls()
    unknown = [k for k in kwargs if k != "rope_theta" and not hasattr(reference, k)]
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {unknown} (model {cfg['name']!r})")
    config = config_cls(**kwargs)
    config.architectures = [family.model_class]
    return config


def build_model(
    cfg: ModelSpec,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A freshly initialised ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``GPT2LMHeadModel`` /
    ``DebertaForMaskedLM`` for ``cfg``.

    Init is transformers' own: N(0, ``initializer_range``) for every Linear and Embedding, ones
    for RMSNorm, zero biases, as the protocol's models. ``device="meta"`` allocates nothing: use
    it to count parameters or size optimizer states of 7B models on a laptop, and
    :func:`materialize` it later. Any other device gets :func:`materialize`'s weights, which are
    the same on every device for a given global seed (see there).
    """
    config = hf_config(cfg)
    model_cls = getattr(transformers, family_of(model_fields(cfg)).model_class)
    with torch.device("meta"):
        model = model_cls(config)
    if torch.device(device).type == "meta":
        return model.to(dtype=dtype)
    return materialize(model, device=device, dtype=dtype)


def materialize(
    model: PreTrainedModel,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """Allocate a model built on ``"meta"`` and initialise it, bit for bit, as constructing it on
    the CPU would have: the weights for the current global seed are those of the reference
    scripts (``torch.manual_seed(s); LlamaForCausalLM(config)`` in float32 on the CPU, then
    ``.to(device, dtype=bfloat16)``), whatever ``device`` is. Initialising on the GPU instead
    would draw from the CUDA generator and start every run elsewhere.

    Construction draws, in this order: torch's default init of every module of the base model
    (in registration order), transformers' init of the base model, the default init of the
    head, transformers' init of what is left (the head; tying). This replays that order;
    ``tests/models/test_models.py`` checks it against plain construction for LLaMA and Qwen2.
    GPT-2 and DeBERTa draw in another order there, so their weights follow the same init scheme
    (the same distributions) with other draws than plain construction's, the same on every
    device.
    """
    model.to_empty(device="cpu")
    model.to(dtype=torch.float32)
    with torch.no_grad():
        for module in model.base_model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        model.base_model.init_weights()
        model.get_output_embeddings().reset_parameters()
        model.init_weights()
    return model.to(device=device, dtype=dtype)


def allocate_for_loading(
    model: PreTrainedModel, *, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Allocate a model built on ``"meta"`` (and maybe sharded by FSDP2 since) on ``device`` for a
    checkpoint to fill: its weights are left as allocated, since drawing them would be work thrown
    away (minutes of CPU for a 7B model). Its buffers, which no state dict holds (the rotary
    frequencies), are computed from the config as constructing the model computes them: in
    LLaMA and Qwen2 only the rotary embedding owns buffers, and it is built from the config."""
    model.to_empty(device=device)
    with torch.no_grad():
        for module in model.modules():
            own = dict(module.named_buffers(recurse=False))
            if own:
                fresh = type(module)(model.config)
                for name, buffer in own.items():
                    buffer.copy_(fresh.get_buffer(name))
    return model


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Checkpoint every decoder layer (``torch.utils.checkpoint``, non-reentrant).

    transformers 5.x renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` (the old name warns until v6) and renamed its keyword;
    the trainer calls this so it works with either. Non-reentrant checkpointing is used because
    the reentrant one needs an input that requires grad and drops gradients otherwise, and marks
    DDP's parameters ready twice under ``no_sync`` gradient accumulation.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
