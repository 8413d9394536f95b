"""Muon (the Moonlight variant the paper cites): torch's Muon on the matrices, AdamW elsewhere.

Muon orthogonalises a Nesterov momentum with five Newton-Schulz steps and scales the result to
AdamW's update RMS (``0.2 * sqrt(max(A, B))``, torch's ``adjust_lr_fn="match_rms_adamw"``), so the
lr and weight decay tuned for AdamW carry over. It takes matrices only; everything else gets plain
AdamW (``FOAM`` with ``level=None``), inside one ``Composite`` optimizer.

Under FSDP2 (DTensor shards) the step is torch's, split where its data lives: the momentum on
each rank's shard (elementwise), Newton-Schulz on the whole matrix at its owner
(``foam.shard_owners``: one ``all_to_all`` to the owners and one back per step, in bf16, the
dtype torch's Newton-Schulz computes in), the scale from the global shape, the update on the
shard. So a sharded step equals the unsharded one bit for bit, and the momentum stays sharded
with the weight (DCP reshards it).

``alpha`` is the paper's module-wise lr: the matrix group runs at ``lr * alpha`` (decay included,
as torch's Muon applies ``lr * weight_decay`` with the group lr). The paper runs Muon without an
alpha, hence the default 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import _muon as torch_muon

from foam.hparams import signature_defaults
from foam.param_groups import ParamSplit
from foam.registry import register, with_adamw_for_others
from foam.shard_owners import Owners, layout_of
from foam.sharding import local
from foam.state import run_closure

MATCH_RMS = "match_rms_adamw"  # Moonlight's scale; lets Muon reuse AdamW's lr and decay
SETTINGS = ("lr", "weight_decay", "momentum", "nesterov", "ns_steps")
"""The keywords Muon and its folded variant (``foam_muon``) share."""
MUON_OPTIONS: dict[str, Any] = {
    "alpha": 1.0,
    **signature_defaults(torch.optim.Muon, "momentum", "nesterov", "ns_steps"),
}


NS_DTYPE = torch.bfloat16
"""The dtype torch's Newton-Schulz casts its input to and returns: sending the momentum to its
owner and the update back in it changes no bit."""


class Muon(torch.optim.Muon):
    """torch's Muon (same keywords, same step), which also steps DTensor (FSDP2) shards exactly.

    ``momentum(p, group)`` is this rank's part of the matrix handed to Newton-Schulz (a subclass
    changes how it is kept); ``step`` orthogonalises every matrix once, then applies it.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = run_closure(closure)
        todo = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        for p, _ in todo:
            if p.grad.is_sparse:
                raise RuntimeError("Muon does not support sparse gradients")
        momenta = [self.momentum(p, group) for p, group in todo]
        updates = orthogonalize([p for p, _ in todo], momenta, [g for _, g in todo])
        for (p, group), update in zip(todo, updates, strict=True):
            lr = group["lr"]
            weight = local(p)
            weight.mul_(1 - lr * group["weight_decay"])
            weight.add_(update, alpha=-torch_muon._adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss

    def momentum(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """torch's Nesterov momentum on this rank's part of ``p`` (elementwise, so local)."""
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)  # a DTensor like p.grad's
        grad = local(p.grad)
        buf = local(state["momentum_buffer"])
        buf.lerp_(grad, 1 - group["momentum"])
        return grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf


def newton_schulz(momentum: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
    return torch_muon._zeropower_via_newtonschulz(
        momentum, group["ns_coefficients"], group["ns_steps"], group["eps"]
    )


def orthogonalize(
    params: list[torch.Tensor], momenta: list[torch.Tensor], groups: list[dict[str, Any]]
) -> list[torch.Tensor]:
    """Newton-Schulz of each whole momentum matrix, as this rank's part of it: computed here for
    the matrices this rank holds whole, by the owners for the sharded ones."""
    updates: list[torch.Tensor | None] = [
        None if layout_of(p) else newton_schulz(m, g)
        for p, m, g in zip(params, momenta, groups, strict=True)
    ]
    sharded = [i for i, u in enumerate(updates) if u is None]
    if not sharded:
        return updates  # type: ignore[return-value]
    mesh = params[sharded[0]].device_mesh
    if any(params[i].device_mesh != mesh for i in sharded):  # type: ignore[union-attr]
        raise ValueError("Muon's sharded matrices must share one device mesh")
    layouts = [layout_of(params[i]) for i in sharded]
    owners = Owners(layouts, mesh.get_group())  # type: ignore[union-attr]
    wholes = owners.gather([momenta[i] for i in sharded], NS_DTYPE)
    results = {j: newton_schulz(whole, groups[sharded[j]]) for j, whole in wholes.items()}
    pieces = owners.scatter(results, layouts, NS_DTYPE, momenta[sharded[0]].device)
    for i, piece in zip(sharded, pieces, strict=True):
        updates[i] = piece
    return updates  # type: ignore[return-value]


def matrix_group(split: ParamSplit, hp: dict[str, Any]) -> list[dict[str, Any]]:
    """The matrices as one group at ``lr * alpha``."""
    return [
        {"params": [p for _, p in split.matrices], "name": "matrices", "lr": hp["lr"] * hp["alpha"]}
    ]


@register("muon", shards=True, **MUON_OPTIONS)
def _muon(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch's Muon (Moonlight scale) on the matrices, AdamW on the rest at the base lr."""
    settings = {k: hp[k] for k in SETTINGS}
    matrices = Muon(matrix_group(split, hp), **settings, adjust_lr_fn=MATCH_RMS)
    return with_adamw_for_others(split, matrices, hp)
