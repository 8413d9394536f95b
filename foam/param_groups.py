"""The paper's parameter split: attention/MLP weight matrices vs everything else (embeddings, head,
norms, biases), which every method trains with AdamW at the base lr."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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


def is_linear_map(module: nn.Module) -> bool:
    """An ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, a linear map whose
    weight is stored in x out). foam imports only torch, so the latter is known by its class name
    and its 2-D weight; every method here reads a matrix by its shape alone."""
    if isinstance(module, nn.Linear):
        return True
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D" and isinstance(weight, nn.Parameter) and weight.dim() == 2
    )


TargetModules = str | Sequence[str]
"""Module names as transformers' ``optim_target_modules`` takes them (see :func:`is_target`)."""


def is_target(target_modules: TargetModules, module_name: str) -> bool:
    """Whether ``module_name`` is selected, with the rules of transformers' ``optim_target_modules``
    (``transformers.trainer_utils.check_target_module_exists``): a single string is a regex the
    whole name must match; a list selects a name equal to, containing, or fully matching (as a
    regex) any of its entries."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module_name) is not None
    return any(t in module_name or re.fullmatch(t, module_name) for t in target_modules)


def split_params(model: nn.Module, target_modules: TargetModules | None = None) -> ParamSplit:
    r"""Split by structure, or by module names when ``target_modules`` is given.

    By default a matrix is the weight of a linear map (:func:`is_linear_map`) that is not an
    embedding or output head (found through ``nn.Embedding`` modules and the
    ``get_input/output_embeddings`` hooks of transformers models). This selects q/k/v/o and gate/up/down in LLaMA and Qwen whatever the
    modules are called. With ``target_modules`` (e.g. ``[r".*\.self_attn\..*", "mlp"]``) the
    matrices are the weights of the linear maps whose qualified name it selects
    (:func:`is_target`), as with GaLore/APOLLO in ``transformers.Trainer``.
    """
    if target_modules is None:
        vocab = _embedding_weights(model)
        linear = {
            id(m.weight) for m in model.modules() if is_linear_map(m) and id(m.weight) not in vocab
        }
    else:
        linear = {
            id(m.weight)
            for name, m in model.named_modules()
            if is_linear_map(m) and is_target(target_modules, name)
        }
        if not linear:
            raise ValueError(
                f"target_modules {target_modules!r} selects no nn.Linear module of "
                f"{type(model).__name__}; its linear modules are named like "
                f"{[n for n, m in model.named_modules() if isinstance(m, nn.Linear)][:4]}"
            )
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
