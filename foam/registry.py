"""``build_optimizer``: any optimizer of the project from a model, with the paper's split.

Each method registers a builder with the keywords it accepts and their defaults (read off its
optimizer's constructor signature); the registry checks names and keywords once, for all of them,
and checks that the groups it built cover every trainable parameter exactly once. The rules of the
values are the optimizers' own: a bad value raises their ``foam.errors.OptionError``, which names
the key; the Adam keywords every method takes are checked here too, since torch's AdamW and Muon
(which some methods are) refuse them without naming one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from foam.composite import Composite
from foam.hparams import signature_defaults, validate_adam_hparams, validate_muon_hparams
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit, TargetModules, check_covers, split_params
from foam.settings import fold_axis_of
from foam.sharding import (
    LayoutCheck,
    check_supported,
    declare_sharded,
    shard_dim,
)

COMMON_DEFAULTS: dict[str, Any] = signature_defaults(FOAM, "lr", "betas", "eps", "weight_decay")
"""The Adam keywords every method takes, with FOAM's defaults (a method may override them)."""

Builder = Callable[[ParamSplit, dict[str, Any]], torch.optim.Optimizer]
FromModel = Callable[[nn.Module], dict[str, Any]]


def _nothing_from_model(model: nn.Module) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Method:
    build: Builder
    defaults: dict[str, Any]
    from_model: FromModel
    """Values of keywords left ``None`` that the method reads off the model (e.g. its config)."""


_METHODS: dict[str, Method] = {}
Layout = Callable[[Mapping[str, Any]], LayoutCheck]
_LAYOUTS: dict[str, Layout] = {}
"""The layout rule of each method that declared one where it registers."""


def register(
    name: str,
    from_model: FromModel = _nothing_from_model,
    shards: bool = False,
    layout: Layout | None = None,
    **defaults: Any,
) -> Callable[[Builder], Builder]:
    """Register ``build(split, hparams)`` under ``name``; ``defaults`` are its extra keywords.

    ``from_model(model)`` gives values for keywords whose setting is ``None`` (not given).
    ``shards`` declares that the method trains FSDP2 (DTensor) parameters exactly, tested against
    its unsharded step; a method that does not is refused on them before any compute. ``layout``
    is the rule, for the method's settings, of the matrix layouts it can step sharded, which
    ``shard_dims`` follows (the method's build refuses the others itself, naming the parameter).
    """

    def decorate(build: Builder) -> Builder:
        if name in _METHODS:
            raise ValueError(f"optimizer {name!r} is registered twice")
        _METHODS[name] = Method(build, {**COMMON_DEFAULTS, **defaults}, from_model)
        if shards:
            declare_sharded(name)
        if layout is not None:
            _LAYOUTS[name] = layout
        return build

    return decorate


def available_optimizers() -> dict[str, dict[str, Any]]:
    """Registered names and the keywords (with defaults) each accepts."""
    return {name: dict(m.defaults) for name, m in sorted(_METHODS.items())}


def check_hparams(name: str, **hparams: Any) -> dict[str, Any]:
    """``name``'s keywords (its defaults, then ``hparams``), checked as far as they can be without
    a model: a registered name, keywords it accepts, and the values of the Adam keywords and alpha
    (:func:`foam.hparams.validate_adam_hparams`) and of Muon's (``validate_muon_hparams``). A
    trainer calls it before reading any data; the rules that need the model (a fold level that
    fits its matrices) are the optimizer class's."""
    method = _METHODS.get(name)
    if method is None:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(_METHODS))}")
    unknown = sorted(set(hparams) - set(method.defaults))
    if unknown:
        raise TypeError(
            f"optimizer {name!r} got unknown keyword(s) {unknown}; "
            f"it accepts {sorted(method.defaults)}"
        )
    settings = {**method.defaults, **hparams}
    settings["betas"] = tuple(settings["betas"])
    validate_adam_hparams(settings)
    if "ns_steps" in settings:  # Muon and FOAM-Muon
        validate_muon_hparams(settings)
    return settings


def shard_dims(name: str, hparams: Mapping[str, Any]) -> Callable[[tuple[int, ...], int], int]:
    """``(shape, ranks) -> dim``: the dim FSDP2 shards each of ``name``'s matrices by with
    ``hparams`` (``foam.sharding.shard_dim`` under the method's layout rule, if it has one): the
    one choice the trainer (``train.parallelism.parallelize``) and the memory estimator make."""
    settings = check_hparams(name, **hparams)
    check_for = _LAYOUTS.get(name)
    accepts = check_for(settings) if check_for is not None else None
    fold_axis = fold_axis_of(settings)
    return lambda shape, ranks: shard_dim(shape, fold_axis, ranks, accepts)


def build_optimizer(
    name: str, model: nn.Module, *, target_modules: TargetModules | None = None, **hparams: Any
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``model``: the method on attention/MLP matrices, AdamW elsewhere.

    ``target_modules`` chooses the method's matrices by module name instead of by structure
    (``foam.param_groups.split_params``)."""
    settings = check_hparams(name, **hparams)
    method = _METHODS[name]
    check_supported(name, model.parameters())  # before any state exists
    for key, value in method.from_model(model).items():
        if settings[key] is None:
            settings[key] = value
    optimizer = method.build(split_params(model, target_modules), settings)
    check_covers(model, optimizer.param_groups)
    return optimizer


def two_groups(
    split: ParamSplit, matrices: dict[str, Any], others: dict[str, Any]
) -> list[dict[str, Any]]:
    """The matrix group and the rest, named for logging; an empty group is left out."""
    groups = [
        {"params": [p for _, p in split.matrices], "name": "matrices", **matrices},
        {"params": [p for _, p in split.others], "name": "others", **others},
    ]
    return [g for g in groups if g["params"]]


def adam_settings(hparams: dict[str, Any]) -> dict[str, Any]:
    """The keywords every Adam-family group takes."""
    return {k: hparams[k] for k in ("lr", "betas", "eps", "weight_decay")}


# How a method whose own class could also update the non-matrix parameters treats them:
# "adamw" (default): the paper's recipe, the same plain AdamW (FOAM's unfolded path, i.e. torch's
# fused AdamW kernel where the device has one, eps 1e-8) as every other method, so that a
# comparison between methods compares what they do to the matrices; "reference": the method's
# own class updates them as its reference package does (e.g. GaLore's HF-style AdamW, eps 1e-6
# on the uncorrected sqrt(v)), which the reference-comparison tests need.
OTHERS_CHOICES = ("adamw", "reference")
OTHERS = {"others": "adamw"}


def kept_by_method(split: ParamSplit, hparams: dict[str, Any]) -> ParamSplit:
    """The parameters a method's own class gets: the matrices, plus the rest when it keeps them."""
    if hparams["others"] not in OTHERS_CHOICES:
        raise ValueError(f"others must be one of {OTHERS_CHOICES}, got {hparams['others']!r}")
    if hparams["others"] == "adamw":
        return ParamSplit(matrices=split.matrices, others=[])
    return split


def method_groups(
    split: ParamSplit, matrices: dict[str, Any], others: dict[str, Any], hparams: dict[str, Any]
) -> list[dict[str, Any]]:
    """``two_groups`` of what the method's own class gets (``kept_by_method``)."""
    return two_groups(kept_by_method(split, hparams), matrices, others)


def with_adamw_for_others(
    split: ParamSplit,
    method: torch.optim.Optimizer,
    hparams: dict[str, Any],
    eps: float | None = None,
) -> torch.optim.Optimizer:
    """``method`` (on the matrices) plus plain AdamW on the rest at the base lr, as one optimizer.

    ``eps`` defaults to the method's own; the methods whose ``eps`` means something else (the
    HF-style eps on the uncorrected sqrt(v) of GaLore, APOLLO and GWT) pass AdamW's 1e-8.
    Nothing is added when the method keeps the rest itself (``others="reference"``).
    """
    if hparams.get("others") == "reference" or not split.others:
        return method
    named = "param_names" in method.param_groups[0]  # torch wants all groups named or none
    params = list(split.others) if named else [p for _, p in split.others]
    rest = [{"params": params, "name": "others", "level": None}]
    settings = {**adam_settings(hparams), "eps": hparams["eps"] if eps is None else eps}
    return Composite([method, FOAM(rest, **settings)])
