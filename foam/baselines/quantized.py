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
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Any

import torch

from foam.param_groups import ParamSplit
from foam.registry import adam_settings, register, two_groups

BLOCK = 256  # bitsandbytes' optimizer block size since 0.44
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


def quantized_bytes(numel: int) -> int:
    """Bytes of one block-wise quantised tensor: one code per value, one float32 absmax per block."""
    return numel + 4 * math.ceil(numel / BLOCK)


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
