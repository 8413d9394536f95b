"""The trained model as a transformers checkpoint: ``config.json``, safetensors weights and the
tokenizer that trained it, loadable with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` (no project code needed to use the result).

A run exports its final model into ``<run_dir>/hf/`` (``train/pretrain.py``);
``scripts/export_hf.py`` exports any checkpoint of ``train/checkpoint.py``. The project's
SentencePiece tokenizer (``train/data/tokenizer.py``) has T5's layout (pad 0, EOS 1, unk 2, EOS
appended, no BOS), so it is saved as a ``T5Tokenizer`` converted from its model file; a
Hugging Face tokenizer is saved as it is.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase, T5Tokenizer

import models
from train.checkpoint import (
    full_model_state,
    is_complete,
    load_model_weights,
    saved_model_dtype,
)
from train.data.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer, build_tokenizer
from train.schema import data_config, model_config

log = logging.getLogger(__name__)

HF_DIR = "hf"
"""Where a run leaves its exported model, inside its run directory."""
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
T5_LAYOUT = (0, 1, 2)
"""(pad, EOS, unk) ids of a SentencePiece model that converts to a T5Tokenizer unchanged."""


def hf_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerBase:
    """The transformers tokenizer that encodes text as ``tokenizer`` does.

    Unigram segmentations that tie in score may break differently in the ``tokenizers`` library
    than in SentencePiece (runs of one repeated symbol such as ``~~~~``); everything else gives the
    same ids.
    """
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.tok
    if not isinstance(tokenizer, SentencePieceTokenizer):
        raise TypeError(f"cannot export a {type(tokenizer).__name__} tokenizer")
    sp = tokenizer.sp
    layout = (sp.pad_id(), sp.eos_id(), sp.unk_id())
    if layout != T5_LAYOUT:
        raise ValueError(
            f"tokenizer {tokenizer.name} has (pad, eos, unk) ids {layout}; only SentencePiece "
            f"models with T5's layout {T5_LAYOUT} (the project's own) export as a T5Tokenizer"
        )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "spiece.model").write_bytes(sp.serialized_model_proto())
        return T5Tokenizer.from_pretrained(tmp, extra_ids=0)


def export_hf(model: PreTrainedModel, tokenizer: Tokenizer, out_dir: Path) -> Path:
    """Save ``model`` (in its own dtype) and its tokenizer into ``out_dir``; returns it.

    The trainer turns the KV cache off for training; the export turns it back on, for generation.
    A tokenizer that cannot be converted is left out with a warning (the run has finished; its
    model is not lost for that).
    """
    out_dir = Path(out_dir)
    use_cache = model.config.use_cache
    model.config.use_cache = True
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        model.config.use_cache = use_cache
    try:
        hf_tokenizer(tokenizer).save_pretrained(out_dir)
    except (TypeError, ValueError) as err:  # the model is still worth having
        log.warning("exported the model to %s without a tokenizer: %s", out_dir, err)
        return out_dir
    log.info("exported the model as a transformers checkpoint: %s", out_dir)
    return out_dir


def unsharded_model(
    model: PreTrainedModel, model_cfg: models.ModelConfig, *, sharded: bool
) -> PreTrainedModel | None:
    """The model to export at the end of a run: ``model`` itself, or under FSDP2 (``sharded``,
    the run plan's) a whole copy on rank 0 (every rank calls this: the weights are all-gathered)
    and None on the other ranks."""
    if not sharded:
        return model
    weights = full_model_state(model)
    if not weights:
        return None
    whole = models.build_model(model_cfg, dtype=next(iter(weights.values())).dtype)
    whole.load_state_dict(weights)
    return whole


def checkpoint_model(checkpoint: Path) -> tuple[torch.nn.Module, DictConfig]:
    """The model of a checkpoint directory (``<run_dir>/checkpoints/step_N``) in the dtype it was
    trained in, read from the shards of any world size, with its run's resolved ``config.yaml``
    (two levels above) that it was rebuilt from."""
    checkpoint = Path(checkpoint)
    config = checkpoint.parent.parent / "config.yaml"
    if not is_complete(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint directory (none complete there)")
    if not config.is_file():
        raise FileNotFoundError(f"no run config at {config} (the run directory of {checkpoint})")
    cfg = OmegaConf.load(config)
    model = models.build_model(model_config(cfg.model), dtype=saved_model_dtype(checkpoint))
    load_model_weights(checkpoint, model)
    return model, cfg


def export_checkpoint(checkpoint: Path, out_dir: Path, dtype: str | None = None) -> Path:
    """Export a checkpoint directory (``<run_dir>/checkpoints/step_N``) of a run, with the
    tokenizer its config names; ``dtype`` (``bf16`` / ``fp32``) converts the weights, None keeps
    the dtype they were trained in."""
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(EXPORT_DTYPES)}, got {dtype!r}")
    model, cfg = checkpoint_model(checkpoint)
    if dtype is not None:
        model.to(dtype=EXPORT_DTYPES[dtype])
    tokenizer = build_tokenizer(data_config(cfg.data), cfg.model.vocab_size)
    return export_hf(model, tokenizer, out_dir)
