"""Parameter and FLOP counts used for logging, MFU and the memory estimate."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers.pytorch_utils import Conv1D

from .config import ModelSpec, head_dim, kv_heads, model_fields
from .families import family_of


@dataclass(frozen=True)
class ParamCounts:
    """Trainable parameters, each tensor counted once (a tied embedding/head is one tensor)."""

    total: int
    folded: int
    """Attention q/k/v/o and MLP gate/up/down weight matrices: what FOAM/GaLore/APOLLO compress."""
    other: int
    """Embeddings, untied lm_head, norms, biases: plain AdamW in every method."""


def count_params(model: nn.Module) -> ParamCounts:
    """Counts by role for a transformers model: ``folded`` are the weights of its linear maps
    (``nn.Linear``, and GPT-2's ``Conv1D``) that do not map to or from the vocabulary: in LLaMA
    and Qwen the decoder layers' q/k/v/o and gate/up/down, in DeBERTa also its MLM head's
    transform.

    The optimizers find the same matrices by structure, without knowing the architecture
    (``foam.split_params``); ``tests/models/test_models.py`` checks that the two agree.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    vocab = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = model.get_output_embeddings()
    if head is not None:
        vocab.add(id(head.weight))
    matrices = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, (nn.Linear, Conv1D)) and id(m.weight) not in vocab
    }
    folded = sum(p.numel() for p in trainable if id(p) in matrices)
    total = sum(p.numel() for p in trainable)
    return ParamCounts(total=total, folded=folded, other=total - folded)


def matmul_params(cfg: ModelSpec) -> int:
    """Parameters that take part in a matmul per token: the block matrices (q, k, v, o and the
    MLP's gate/up/down, or up/down without a gate) and the lm_head.

    The input embedding is a lookup (no FLOPs); norms and biases are elementwise and ignored.
    A tied head is still one V x h matmul per token, so it counts either way. DeBERTa's relative
    position projections act on the position table (not per token) and its MLM head's h x h
    transform is one matrix among a layer's dozen: both are left out.
    """
    cfg = model_fields(cfg)
    h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    layers, vocab = int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    q_width = int(cfg["num_attention_heads"]) * head_dim(cfg)
    kv_width = kv_heads(cfg) * head_dim(cfg)
    attention = h * q_width + 2 * h * kv_width + q_width * h
    mlp = (3 if family_of(cfg).gated_mlp else 2) * h * inter
    return layers * (attention + mlp) + vocab * h


def flops_per_token(cfg: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward), for MFU.

    ``6 * N_matmul + 12 * L * H_q * seq_len`` (PaLM, Chowdhery et al. 2022, Appendix B):
    * ``N_matmul`` = :func:`matmul_params` (2 FLOPs per weight per token forward, 4 backward);
    * per layer, ``Q K^T`` and ``A V`` each cost ``2 * seq_len * H_q`` FLOPs per token forward
      (``H_q`` = heads x head_dim), times 3 for forward + backward = ``12 * H_q * seq_len``.
    The attention term is not halved for the causal mask (the common MFU convention, as PaLM and
    nanoGPT), and gradient-checkpointing recomputation is not counted (MFU, not HFU).
    """
    cfg = model_fields(cfg)
    q_width = int(cfg["num_attention_heads"]) * head_dim(cfg)
    layers = int(cfg["num_hidden_layers"])
    return 6 * matmul_params(cfg) + 12 * layers * q_width * int(seq_len)
