"""``Composite``: one ``torch.optim.Optimizer`` made of several, each owning some of the groups.

Muon only takes matrices, so its runs need AdamW for the rest; the trainer, LR schedulers and
checkpointing must still see a single optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from foam.state import DtypeFaithfulOptimizer, planned_state_numel, run_closure


class Composite(DtypeFaithfulOptimizer):
    """Routes each group to the optimizer that owns it; looks like one optimizer from outside.

    ``param_groups`` are the parts' own group dicts (so an LR scheduler writing ``group["lr"]``
    drives the parts) and ``state`` is one dict shared with every part, so ``state_dict`` and
    ``state_bytes`` see everything with the usual torch layout.
    """

    def __init__(self, parts: Sequence[torch.optim.Optimizer]) -> None:
        if not parts:
            raise ValueError("a Composite needs at least one optimizer")
        self.parts = list(parts)
        self._sealed = False
        super().__init__([g for part in self.parts for g in part.param_groups], {})
        self._sealed = True
        self._share()

    def _share(self) -> None:
        """Point each part at its slice of ``param_groups`` and at the shared ``state``."""
        start = 0
        for part in self.parts:
            count = len(part.param_groups)
            part.param_groups = self.param_groups[start : start + count]
            part.state = self.state
            start += count

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._sealed:
            raise NotImplementedError(
                "add groups to the part optimizer that should own them, then build a new Composite"
            )
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = run_closure(closure)
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Each part clears its own gradients: some keep state there (LDAdamW's error feedback)."""
        for part in self.parts:
            part.zero_grad(set_to_none)

    def planned_state_numel(self, per_rank: bool = True) -> int:
        """The parts' planned state elements (each part's own accounting), on this rank or for
        the whole model (``per_rank``, as ``foam.planned_state_numel``)."""
        return sum(planned_state_numel(part, per_rank) for part in self.parts)

    def grad_state_owners(self) -> list[tuple[DtypeFaithfulOptimizer, dict[str, Any]]]:
        """Each parameter's part decides whether its ``p.grad`` is state (LDAdamW's feedback)."""
        owners = []
        for part in self.parts:
            decides = part if isinstance(part, DtypeFaithfulOptimizer) else self
            owners += [(decides, g) for g in part.param_groups for _ in g["params"]]
        return owners

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()  # torch's loader replaces the group dicts and the state dict
        for part in self.parts:  # the parts' own hook for loaded groups (e.g. options added since)
            part.__setstate__({"state": part.state, "param_groups": part.param_groups})
