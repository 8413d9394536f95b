"""The paper's parameter split: attention/MLP weight matrices vs everything else (embeddings, head,
norms, biases), which every method trains with AdamW at the base lr."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn


@dataclass
class ParamSplit:
    """Trainable parameters by role, each with its qualified name."""

    matrices: list[tuple[str, nn.Parameter]]
    """Weights of the linear maps inside the blocks: attention q/k/v/o, MLP gate/up/down."""
    others: list[tuple[str, nn.Parameter]]
    """Embeddings, the output head, norms and biases: plain AdamW at the base lr."""


def _embedding_weights(model: nn.Module) -> set[int]:
    """Ids of weights that map to or from the vocabulary, tied or not."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if module is not None and getattr(module, "weight", None) is not None:
            ids.add(id(module.weight))
    return ids


def split_params(model: nn.Module) -> ParamSplit:
    """Split by structure, not by a list of names.

    A matrix is the weight of an ``nn.Linear`` that is not an embedding or output head (found
    through ``nn.Embedding`` modules and the ``get_input/output_embeddings`` hooks of
    transformers models). This selects q/k/v/o and gate/up/down in LLaMA and Qwen whatever the
    modules are called.
    """
    vocab = _embedding_weights(model)
    linear = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Linear) and id(m.weight) not in vocab
    }
    split = ParamSplit(matrices=[], others=[])
    for name, p in model.named_parameters():
        if p.requires_grad:
            (split.matrices if id(p) in linear else split.others).append((name, p))
    if not split.matrices:
        raise ValueError(
            f"{type(model).__name__} has no linear weight matrices outside its embeddings: "
            "nothing for a memory-efficient optimizer to act on"
        )
    return split


def check_covers(model: nn.Module, groups: Iterable[dict]) -> None:
    """Every trainable parameter in exactly one group, and nothing else in any group."""
    counts: dict[int, int] = {}
    for group in groups:
        for p in group["params"]:
            counts[id(p)] = counts.get(id(p), 0) + 1
    names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    missing = [n for i, n in names.items() if i not in counts]
    repeated = [names.get(i, "<foreign>") for i, c in counts.items() if c > 1]
    foreign = [i for i in counts if i not in names]
    if missing or repeated or foreign:
        raise ValueError(
            "parameter groups must hold every trainable parameter exactly once: "
            f"missing {missing}, repeated {repeated}, {len(foreign)} not trainable in the model"
        )
