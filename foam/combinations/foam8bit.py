"""FOAM8bit: FOAM whose (folded) moments are stored block-wise int8 between steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from foam.baselines.quantized import BLOCK, MIN_8BIT_SIZE, bitsandbytes, quantized_bytes
from foam.folding import folded_numel
from foam.numerics import resolve_dtype
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit
from foam.recipes import FOAM_DEFAULTS
from foam.registry import register, two_groups

MOMENTS = {"exp_avg": True, "exp_avg_sq": False}  # state key -> signed code book


class FOAM8bit(FOAM):
    """FOAM whose moment states are stored block-wise int8 between steps.

    Each step dequantises the (folded) states to float32, runs FOAM's update unchanged and
    quantises the new states. The codes live under FOAM's keys (``exp_avg``, ``exp_avg_sq``, now
    uint8) with their float32 scales under ``<key>_absmax``. States smaller than
    ``min_8bit_size`` (norm gains) stay in FOAM's state dtype, following bitsandbytes' rule for
    small tensors.
    """

    float32_states = tuple(f"{key}_absmax" for key in MOMENTS)
    """State keys that are float32 whatever the parameter's dtype (kept so on loading)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        min_8bit_size: int = MIN_8BIT_SIZE,
        **foam_options: Any,
    ) -> None:
        self.functional = bitsandbytes().functional
        self.min_8bit_size = min_8bit_size
        self._code_books: dict[tuple[torch.device, bool], torch.Tensor] = {}
        super().__init__(params, **foam_options)

    def quantizes(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p``'s moments are stored in 8 bits (by the size of one moment state)."""
        return folded_numel(self.plan_for(p, group), p.numel()) >= self.min_8bit_size

    def _uses_fused_adamw(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Quantised states need this class's own step; small ones may use FOAM's fused path."""
        return not self.quantizes(p, group) and super()._uses_fused_adamw(p, group)

    def _uses_fused_step(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Quantised states need this class's own step (the fused kernels read float states)."""
        return not self.quantizes(p, group) and super()._uses_fused_step(p, group)

    def planned_state_bytes(self) -> int:
        """Bytes of moment state once every parameter has stepped (step counters excluded)."""
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                numel = folded_numel(self.plan_for(p, group), p.numel())
                if self.quantizes(p, group):
                    total += 2 * quantized_bytes(numel)
                else:
                    total += 2 * numel * resolve_dtype(group["state_dtype"], p.dtype).itemsize
        return total

    def _code_book(self, device: torch.device, signed: bool) -> torch.Tensor:
        key = (device, signed)
        if key not in self._code_books:
            book = self.functional.create_dynamic_map(signed=signed)
            self._code_books[key] = book.to(device)
        return self._code_books[key]

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        if not self.quantizes(p, group):
            super()._update(p, group)
            return
        state = self.state[p]
        if not state:
            self._init_state(p, group, self.shard_fold_for(p, group))
        for key, signed in MOMENTS.items():
            if state[key].dtype == torch.uint8:
                state[key] = self.functional.dequantize_blockwise(
                    state.pop(key),
                    absmax=state.pop(f"{key}_absmax"),
                    code=self._code_book(p.device, signed),
                    blocksize=BLOCK,
                )
            else:  # fresh zeros
                state[key] = state[key].float()
        super()._update(p, group)
        for key, signed in MOMENTS.items():
            codes, scales = self.functional.quantize_blockwise(
                state[key], code=self._code_book(p.device, signed), blocksize=BLOCK
            )
            state[key], state[f"{key}_absmax"] = codes, scales.absmax


@register("foam8bit", **FOAM_DEFAULTS, min_8bit_size=MIN_8BIT_SIZE)
def _foam8bit(split: ParamSplit, hp: dict[str, Any]) -> FOAM8bit:
    """FOAM-l with 8-bit states; the non-matrix AdamW states are 8-bit too (above the size)."""
    return FOAM8bit(two_groups(split, {}, {"level": None}), **hp)
