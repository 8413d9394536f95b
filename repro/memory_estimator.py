"""Estimated pre-training memory of a method on a model: bf16 weights + persistent optimizer state.

What is estimated (FOAM paper, Appendix "Memory Estimation", after GaLore Appendix C.2): the bf16
weights (2 bytes x parameters) plus the persistent optimizer state (2 bytes x state elements: the
paper trains in pure bf16, so every state is bf16). No gradients, activations or allocator
overhead: that is what "estimated" means in Table 2 and the Appendix estimate table.

Nothing here knows a method's state formula. Each method is built with
``foam.build_optimizer(optimizer, model, **hparams)`` over the model constructed on the meta device
(nothing allocated, so 7B costs nothing), and ``foam.planned_state_numel(optimizer)`` says how many
state elements it will hold (step counters excluded). The paper's conventions are encoded only as
the hparams in ``SPECS``:

* GaLore / APOLLO / LDAdamW ``-1/4`` and ``-1/8``: rank = hidden_size/4 or /8 on every attention
  and MLP matrix (the paper's "r = d_model/4", Table 2's r/d_model = 512/2048 at 1B; the APOLLO
  scripts' 1B rank 256 is *not* what the paper's memory column counts).
* The paper's GaLore/APOLLO formula is ``m*r + 2*n*r`` for an m x n matrix with m <= n, i.e. the
  stored projection (m x r) *is* counted, for APOLLO too. The optimizers' own accounting decides
  whether a projection is held; it is reported as it is.
* FOAM-l: ``level=l``; FOAM-Mini: one block over the whole larger axis.
* Everything outside the attention/MLP matrices (embeddings, lm_head, norms) keeps full AdamW
  moments in every method (the paper's split, ``foam.split_params``).

Under FSDP2 (``sharded_estimate``) the meta model is sharded over ``W`` ranks exactly as the
trainer shards it (``train.parallelism.parallelize``: each matrix along the method's
``foam.registry.shard_dims``) and the same ``foam.planned_state_numel`` is asked for one rank's
share. That share is not the whole divided by ``W``: some states are replicated (a GaLore/APOLLO
moment whose basis lies along the sharded dim, an Adam-mini block that spans ranks). An 8-bit
method's share is the bytes the rank allocates (the optimizer's ``planned_state_bytes``: codes,
their per-block scales and the float states of tensors under ``min_8bit_size``), the figure to
size a GPU by, rather than the paper's one byte a state.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Importing it registers the "fake" c10d backend: a process group that sets up a rank's DTensor
# layout without any peer (torchtitan's memory estimation uses it the same way).
from torch.testing._internal.distributed.fake_pg import FakeStore

import foam
import models
from foam.sharding import SHARDED_METHODS, ShardingNotSupported, local
from train.distributed import shutdown
from train.parallelism import parallelize

GB = 1e9
GIB = 2**30
BF16_BYTES = 2


@dataclass(frozen=True)
class Spec:
    """How the paper sizes a method: which registered optimizer, with which hparams."""

    optimizer: str
    hparams: Callable[[Mapping[str, Any]], dict[str, Any]]
    bytes_per_state: int | None = None
    """None: a state is as wide as a weight (the paper's bf16: 2 bytes); 1 for 8-bit optimizers
    (quantisation scales not counted, as the paper's 8-bit Adam entries)."""


def _rank(divisor: int) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    return lambda cfg: {"rank": int(cfg["hidden_size"]) // divisor}


def _fixed(**hparams: Any) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    return lambda cfg: dict(hparams)


SPECS: dict[str, Spec] = {
    "adamw": Spec("adamw", _fixed()),
    "muon": Spec("muon", _fixed()),
    # dim and n_heads come from the model's config, as the FOAM repo passes them to adam-mini.
    "adam_mini": Spec("adam_mini", _fixed()),
    "ldadamw": Spec("ldadamw", _rank(4)),
    "galore_1_4": Spec("galore", _rank(4)),
    "apollo_1_4": Spec("apollo", _rank(4)),
    "foam2": Spec("foam", _fixed(level=2)),
    "galore_1_8": Spec("galore", _rank(8)),
    "apollo_1_8": Spec("apollo", _rank(8)),
    "foam3": Spec("foam", _fixed(level=3)),
    "apollo_mini": Spec("apollo_mini", _fixed()),
    "gwt_mini": Spec("gwt_mini", _fixed()),
    "foam_mini": Spec("foam_mini", _fixed()),
    "adamw8bit": Spec("adamw8bit", _fixed(), bytes_per_state=1),
    "galore8bit": Spec("galore8bit", _rank(4), bytes_per_state=1),
    "foam8bit": Spec("foam8bit", _fixed(level=2), bytes_per_state=1),
}
"""By method name (``repro/methods.py``)."""


@dataclass(frozen=True)
class Estimate:
    model: str
    method: str
    weights_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes

    def as_json(self) -> dict[str, Any]:
        """Decimal GB (1e9 bytes), unrounded: the physical numbers, not the paper's mixed units."""
        return {
            "model": self.model,
            "method": self.method,
            "weights_gb": self.weights_bytes / GB,
            "optimizer_gb": self.optimizer_bytes / GB,
            "total_gb": self.total_bytes / GB,
        }


def spec(method: str) -> Spec:
    if method not in SPECS:
        raise ValueError(f"unknown method {method!r}; known: {list(SPECS)}")
    return SPECS[method]


@functools.cache
def _meta_model(model: str) -> torch.nn.Module:
    return models.build_model(models.load_model_config(model), device="meta", dtype=torch.bfloat16)


@functools.cache
def estimate(model: str, method: str, value_bytes: int = BF16_BYTES) -> Estimate:
    """Weights and planned optimizer-state bytes of ``method`` on ``model`` (nothing allocated),
    ``value_bytes`` per weight and state: the paper's bf16 by default, 4 for an fp32 run."""
    how = spec(method)
    net = _meta_model(model)
    hparams = how.hparams(models.load_model_config(model))
    optimizer = foam.build_optimizer(how.optimizer, net, **hparams)
    weights = sum(p.numel() for p in net.parameters()) * value_bytes
    states = foam.planned_state_numel(optimizer) * (how.bytes_per_state or value_bytes)
    return Estimate(model, method, weights, states)


@contextlib.contextmanager
def _as_rank(rank: int, ranks: int) -> Iterator[None]:
    """This process stands for ``rank`` of ``ranks`` (a fake process group: no peers, no
    communication) until the block ends."""
    if dist.is_initialized():
        raise RuntimeError("sharded_estimate needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    try:
        yield
    finally:
        shutdown()


def shard_as_trainer(
    net: torch.nn.Module, ranks: int, optimizer: str, hparams: Mapping[str, Any]
) -> None:
    """Shard ``net`` over ``ranks`` as the trainer's FSDP2 does for ``optimizer`` with
    ``hparams`` (``train.parallelism.parallelize``: each matrix on ``foam.registry.shard_dims``)."""
    parallelize(
        net,
        sharded=True,
        precision="fp32",
        device=torch.device("cpu"),
        world_size=ranks,
        optimizer=optimizer,
        hparams=hparams,
    )


@functools.cache
def sharded_estimate(
    model: str, method: str, ranks: int, value_bytes: int = BF16_BYTES, rank: int = 0
) -> Estimate:
    """Weights and planned optimizer-state bytes that ``rank`` of ``ranks`` holds when the
    trainer shards ``model`` with FSDP2 (``trainer.parallelism=fsdp``). Rank 0 by default: FSDP2
    splits dim 0 as ``torch.chunk`` does, so the first ranks hold the largest shares. Raises
    ``ShardingNotSupported`` (one line) for a method, or a layout, that FSDP2 refuses."""
    how = spec(method)
    if how.optimizer not in SHARDED_METHODS:
        raise ShardingNotSupported(f"{method}: refused under FSDP")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not one of {ranks} ranks")
    hparams = how.hparams(models.load_model_config(model))
    dtype = {BF16_BYTES: torch.bfloat16, 4: torch.float32}[value_bytes]
    with _as_rank(rank, ranks):
        net = models.build_model(models.load_model_config(model), device="meta", dtype=dtype)
        shard_as_trainer(net, ranks, how.optimizer, hparams)
        try:
            optimizer = foam.build_optimizer(how.optimizer, net, **hparams)
        except ShardingNotSupported as err:
            message = f"{method}: refused under FSDP on {ranks} ranks: {err}"
            raise ShardingNotSupported(message) from err
        weights = sum(local(p).numel() for p in net.parameters()) * value_bytes
        if how.bytes_per_state is None:
            states = foam.planned_state_numel(optimizer) * value_bytes
        else:  # 8-bit: what the rank allocates, codes and scales and the small float states
            states = optimizer.planned_state_bytes()
    return Estimate(model, method, weights, states)


def table2_gb(e: Estimate) -> float:
    """Table 2's memory column: weights + states, decimal GB."""
    return e.total_bytes / GB


def finetune_gb(params: int, optimizer_state_numel: int) -> float:
    """The fine-tuning tables' memory column, Table 2's convention: every weight (LoRA's
    adapters included) and the planned optimizer state, in bf16, decimal GB."""
    return (params + optimizer_state_numel) * BF16_BYTES / GB


def appendix_pair(e: Estimate) -> tuple[float, float]:
    """The Appendix table's "weights/states": weights in GiB, states = GB total - GiB weights."""
    weights = e.weights_bytes / GIB
    return weights, table2_gb(e) - weights


MATCHED_KEYWORD = {"galore": "rank", "apollo": "rank", "gwt": "level"}
"""The knob that sets each memory-matched baseline's state size (the fold-level figure)."""


@functools.cache
def planned_numel(model: str, optimizer: str, **hparams: Any) -> int:
    """``foam.planned_state_numel`` of ``optimizer`` with ``hparams`` on ``model`` (meta device)."""
    return foam.planned_state_numel(foam.build_optimizer(optimizer, _meta_model(model), **hparams))


def _knob_range(model: str, method: str) -> range:
    """The values a matched baseline's knob may take on ``model``, ordered by growing state:
    ranks 1..hidden (an SVD or a projection has no more), wavelet levels from one coefficient per
    row of the narrowest fold axis down to 1."""
    cfg = models.load_model_config(model)
    if MATCHED_KEYWORD[method] == "rank":
        return range(1, int(cfg["hidden_size"]) + 1)
    narrowest = min(max(p.shape) for _, p in foam.split_params(_meta_model(model)).matrices)
    return range((narrowest - 1).bit_length(), 0, -1)


def memory_matched(model: str, method: str, level: int | str) -> dict[str, int]:
    """GaLore's / APOLLO's rank or GWT's level whose planned optimizer state on ``model`` is
    closest to FOAM-``level``'s (``foam.planned_state_numel``, both on the meta device; a tie goes
    to the smaller state): the paper's fold-level figure configures its baselines "to roughly
    match FOAM's memory usage under each setting". Along ``_knob_range`` the state grows, so a
    bisection finds the first knob at or above FOAM's state; it or the one before is the match."""
    if method not in MATCHED_KEYWORD:
        raise ValueError(f"no memory-matching rule for {method!r}; known: {list(MATCHED_KEYWORD)}")
    key = MATCHED_KEYWORD[method]
    target = planned_numel(model, "foam", level=level)
    knobs = _knob_range(model, method)

    def size(index: int) -> int:
        return planned_numel(model, method, **{key: knobs[index]})

    low, high = 0, len(knobs) - 1
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if size(middle) >= target else (middle + 1, high)
    best = min((i for i in (low - 1, low) if i >= 0), key=lambda i: abs(size(i) - target))
    return {key: knobs[best]}
