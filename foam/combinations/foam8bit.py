"""FOAM8bit: FOAM whose (folded) moments are stored block-wise int8 between steps."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard

from foam.baselines.quantized import MIN_8BIT_SIZE, bitsandbytes, placement_of
from foam.folding import FoldSettings, folded_numel, make_plan
from foam.numerics import resolve_dtype
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit
from foam.recipes import FOAM_DEFAULTS
from foam.registry import register, two_groups
from foam.settings import resolve_semantics
from foam.shard_blocks import local_shape
from foam.shard_quantized import (
    BLOCK,
    absmax_zeros,
    check_block_origins,
    kernel_absmax,
    placed_like,
    quantized_state_bytes,
    whole_blocks,
)
from foam.sharding import LayoutCheck, local, spans_ranks, straddled

Placement = Shard | Replicate

MOMENTS = {"exp_avg": True, "exp_avg_sq": False}  # state key -> signed code book


class FOAM8bit(FOAM):
    """FOAM whose moment states are stored block-wise int8 between steps.

    Each step dequantises the (folded) states to float32, runs FOAM's update unchanged and
    quantises the new states. The codes live under FOAM's keys (``exp_avg``, ``exp_avg_sq``, now
    uint8) with their float32 scales under ``<key>_absmax``, laid out as
    ``foam.shard_quantized`` says. States smaller than ``min_8bit_size`` (norm gains) stay in
    FOAM's state dtype, following bitsandbytes' rule for small tensors.

    Under FSDP2 each rank quantises its shard of a (folded) state, which keeps the state's
    placement (``foam.sharding``), so its blocks are the whole state's where its shards begin on
    block boundaries; other layouts are refused when the optimizer is built, naming the
    parameter (``names``, by ``id``). The 8-bit threshold is judged on the whole state's size.
    """

    float32_states = tuple(f"{key}_absmax" for key in MOMENTS)
    """State keys that are float32 whatever the parameter's dtype (kept so on loading)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        min_8bit_size: int = MIN_8BIT_SIZE,
        names: dict[int, str] | None = None,
        **foam_options: Any,
    ) -> None:
        self.functional = bitsandbytes().functional
        self.min_8bit_size = min_8bit_size
        self._names = names or {}
        self._code_books: dict[tuple[torch.device, bool], torch.Tensor] = {}
        super().__init__(params, **foam_options)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """FOAM's checks, then the refusal of 8-bit states whose blocks would straddle ranks."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for index, p in enumerate(group["params"]):
            if self.quantizes(p, group):
                where = self._names.get(id(p), f"parameter {index} of group {group.get('name')}")
                shape, placement = self.moment_layout(p, group)
                check_block_origins(p, shape, placement, "foam8bit", where)

    def moment_layout(self, p: torch.Tensor, group: dict[str, Any]) -> tuple[tuple, Placement]:
        """The global shape and placement of one of ``p``'s moments (folded or not)."""
        fold_of = self.shard_fold_for(p, group)
        if fold_of is None:
            return tuple(p.shape), placement_of(p)
        return tuple(fold_of.plan.folded_shape), fold_of.placement

    def quantizes(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Whether ``p``'s moments are stored in 8 bits (by the whole size of one moment)."""
        return folded_numel(self.plan_for(p, group), p.numel()) >= self.min_8bit_size

    def _uses_fused_adamw(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Quantised states need this class's own step; small ones may use FOAM's fused path."""
        return not self.quantizes(p, group) and super()._uses_fused_adamw(p, group)

    def _uses_fused_step(self, p: torch.Tensor, group: dict[str, Any]) -> bool:
        """Quantised states need this class's own step (the fused kernels read float states)."""
        return not self.quantizes(p, group) and super()._uses_fused_step(p, group)

    def planned_state_bytes(self, per_rank: bool = True) -> int:
        """Bytes of moment state once every parameter has stepped (step counters excluded), on
        this rank (``per_rank``) or whole."""
        total = 0
        for group in self.param_groups:
            for p in group["params"]:
                shape, placement = self.moment_layout(p, group)
                if self.quantizes(p, group):
                    total += 2 * quantized_state_bytes(p, shape, placement, per_rank)
                else:
                    held = local_shape(p, shape, placement) if per_rank else shape
                    itemsize = resolve_dtype(group["state_dtype"], p.dtype).itemsize
                    total += 2 * math.prod(held) * itemsize
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
                state[key] = self._dequantized(state, key, signed)
            else:  # fresh zeros
                state[key] = state[key].float()
        super()._update(p, group)
        for key, signed in MOMENTS.items():
            self._quantize(state, key, signed)

    def _dequantized(self, state: dict[str, Any], key: str, signed: bool) -> torch.Tensor:
        """The float32 values of the codes under ``key`` (this rank's blocks, placed alike)."""
        codes = state.pop(key)
        mine = local(codes)
        if not mine.numel():  # a rank with no rows of the state has nothing to decode
            return placed_like(codes, mine.float())
        values = self.functional.dequantize_blockwise(
            mine,
            absmax=kernel_absmax(state[f"{key}_absmax"], codes),
            code=self._code_book(codes.device, signed),
            blocksize=BLOCK,
        )
        return placed_like(codes, values)

    def _quantize(self, state: dict[str, Any], key: str, signed: bool) -> None:
        """Store the float state under ``key`` as codes and scales (this rank's blocks)."""
        values = state[key]
        if f"{key}_absmax" not in state:
            state[f"{key}_absmax"] = absmax_zeros(values)
        mine = local(values)
        if not mine.numel():
            state[key] = placed_like(values, mine.to(torch.uint8))
            return
        codes, scales = self.functional.quantize_blockwise(
            mine, code=self._code_book(values.device, signed), blocksize=BLOCK
        )
        kernel_absmax(state[f"{key}_absmax"], values).copy_(scales.absmax)
        state[key] = placed_like(values, codes)


def foam8bit_layout(settings: Mapping[str, Any]) -> LayoutCheck:
    """FOAM 8-bit quantises the folded moments, placed as ``foam.sharding.shard_fold`` places
    them, where FOAM's own rule (``2**level`` dividing the entries a rank holds along a sharded
    fold axis) holds."""
    group = dict(settings)
    resolve_semantics(group)
    fold, smallest = FoldSettings.of(group), settings["min_8bit_size"]

    def accepts(shape: tuple[int, int], dim: int, ranks: int) -> bool:
        if fold.level is None:
            return whole_blocks(shape, dim, ranks, smallest)
        plan = make_plan(shape, fold.level, fold.fold_axis, fold.tail_block)
        if straddled(plan, dim, ranks) is not None:
            return False
        placed = None if spans_ranks(plan, dim, ranks) else dim
        return whole_blocks(plan.folded_shape, placed, ranks, smallest)

    return accepts


@register(
    "foam8bit", shards=True, layout=foam8bit_layout, **FOAM_DEFAULTS, min_8bit_size=MIN_8BIT_SIZE
)
def _foam8bit(split: ParamSplit, hp: dict[str, Any]) -> FOAM8bit:
    """FOAM-l with 8-bit states; the non-matrix AdamW states are 8-bit too (above the size)."""
    names = {id(p): name for name, p in split.matrices + split.others}
    return FOAM8bit(two_groups(split, {}, {"level": None}), names=names, **hp)
