"""Adam-mini 1.1.1 (Zhang et al., 2025): Adam with one second-moment value per parameter block.

Adam-mini keeps Adam's full first moment but one second-moment value per block: a block is an
attention head for queries and keys, an output row for values, attention outputs, MLPs,
embeddings and the output head, a single element for biases and the whole tensor for anything
else (norm gains). The blocks come from parameter *names*, exactly as in adam-mini 1.1.1 (its
``Adam_mini`` partitions by the substrings below), so this optimizer needs named parameters, plus
the model's ``dim`` and ``n_heads`` when it has queries or keys (a head block spans
``dim * dim / n_heads`` entries, adam-mini's convention); ``build_optimizer`` reads them from a
transformers model's config when they are not given.

The optimizer also runs FOAM with Adam-mini (``foam.combinations.foam_adam_mini``): a group with a
``level`` stores the first moment of its matrices folded and re-adds the residual each step,
``E(M~ / bc1) + rho * R``, over Adam-mini's block second moment. Level 0 is Adam-mini. ``alpha``
is the paper's module-wise lr: the matrix group runs at ``lr * alpha`` (default 1, as the paper
runs Adam-mini).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from foam.errors import OptionError
from foam.folding import (
    FoldPlan,
    fold_plan,
    folded_numel,
    unfold_with_residual,
    validate_fold_settings,
)
from foam.hparams import group_defaults, signature_defaults, validate_adam_hparams
from foam.numerics import compute_dtype, ema_
from foam.param_groups import ParamSplit
from foam.registry import kept_by_method, register, with_adamw_for_others
from foam.shard_blocks import (
    ShardBlocks,
    block_state,
    block_sums,
    mesh_group,
    per_entry,
    shard_blocks,
)
from foam.shard_sums import PartialSums
from foam.sharding import ShardFold, fold_shard, is_sharded, local, shard_fold, zeros_state
from foam.state import DtypeFaithfulOptimizer, count_step, new_step_counter, run_closure

# adam-mini 1.1.1's name rules (case-insensitive substrings), in priority order.
ELEMENT_NAMES = ("bias",)
HEAD_NAMES = ("k_proj", "q_proj", "wq", "wk", "query", "key")
ROW_NAMES = (
    *("embed", "embd", "wte"),
    *("lm_head", "output", "final_layer"),
    *("v_proj", "wv", "value"),
    *("feed_forward", "linear", "mlp"),
    *("o_proj", "wo", "attn.proj"),
)
NO_DECAY_NAMES = ("norm", "ln", "bias")
HEAD_KEYS = ("dim", "n_heads")  # constructor keywords that describe the model, not a group


def _matches(name: str, keys: tuple[str, ...]) -> bool:
    return any(key in name for key in keys)


def second_moment_blocks(name: str, shape: torch.Size, head_numel: int | None) -> int:
    """How many equal, contiguous (row-major) blocks share one second-moment value each."""
    name = name.lower()
    numel = math.prod(shape)
    if _matches(name, ELEMENT_NAMES):
        return numel
    if _matches(name, HEAD_NAMES):
        if head_numel is None:
            raise OptionError(
                "dim",
                f"Adam-mini splits {name!r} into attention heads: pass dim= (hidden size) and "
                "n_heads= (attention heads) of the model",
            )
        if numel % head_numel:
            raise OptionError(
                "n_heads",
                f"{name!r} has {numel} entries, not a multiple of dim*dim/n_heads = {head_numel}",
            )
        return numel // head_numel
    if _matches(name, ROW_NAMES):
        return shape[0]
    return 1


def decays(name: str) -> bool:
    """adam-mini exempts norms and biases from weight decay (by name)."""
    return not _matches(name.lower(), NO_DECAY_NAMES)


class AdamMini(DtypeFaithfulOptimizer):
    """Adam with one second moment per Adam-mini block; optionally a folded first moment.

    ``params``: ``(name, tensor)`` pairs or groups of them (``model.named_parameters()``); torch
    keeps the names in ``group["param_names"]``. A group whose ``level`` is not ``None`` stores the
    first moment of its matrices folded (as ``FOAM`` does) and adds the residual back.
    States are in the parameter's dtype; arithmetic in float32 or wider.
    """

    def __init__(
        self,
        params: Iterable[tuple[str, torch.Tensor]] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        dim: int | None = None,
        n_heads: int | None = None,
        level: int | str | None = None,
        fold_axis: str = "larger",
        residual: bool | float = True,
    ) -> None:
        defaults = group_defaults(locals())
        if (dim is None) != (n_heads is None):
            raise OptionError(
                "dim" if dim is None else "n_heads",
                "pass both dim= and n_heads= (or neither, for a model without heads)",
            )
        self.head_numel = None if dim is None else dim * dim // n_heads
        self._shard_blocks: dict[torch.Tensor, ShardBlocks] = {}
        super().__init__(params, {k: v for k, v in defaults.items() if k not in HEAD_KEYS})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Check names and plans when a group is added, so errors come before any compute."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if "param_names" not in group:
            raise ValueError(
                "AdamMini partitions by parameter name: pass (name, param) pairs, "
                "e.g. model.named_parameters()"
            )
        validate_adam_hparams(group)
        validate_fold_settings(group)
        for index, (name, p) in enumerate(zip(group["param_names"], group["params"], strict=True)):
            plan, _ = self.layout(name, p, group)
            if plan is not None and plan.block > 1:  # a fold block may not straddle two ranks
                shard_fold(p, plan, f"parameter {index} ({name}) of group {group.get('name')!r}")

    def layout(
        self, name: str, p: torch.Tensor, group: dict[str, Any]
    ) -> tuple[FoldPlan | None, int]:
        """The first moment's fold plan (``None``: full) and the number of second-moment blocks."""
        return fold_plan(p, group), second_moment_blocks(name, p.shape, self.head_numel)

    def planned_state_numel(self, per_rank: bool = True) -> int:
        """Moment elements once every parameter has stepped, from the layouts that size them: on
        this rank (``per_rank``: its shards, and every block that spans ranks) or for the whole
        model."""
        total = 0
        for group in self.param_groups:
            for name, p in zip(group["param_names"], group["params"], strict=True):
                plan, blocks = self.layout(name, p, group)
                if per_rank and is_sharded(p):
                    on_shard = self._blocks(name, p)
                    folded = plan is not None and plan.block > 1
                    m = shard_fold(p, plan).local_state_numel() if folded else local(p).numel()
                    total += m + (on_shard.local_count if on_shard.local else on_shard.count)
                else:
                    total += folded_numel(plan, p.numel()) + blocks
        return total

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Two passes over the parameters, so that the block sums that span ranks (sharded
        parameters, see ``foam/shard_blocks.py``) travel in one all-reduce for the whole step."""
        loss = run_closure(closure)
        sums = PartialSums(mesh_group(p for g in self.param_groups for p in g["params"]))
        started = [
            self._begin(name, p, group, sums)
            for group in self.param_groups
            for name, p in zip(group["param_names"], group["params"], strict=True)
            if p.grad is not None
        ]
        sums.reduce()
        for begun in started:
            self._finish(begun)
        return loss

    def _blocks(self, name: str, p: torch.Tensor) -> ShardBlocks:
        """The second-moment blocks of ``p`` on this rank's shard (kept: they index the shard)."""
        blocks = self._shard_blocks.get(p)
        if blocks is None:
            count = second_moment_blocks(name, p.shape, self.head_numel)
            blocks = self._shard_blocks[p] = shard_blocks(p, p.numel() // count)
        return blocks

    def _begin(self, name: str, p: torch.Tensor, group: dict[str, Any], sums: PartialSums):
        """Count the step and register this rank's part of each block's mean square."""
        if p.grad.is_sparse:
            raise RuntimeError("AdamMini does not support sparse gradients")
        plan, _ = self.layout(name, p, group)
        folded = plan is not None and plan.block > 1  # level 0 folds nothing: plain Adam-mini
        fold_of = shard_fold(p, plan) if folded else None
        blocks = self._blocks(name, p)
        state = self.state[p]
        if not state:
            state["step"] = new_step_counter()
            state["exp_avg"] = zeros_state(p, fold_of, p.dtype) if folded else torch.zeros_like(p)
            state["exp_avg_sq"] = block_state(p, blocks, p.dtype)
        g = local(p.grad).to(compute_dtype(p.dtype))
        if not blocks.local:
            square_sums = sums.add(block_sums(g.square(), blocks))
        elif blocks.local_count:
            square_sums = g.reshape(blocks.local_count, -1).square().mean(dim=1, keepdim=True)
        else:  # an empty shard
            square_sums = g.new_zeros((0, 1))
        return _Begun(name, p, group, fold_of, blocks, g, square_sums, count_step(state))

    def _finish(self, begun: _Begun) -> None:
        p, group, blocks, g, state = (
            begun.p,
            begun.group,
            begun.blocks,
            begun.g,
            self.state[begun.p],
        )
        beta1, beta2 = group["betas"]
        bc1, bc2 = 1 - beta1**begun.t, 1 - beta2**begun.t
        lr = group["lr"]
        mean_square = begun.square_sums
        if not blocks.local:
            mean_square = mean_square.div(blocks.size).unsqueeze(1)
        v = ema_(local(state["exp_avg_sq"]), mean_square, beta2, square=False)
        denom = (v.sqrt() / math.sqrt(bc2)).add_(group["eps"])
        shard = local(p)
        if begun.fold_of is not None:
            fold_of = begun.fold_of
            g2d = g.reshape(fold_of.local.rows, fold_of.local.cols)
            g_folded = fold_shard(g2d, fold_of, p)  # an all-reduce when its block spans ranks
            m = ema_(local(state["exp_avg"]), g_folded, beta1, square=False)
            if not shard.numel():
                return
            rho = float(group["residual"])
            numerator = unfold_with_residual(g2d, g_folded, m / bc1, fold_of.local, rho)
            if blocks.local:
                update = numerator.view(blocks.local_count, -1).div_(denom)
            else:
                update = numerator.view(shard.shape).div_(per_entry(denom, blocks))
        else:
            m = ema_(local(state["exp_avg"]), g, beta1, square=False)
            if not shard.numel():
                return
            if blocks.local:
                update = m.reshape(blocks.local_count, -1) * ((1 / bc1) / denom)
            else:
                update = m * per_entry((1 / bc1) / denom, blocks)

        if group["weight_decay"] and decays(begun.name):
            shard.mul_(1 - lr * group["weight_decay"])
        shard.add_(update.view(shard.shape), alpha=-lr)


@dataclass
class _Begun:
    """A parameter's step between the two passes of ``AdamMini.step``."""

    name: str
    p: torch.Tensor
    group: dict[str, Any]
    fold_of: ShardFold | None
    blocks: ShardBlocks
    g: torch.Tensor
    square_sums: torch.Tensor
    """Local blocks: their mean squares; blocks spanning ranks: every block's sum of squares
    (this rank's part until the reduction)."""
    t: int


def heads_from_config(model: nn.Module) -> dict[str, Any]:
    """``dim`` and ``n_heads`` from a transformers model's config (none for other models).

    A head block spans ``dim * dim / n_heads`` entries for queries and keys alike, so grouped-query
    models need no key/value head count: their keys hold ``num_key_value_heads`` such blocks.
    """
    config = getattr(model, "config", None)
    dim = getattr(config, "hidden_size", None)
    n_heads = getattr(config, "num_attention_heads", None)
    return {} if dim is None or n_heads is None else {"dim": dim, "n_heads": n_heads}


def groups(split: ParamSplit, hp: dict[str, Any], level: int | str | None) -> list[dict]:
    """The paper's split, named: matrices at ``lr * alpha`` (folded when ``level`` is set).

    The rest is Adam-mini's too only with ``others="reference"`` (the package's whole-model
    partition); with ``others="adamw"`` it goes to the plain AdamW every method shares.
    """
    split = kept_by_method(split, hp)
    named = [
        {
            "params": split.matrices,
            "name": "matrices",
            "lr": hp["lr"] * hp["alpha"],
            "level": level,
        },
        {"params": split.others, "name": "others", "level": None},
    ]
    return [g for g in named if g["params"]]


def build(
    split: ParamSplit, hp: dict[str, Any], level: int | str | None, **fold: Any
) -> torch.optim.Optimizer:
    """Adam-mini over the split; ``level`` and ``fold`` (fold_axis, residual) for FOAM's variant."""
    settings = {k: hp[k] for k in ("lr", "betas", "eps", "weight_decay", *HEAD_KEYS)}
    adam_mini = AdamMini(groups(split, hp, level), **settings, **fold)
    return with_adamw_for_others(split, adam_mini, hp)


# Adam-mini is defined on the whole model: its per-row second moment of the embeddings and head
# is part of its memory saving (the paper's memory column counts it), and its eps is torch's, so
# the rest stays Adam-mini's by default; others="adamw" gives the shared-AdamW variant.
HEADS: dict[str, Any] = {
    "alpha": 1.0,
    **signature_defaults(AdamMini, *HEAD_KEYS),
    "others": "reference",
}


@register("adam_mini", shards=True, from_model=heads_from_config, **HEADS)
def _adam_mini(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """Adam-mini on the whole model, matrices at ``lr * alpha`` (``others="adamw"``: matrices only)."""
    return build(split, hp, None)
