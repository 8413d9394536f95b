"""8-bit optimizer states: bitsandbytes' AdamW8bit (and the pieces ``foam8bit`` shares with it).

Both 8-bit methods use bitsandbytes' block-wise dynamic quantisation (Dettmers et al., "8-bit
Optimizers via Block-wise Quantization"): blocks of 256 values, one float32 absmax each, a signed
dynamic code book for the first moment and an unsigned one for the second. bitsandbytes is optional: it is
imported when one of these optimizers is built, so ``import foam`` works without it.

* ``adamw8bit``: ``bnb.optim.AdamW8bit`` on the **whole model**, as the FOAM repo's Adam8bit
  baseline and the paper's int8 table run it (8-bit Adam quantises embeddings and head too), with
  the paper's two groups so that ``alpha`` works as elsewhere (default 1: the paper runs 8-bit Adam
  without an alpha). bitsandbytes keeps float32 states for tensors under ``min_8bit_size``.
* ``foam8bit`` (``foam.combinations.foam8bit``): FOAM's own step (fold, residual, bias
  correction, alpha) on states dequantised to float32 for the step and quantised again after it. States smaller than ``min_8bit_size`` (norm
  gains) stay in FOAM's state dtype, following bitsandbytes' rule for small tensors.

Both train FSDP2 shards: each rank quantises its own shard, bitwise the single-process step
where every shard begins on a block boundary (``foam.shard_quantized``; other layouts are
refused when the optimizer is built).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard

from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups
from foam.shard_quantized import (
    absmax_zeros,
    check_block_origins,
    kernel_absmax,
    quantized_state_bytes,
    whole_blocks,
)
from foam.sharding import LayoutCheck, is_sharded, local

MIN_8BIT_SIZE = 4096  # bitsandbytes' default: smaller states are not worth quantising


def bitsandbytes() -> ModuleType:
    """The bitsandbytes package, or an ImportError that says how to get it."""
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional  # quantize/dequantize_blockwise
    except ImportError as err:
        raise ImportError(
            "8-bit optimizers need bitsandbytes: pip install bitsandbytes (>= 0.50 runs on CPU)"
        ) from err
    return bnb


def placement_of(p: torch.Tensor) -> Shard | Replicate:
    """``p``'s placement on its 1-d mesh; ``Replicate`` for a plain tensor (all of it here)."""
    return p.placements[0] if is_sharded(p) else Replicate()


@functools.cache
def adamw8bit_class() -> type[torch.optim.Optimizer]:
    """``bnb.optim.AdamW8bit`` on FSDP2 shards too, with this project's state accounting (built
    on first use)."""
    bnb = bitsandbytes()

    class AdamW8bit(bnb.optim.AdamW8bit):
        """bitsandbytes' block-wise 8-bit AdamW, whose kernels step each rank's shard.

        bitsandbytes' own step runs unchanged on this rank's local tensors: its 8-bit codes are
        DTensors shaped and placed like the parameter and its scales laid out by
        ``foam.shard_quantized`` (so DCP saves and reshards both), which is what makes the
        local blocks the whole tensor's (layouts where they would not be are refused here, by
        name). Whether a state is 8-bit is decided on the whole parameter's size, as one
        process decides it, whatever the world size. ``names`` (by ``id``) name the parameters
        in that refusal.
        """

        def __init__(self, params: Any, names: dict[int, str] | None = None, **options: Any):
            super().__init__(params, **options)
            names = names or {}
            for group in self.param_groups:
                for index, p in enumerate(group["params"]):
                    if self.quantizes(p):
                        where = names.get(id(p), f"parameter {index} of group {group.get('name')}")
                        check_block_origins(p, tuple(p.shape), placement_of(p), "adamw8bit", where)

        def quantizes(self, p: torch.Tensor) -> bool:
            """bitsandbytes' rule (``init_state``), on the whole parameter's size."""
            return p.numel() >= self.args.min_8bit_size

        @torch.no_grad()
        def init_state(self, group: dict, p: torch.Tensor, gindex: int, pindex: int) -> None:
            """bitsandbytes' states (its codes take ``p``'s placement), with the scales laid out
            to shard with them."""
            super().init_state(group, p, gindex, pindex)
            state = self.state[p]
            if state["state1"].dtype == torch.uint8:
                for i in (1, 2):
                    state[f"absmax{i}"] = absmax_zeros(state[f"state{i}"])

        @torch.no_grad()
        def update_step(self, group: dict, p: torch.Tensor, gindex: int, pindex: int) -> None:
            """bitsandbytes' step on this rank's shard: the parameter, its gradient and states
            as local tensors (aliases: the kernel writes into them), the scales as its blocks."""
            state = self.state[p]
            kernel_state = {key: local(value) for key, value in state.items()}
            if state["state1"].dtype == torch.uint8:
                for i in (1, 2):
                    kernel_state[f"absmax{i}"] = kernel_absmax(state[f"absmax{i}"], p)
            shard = local(p).detach()
            shard.grad = local(p.grad).detach()
            self.state[shard] = kernel_state
            try:
                if shard.numel():  # a rank with no rows of p only counts the step
                    super().update_step(group, shard, gindex, pindex)
                else:
                    kernel_state["step"] += 1
            finally:
                del self.state[shard]
                state["step"] = kernel_state["step"]
            if shard.data_ptr() != local(p).data_ptr():  # bitsandbytes made it contiguous
                local(p).copy_(shard)

        def planned_state_numel(self, per_rank: bool = True) -> int:
            return sum(
                2 * (local(p).numel() if per_rank else p.numel())
                for g in self.param_groups
                for p in g["params"]
            )

        def planned_state_bytes(self, per_rank: bool = True) -> int:
            """Mirrors ``init_state``: 8-bit codes + scales, or float32 when small; on this
            rank or whole. The two shared code books (256 float32 each) are in every 8-bit
            parameter's state."""
            total, books = 0, 0
            for group in self.param_groups:
                for p in group["params"]:
                    if self.quantizes(p):
                        shape = tuple(p.shape)
                        total += 2 * quantized_state_bytes(p, shape, placement_of(p), per_rank)
                        books = 2 * 256 * 4
                    else:
                        total += 8 * (local(p).numel() if per_rank else p.numel())
            return total + books

    return AdamW8bit


def adamw8bit_layout(settings: Mapping[str, Any]) -> LayoutCheck:
    """bitsandbytes' AdamW8bit quantises each moment shaped and placed as its parameter."""
    smallest = settings["min_8bit_size"]
    return lambda shape, dim, ranks: whole_blocks(shape, dim, ranks, smallest)


@register("adamw8bit", shards=True, layout=adamw8bit_layout, alpha=1.0, min_8bit_size=MIN_8BIT_SIZE)
def _adamw8bit(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """bitsandbytes AdamW8bit over the whole model, matrices at ``lr * alpha``."""
    base = adam_settings(hp)
    groups = two_groups(split, {"lr": hp["lr"] * hp["alpha"]}, {})
    names = {id(p): name for name, p in split.matrices + split.others}
    return adamw8bit_class()(groups, names, **base, min_8bit_size=hp["min_8bit_size"])
