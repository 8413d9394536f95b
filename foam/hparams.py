"""How the optimizers take, default and check their keyword arguments.

Each optimizer's constructor signature is the one home of its defaults: torch's group defaults
are read off the constructor's arguments (:func:`group_defaults`), and the registry reads the
defaults it offers off the signatures (:func:`signature_defaults`), so no value is written twice.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch

from foam.errors import OptionError
from foam.numerics import resolve_dtype

_NOT_HPARAMS = ("self", "params", "__class__")


def group_defaults(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A constructor's arguments (its ``locals()`` on entry) as torch's param-group defaults."""
    defaults = {k: v for k, v in arguments.items() if k not in _NOT_HPARAMS}
    if "betas" in defaults:
        defaults["betas"] = tuple(defaults["betas"])
    return defaults


def signature_defaults(cls: type, *names: str) -> dict[str, Any]:
    """The defaults of the keywords ``names`` of ``cls``'s constructor (all of them if none)."""
    parameters = inspect.signature(cls).parameters
    names = names or tuple(k for k, v in parameters.items() if v.default is not v.empty)
    return {name: parameters[name].default for name in names}


def validate_adam_hparams(group: Mapping[str, Any]) -> None:
    """The rules of the Adam keywords, for every optimizer that takes them.

    ``lr >= 0`` as in torch (``lr=0`` is a valid frozen step), ``eps >= 0``, ``weight_decay >= 0``
    (each finite: an infinite one turns the first step into NaNs),
    betas in ``[0, 1)``, and a floating ``state_dtype`` where the optimizer has one; ``alpha >= 0``
    where the method has one (the paper's scale of the matrices' step or lr: a negative one would
    train them uphill without a word).
    """
    for key in ("lr", "eps", "weight_decay", *(("alpha",) if "alpha" in group else ())):
        if not 0 <= group[key] < math.inf:
            raise OptionError(key, f"{key} must be >= 0 and finite, got {group[key]!r}")
    betas = group["betas"]
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise OptionError("betas", f"betas must be two numbers in [0, 1), got {betas!r}")
    resolve_dtype(group.get("state_dtype"), torch.float32)


def validate_muon_hparams(group: Mapping[str, Any]) -> None:
    """Muon's keywords, which torch's Muon does not check: ``momentum`` in ``[0, 1)`` (an EMA's
    decay, as Adam's betas) and ``ns_steps`` an int >= 1 (with none the update is not
    orthogonalised, and the step's scale assumes it is)."""
    momentum = group["momentum"]
    if not 0.0 <= momentum < 1.0:
        raise OptionError("momentum", f"momentum must be in [0, 1), got {momentum!r}")
    steps = group["ns_steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise OptionError("ns_steps", f"ns_steps must be an int >= 1, got {steps!r}")
