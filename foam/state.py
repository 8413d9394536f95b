"""Optimizer-state bookkeeping: bytes actually held, elements planned, dtype-faithful loading."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

# Planned state elements per parameter for optimizers we do not own (ours define
# ``planned_state_numel()`` themselves, from the same shapes that size their states).
_FOREIGN_STATE_NUMEL: dict[type, Callable[[torch.Tensor], int]] = {
    torch.optim.AdamW: lambda p: 2 * p.numel(),
    torch.optim.Adam: lambda p: 2 * p.numel(),
    torch.optim.Muon: lambda p: p.numel(),
}


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    else:  # optimizers that keep helper objects in their state (e.g. a projector)
        yield from _tensors(getattr(value, "__dict__", {}))


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of persistent optimizer state actually allocated (each tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(list(optimizer.state.values())):
        if id(tensor) not in seen and tensor.device.type != "meta":
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def projections_computed(optimizer: torch.optim.Optimizer) -> int | None:
    """Most projections any parameter computed (GaLore, APOLLO); ``None`` for other methods."""
    counts = [s["projections"] for s in optimizer.state.values() if "projections" in s]
    return max(counts) if counts else None


def planned_state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Elements of persistent state the optimizer will hold once every parameter has stepped.

    Step counters are not counted. Works on meta-device parameters (nothing is allocated), which
    is how the memory estimator sizes 7B models.
    """
    own = getattr(optimizer, "planned_state_numel", None)
    if own is not None:
        return own()
    for cls in type(optimizer).__mro__:
        if cls in _FOREIGN_STATE_NUMEL:
            rule = _FOREIGN_STATE_NUMEL[cls]
            return sum(rule(p) for g in optimizer.param_groups for p in g["params"])
    raise TypeError(f"no state accounting for {type(optimizer).__name__}")


def load_state_dict_keeping_dtypes(
    optimizer: torch.optim.Optimizer,
    load: Callable[[dict[str, Any]], None],
    state_dict: dict[str, Any],
) -> None:
    """Load with ``load`` (torch's loader), then restore each state tensor's saved dtype.

    torch casts every floating state tensor to its parameter's dtype on load. That is wrong for
    states deliberately kept in another dtype (float32 moments of bf16 parameters, int8
    quantised moments' float scales), and the cast is lossy, so the saved tensors are re-read.
    """
    load(state_dict)
    saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
    params = itertools.chain.from_iterable(g["params"] for g in optimizer.param_groups)
    id_to_param = dict(zip(saved_ids, params, strict=True))
    for param_id, saved in state_dict["state"].items():
        param = id_to_param[param_id]
        for key, value in saved.items():
            if isinstance(value, torch.Tensor) and key != "step":
                optimizer.state[param][key] = value.to(device=param.device, copy=True)
