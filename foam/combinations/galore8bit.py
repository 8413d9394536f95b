"""GaLore8bit: GaLore's projection with bitsandbytes' 8-bit AdamW states (the paper's int8 table).

Reference: ``galore_torch.GaLoreAdamW8bit`` (PyPI ``galore-torch`` 1.0), reproduced step for step.
It lives with the combinations because it joins two baselines (GaLore's projection,
``foam.baselines.galore``, and 8-bit states, ``foam.baselines.quantized``), which do not import
each other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from foam.baselines.galore import GaLore
from foam.baselines.quantized import MIN_8BIT_SIZE, bitsandbytes, placement_of
from foam.hparams import signature_defaults
from foam.lowrank import project_back, resolve_rank
from foam.numerics import resolve_dtype
from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups
from foam.shard_blocks import local_shape
from foam.shard_owners import layout_of
from foam.shard_quantized import (
    absmax_zeros,
    check_block_origins,
    kernel_absmax,
    quantized_state_bytes,
)
from foam.sharding import local

MOMENTS = {"exp_avg": True, "exp_avg_sq": False}  # state key -> signed code book


class GaLore8bit(GaLore):
    """GaLore whose Adam moments are bitsandbytes' block-wise 8-bit states, updated by its kernel.

    Per step and 2-d parameter with a ``rank``: the basis is refreshed as in ``GaLore`` (steps 1,
    T+1, ...), the gradient projected, and bitsandbytes' 8-bit Adam kernel
    (``F.optimizer_update_8bit_blockwise``) takes one step of a zero "parameter" of the low-rank
    shape with the group lr and no decay; that step, projected back and times ``alpha``, is added
    to the weight, then the decay ``W -= lr * wd * W``. Exactly what the reference does by swapping
    ``p.data`` (its "suboptimal implementation"), without the swap. Other parameters take the same
    kernel on themselves (bitsandbytes' AdamW8bit, decay before the step), as in the reference,
    so the whole model's states are 8-bit, as the int8 table's 8-bit Adam.

    bitsandbytes' Adam, not GaLore's HF-style one: eps (default 1e-8) on the bias-corrected
    sqrt(v). Moments with fewer than ``min_8bit_size`` values (counted on the low-rank shape) stay
    float32 and take bitsandbytes' 32-bit kernel, as its ``init_state`` decides. States: the codes
    under ``exp_avg`` / ``exp_avg_sq`` (uint8) with their float32 scales under ``<key>_absmax``,
    and GaLore's ``basis`` (``state_dtype``).

    Under FSDP2 the step is GaLore's sharded one with the kernel on each rank's moments, whose
    8-bit blocks must not straddle two ranks (``foam.shard_quantized``, which also lays out the
    scales to shard with the codes; checked when a group is added, refused in one line
    otherwise).
    """

    float32_states = (*MOMENTS, *(f"{key}_absmax" for key in MOMENTS))
    """Float states that are float32 whatever the parameter's dtype (the codes stay uint8)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        eps: float = 1e-8,
        min_8bit_size: int = MIN_8BIT_SIZE,
        **galore_options: Any,
    ) -> None:
        """GaLore's keywords; ``eps`` defaults to bitsandbytes' (and the reference's) 1e-8."""
        self.functional = bitsandbytes().functional
        self.min_8bit_size = min_8bit_size
        self._code_books: dict[tuple[torch.device, bool], torch.Tensor] = {}
        super().__init__(params, eps=eps, **galore_options)

    def moment_numel(self, p: torch.Tensor, group: dict[str, Any]) -> int:
        shape = self.compressed_shape(p, group)
        return p.numel() if shape is None else shape[0] * shape[1]

    def quantizes(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p``'s moments are 8-bit (bitsandbytes' rule, on the moments' shape)."""
        return self.moment_numel(p, group) >= self.min_8bit_size

    def moment_layout(
        self, p: torch.Tensor, group: dict[str, Any]
    ) -> tuple[tuple[int, ...], Shard | Replicate]:
        """``(whole shape, placement)`` of ``p``'s moments: GaLore's layouts for a sharded
        projected matrix, ``p``'s own for an uncompressed one (``Replicate`` when not sharded)."""
        plan = self.plan_for(p, group)
        layout = None if plan is None else layout_of(p)
        if layout is None:
            return tuple(self.compressed_shape(p, group) or p.shape), placement_of(p)
        layouts = {key: (shape, dim) for key, shape, dim in self.state_layouts(plan, layout)}
        shape, dim = layouts["exp_avg"]
        return tuple(shape), Replicate() if dim is None else Shard(dim)

    def validate_group(self, group: dict[str, Any]) -> None:
        """GaLore's checks, and (FSDP2) that no quantisation block of an 8-bit moment straddles
        two ranks' shards: one line naming the parameter if one would."""
        super().validate_group(group)
        names = group.get("param_names", [])
        for index, p in enumerate(group["params"]):
            if isinstance(p, DTensor) and self.quantizes(p, group):
                where = names[index] if names else f"parameter {index} of group {group.get('name')}"
                check_block_origins(p, *self.moment_layout(p, group), "galore8bit", where)

    def planned_state_bytes(self, per_rank: bool = True) -> int:
        """Bytes of moments and bases once every parameter has stepped (step counters excluded),
        on this rank (``per_rank``) or for the whole model; 8-bit moments as ``_init_state``
        allocates them (codes and scales, ``foam.shard_quantized``)."""
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                shape, placement = self.moment_layout(p, group)
                numel = math.prod(local_shape(p, shape, placement) if per_rank else shape)
                if self.quantizes(p, group):
                    total += 2 * quantized_state_bytes(p, shape, placement, per_rank)
                else:
                    total += 2 * 4 * numel
                if self.compressed_shape(p, group) is not None:
                    itemsize = resolve_dtype(group["state_dtype"], p.dtype).itemsize
                    basis = self.planned_param_numel(p, group, per_rank) - 2 * numel
                    total += basis * itemsize
        return total

    def _load_dtype_faithfully(self, state_dict: dict[str, Any]) -> None:
        """The moments' keys hold 8-bit codes or, for small moments, float32 values (listed in
        ``float32_states``, so loaded as float32): the codes go back to uint8, exactly."""
        super()._load_dtype_faithfully(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                if self.state.get(p) and self.quantizes(p, group):
                    for key in MOMENTS:
                        self.state[p][key] = self.state[p][key].to(torch.uint8)

    def _code_book(self, device: torch.device, signed: bool) -> torch.Tensor:
        key = (device, signed)
        if key not in self._code_books:
            self._code_books[key] = self.functional.create_dynamic_map(signed=signed).to(device)
        return self._code_books[key]

    def _init_state(self, p: torch.Tensor, group: dict[str, Any], index: int) -> None:
        """GaLore's states (DTensors in its layouts when ``p`` is sharded), the moments then made
        8-bit codes with their scales, or float32, in the same placement."""
        super()._init_state(p, group, index)
        state = self.state[p]
        for key in MOMENTS:
            if self.quantizes(p, group):
                state[key] = torch.zeros_like(state[key], dtype=torch.uint8)
                state[f"{key}_absmax"] = absmax_zeros(state[key])
            else:
                state[key] = torch.zeros_like(state[key], dtype=torch.float32)

    def _finish(
        self,
        p: torch.Tensor,
        group: dict[str, Any],
        state: dict[str, Any],
        t: int,
        g: torch.Tensor,
        low: torch.Tensor,
        context: Any,
    ) -> None:
        """bitsandbytes' Adam on ``p`` itself (``context`` ``None``: uncompressed), or on a zero
        target of the low-rank shape, projected back, times alpha, then the decay. ``state`` and
        ``low`` are this rank's (GaLore's sharded step: the shard's rows, or the projection
        summed across ranks and its moments replicated)."""
        if context is None:
            self._adam_kernel(local(p.grad), local(p), state, group, t, group["weight_decay"])
            return
        target = torch.zeros(low.shape, dtype=p.dtype, device=low.device)
        self._adam_kernel(low, target, state, group, t, weight_decay=0.0)
        basis = state["basis"].to(g.dtype)
        weight = local(p)
        weight.add_(project_back(target.to(g.dtype), basis, context.side).mul_(group["alpha"]))
        if group["weight_decay"]:
            weight.add_(weight, alpha=-group["lr"] * group["weight_decay"])

    def _adam_kernel(
        self,
        g: torch.Tensor,
        target: torch.Tensor,
        state: dict[str, Any],
        group: dict[str, Any],
        t: int,
        weight_decay: float,
    ) -> None:
        """One step of bitsandbytes' Adam on ``target`` (8-bit or 32-bit states, as stored);
        nothing on a rank whose shard of it is empty."""
        if not target.numel():
            return
        (beta1, beta2), eps, lr = group["betas"], group["eps"], group["lr"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if m.dtype == torch.uint8:
            self.functional.optimizer_update_8bit_blockwise(
                "adam", g, target, m, v, beta1, beta2, 0.0, 0.0, eps, t, lr,
                self._code_book(target.device, True), self._code_book(target.device, False),
                kernel_absmax(state["exp_avg_absmax"], m),
                kernel_absmax(state["exp_avg_sq_absmax"], v), weight_decay,
            )  # fmt: skip
        else:
            self.functional.optimizer_update_32bit(
                "adam", g, target, m, beta1, eps, t, lr, v, beta2, 0.0, 0.0, weight_decay
            )


OPTIONS = ("update_proj_gap", "alpha", "proj_type", "state_dtype")


@register(
    "galore8bit",
    shards=True,
    rank=None,
    rank_fraction=0.25,
    **signature_defaults(GaLore8bit, "eps", "min_8bit_size"),
    **signature_defaults(GaLore, *OPTIONS),
)
def _galore8bit(split: ParamSplit, hp: dict[str, Any]) -> GaLore8bit:
    """GaLore-``rank`` with 8-bit states on the matrices, bitsandbytes' 8-bit AdamW on the rest.

    ``rank`` overrides ``rank_fraction`` (of the hidden size; 0.25 is the paper's GaLore-1/4).
    """
    rank = resolve_rank(split, hp["rank"], hp["rank_fraction"])
    groups = two_groups(split, {"rank": rank}, {"rank": None})
    named = {"matrices": split.matrices, "others": split.others}
    for group in groups:  # the names a refusal under FSDP2 gives
        group["param_names"] = [name for name, _ in named[group["name"]]]
    options = {k: hp[k] for k in (*OPTIONS, "min_8bit_size")}
    return GaLore8bit(groups, **adam_settings(hp), **options)
