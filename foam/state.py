"""Optimizer-state bookkeeping: bytes actually held, elements planned, dtype-faithful loading."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from foam.numerics import resolve_dtype
from foam.sharding import local

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


def new_step_counter(device: torch.device | str = "cpu") -> torch.Tensor:
    """A parameter's step counter before its first step: a float32 scalar tensor, as torch's
    optimizers keep it, so checkpoints load into either. On the CPU unless a kernel reads it on
    the parameter's device (torch's fused AdamW does)."""
    return torch.tensor(0.0, device=device)


def count_step(state: dict[str, Any]) -> int:
    """Count one more step in ``state["step"]`` (made by :func:`new_step_counter`) and return
    its number. Read, then written in place: a CPU
    scalar tensor's ``+= 1`` costs several times as much, and a step of many small matrices on a
    GPU is bound by such host work."""
    step = int(state["step"].item()) + 1
    state["step"].fill_(step)
    return step


def run_closure(closure: Callable[[], float] | None) -> float | None:
    """The loss ``closure`` returns, computed with gradients on (``optimizer.step(closure)``'s
    contract); ``None`` without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def state_bytes(optimizer: torch.optim.Optimizer, per_rank: bool = True) -> int:
    """Bytes of persistent optimizer state actually allocated (each tensor counted once).

    With sharded (DTensor, FSDP2) states: this rank's shards (``per_rank``), or the states' whole,
    unsharded sizes; the two agree for plain tensors.
    """
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(list(optimizer.state.values())):
        if id(tensor) not in seen and tensor.device.type != "meta":
            seen.add(id(tensor))
            counted = local(tensor) if per_rank else tensor
            total += counted.numel() * tensor.element_size()
    return total


def projections_computed(optimizer: torch.optim.Optimizer) -> int | None:
    """Most projections any parameter computed (GaLore, APOLLO); ``None`` for other methods."""
    counts = [s["projections"] for s in optimizer.state.values() if "projections" in s]
    return max(counts) if counts else None


def planned_state_numel(optimizer: torch.optim.Optimizer, per_rank: bool = True) -> int:
    """Elements of persistent state the optimizer will hold once every parameter has stepped,
    on this rank (``per_rank``) or for the whole, unsharded model (they differ under FSDP2).

    Step counters are not counted. Works on meta-device parameters (nothing is allocated), which
    is how the memory estimator sizes 7B models.
    """
    own = getattr(optimizer, "planned_state_numel", None)
    if own is not None:
        # Methods that refuse DTensors (foam/sharding.py) hold the same figure either way.
        sharded = "per_rank" in inspect.signature(own).parameters
        return own(per_rank=per_rank) if sharded else own()
    for cls in type(optimizer).__mro__:
        if cls in _FOREIGN_STATE_NUMEL:
            rule = _FOREIGN_STATE_NUMEL[cls]
            params = (p for g in optimizer.param_groups for p in g["params"])
            return sum(rule(local(p) if per_rank else p) for p in params)
    raise TypeError(f"no state accounting for {type(optimizer).__name__}")


class DtypeFaithfulOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose loaded states have the dtypes it would create them in.

    torch casts every floating state tensor to its parameter's dtype on load, which is right for
    states that follow the parameter (so a run saved in fp32 resumes in bf16, and back) but wrong
    for states deliberately kept in another dtype: a group's ``state_dtype`` (float32 moments of
    bf16 parameters) and the keys an optimizer lists in ``float32_states`` (int8 moments' scales).
    The saved tensors are re-read, so no state goes through a lossy intermediate cast. Integer
    states (8-bit codes) and step counters keep their saved dtype.
    """

    float32_states: tuple[str, ...] = ()
    """State keys kept in float32 whatever the parameter's dtype."""

    grad_state_key: str | None = None
    """A state some optimizers keep in ``p.grad`` between steps (LDAdamW's error feedback): saved
    under this key for the parameters :meth:`keeps_grad_state` names, restored into ``p.grad``."""

    def keeps_grad_state(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        return False

    def grad_state_owners(self) -> list[tuple[DtypeFaithfulOptimizer, dict[str, Any]]]:
        """``(optimizer that decides, group)`` for each parameter, in state-dict order."""
        return [(self, g) for g in self.param_groups for _ in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        saved = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        for index, (owner, group) in enumerate(self.grad_state_owners()):
            p = params[index]
            if index in saved["state"] and p.grad is not None and owner.keeps_grad_state(p, group):
                saved["state"][index] = {**saved["state"][index], owner.grad_state_key: p.grad}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        keys = {owner.grad_state_key for owner, _ in self.grad_state_owners()} - {None}
        held = {
            index: {k: v for k, v in entry.items() if k in keys}
            for index, entry in state_dict["state"].items()
        }
        state_dict = {
            **state_dict,
            "state": {
                index: {k: v for k, v in entry.items() if k not in keys}
                for index, entry in state_dict["state"].items()
            },
        }
        self._load_dtype_faithfully(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for param_id, p in zip(saved_ids, params, strict=True):
            for value in held.get(param_id, {}).values():
                p.grad = value.to(device=p.device, dtype=p.dtype, copy=True)

    def _load_dtype_faithfully(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        owners = ((p, g) for g in self.param_groups for p in g["params"])
        id_to_owner = dict(zip(saved_ids, owners, strict=True))
        for param_id, saved in state_dict["state"].items():
            param, group = id_to_owner[param_id]
            for key, value in saved.items():
                if not isinstance(value, torch.Tensor) or key == "step":
                    continue
                dtype = value.dtype
                if key in self.float32_states:
                    dtype = torch.float32
                elif value.is_floating_point():
                    dtype = resolve_dtype(group.get("state_dtype"), param.dtype)
                self.state[param][key] = value.to(device=param.device, dtype=dtype, copy=True)
