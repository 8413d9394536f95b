"""8-bit optimizer states: bitsandbytes' AdamW8bit, and FOAM with block-wise int8 states.

Both use bitsandbytes' block-wise dynamic quantisation (Dettmers et al., "8-bit Optimizers via
Block-wise Quantization"): blocks of 256 values, one float32 absmax each, a signed dynamic code
book for the first moment and an unsigned one for the second. bitsandbytes is optional: it is
imported when one of these optimizers is built, so ``import foam`` works without it.

* ``adamw8bit``: ``bnb.optim.AdamW8bit`` on the **whole model**, as the FOAM repo's Adam8bit
  baseline and the paper's int8 table run it (8-bit Adam quantises embeddings and head too), with
  the paper's two groups so that ``alpha`` works as elsewhere (default 1: the paper runs 8-bit Adam
  without an alpha). bitsandbytes keeps float32 states for tensors under ``min_8bit_size``.
* ``foam8bit``: FOAM's own step (fold, residual, bias correction, alpha) on states dequantised to
  float32 for the step and quantised again after it. States smaller than ``min_8bit_size`` (norm
  gains) stay in FOAM's state dtype, following bitsandbytes' rule for small tensors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch

from foam.folding import folded_numel
from foam.optimizer import FOAM, resolve_dtype
from foam.param_groups import ParamSplit
from foam.recipes import FOAM_OPTIONS
from foam.registry import adam_settings, register, two_groups

BLOCK = 256  # bitsandbytes' optimizer block size since 0.44
MIN_8BIT_SIZE = 4096  # bitsandbytes' default: smaller states are not worth quantising
MOMENTS = {"exp_avg": True, "exp_avg_sq": False}  # state key -> signed code book


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


def quantized_bytes(numel: int) -> int:
    """Bytes of one block-wise quantised tensor: one code per value, one float32 absmax per block."""
    return numel + 4 * math.ceil(numel / BLOCK)


class FOAM8bit(FOAM):
    """FOAM whose moment states are stored block-wise int8 between steps.

    Each step dequantises the (folded) states to float32, runs FOAM's update unchanged and
    quantises the new states. The codes live under FOAM's keys (``exp_avg``, ``exp_avg_sq``, now
    uint8) with their scales under ``<key>_absmax``.
    """

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
            self._init_state(p, group, self.plan_for(p, group))
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


@functools.cache
def adamw8bit_class() -> type[torch.optim.Optimizer]:
    """``bnb.optim.AdamW8bit`` with this project's state accounting (built on first use)."""
    bnb = bitsandbytes()

    class AdamW8bit(bnb.optim.AdamW8bit):
        """bitsandbytes' block-wise 8-bit AdamW; adds ``planned_state_numel/bytes``."""

        def planned_state_numel(self) -> int:
            return sum(2 * p.numel() for g in self.param_groups for p in g["params"])

        def planned_state_bytes(self) -> int:
            """Mirrors bitsandbytes' ``init_state``: 8-bit codes + absmax, or float32 when small.

            The two shared code books (256 float32 each) are in every 8-bit parameter's state.
            """
            sizes = [p.numel() for g in self.param_groups for p in g["params"]]
            small = [n for n in sizes if n < self.args.min_8bit_size]
            quantised = [n for n in sizes if n >= self.args.min_8bit_size]
            books = 2 * 256 * 4 if quantised else 0
            return sum(2 * quantized_bytes(n) for n in quantised) + 8 * sum(small) + books

    return AdamW8bit


@register("adamw8bit", alpha=1.0, min_8bit_size=MIN_8BIT_SIZE)
def _adamw8bit(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """bitsandbytes AdamW8bit over the whole model, matrices at ``lr * alpha``."""
    base = adam_settings(hp)
    groups = two_groups(split, {"lr": hp["lr"] * hp["alpha"]}, {})
    return adamw8bit_class()(groups, **base, min_8bit_size=hp["min_8bit_size"])


@register("foam8bit", level=2, min_8bit_size=MIN_8BIT_SIZE, **FOAM_OPTIONS)
def _foam8bit(split: ParamSplit, hp: dict[str, Any]) -> FOAM8bit:
    """FOAM-l with 8-bit states; the non-matrix AdamW states are 8-bit too (above the size)."""
    return FOAM8bit(two_groups(split, {}, {"level": None}), **hp)
