"""Block folding: the fold A (block means along one axis) and the unfold E (each block's value
repeated over the block), and the plan that says how a parameter is folded.

Everything here works on *views*: a matrix is split into its full blocks, shaped so that a block is
one axis of a 3-d view, plus an optional shorter tail block. Broadcasting a per-block value over
these views is how the optimizer applies E without materialising E(y) as a full-size tensor.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from foam.errors import OptionError, require_choice

PAPER_FOLD_AXIS = "larger"
"""The paper's fold axis: the larger dim (ties: the last), so that FOAM-Mini keeps one value per
row of the smaller dim; ``"last"`` is the authors' release's."""
FOLD_AXES = (PAPER_FOLD_AXIS, "last")
PAPER_TAIL_BLOCK = "mean"
"""How the paper averages a block shorter than 2**level (the last one of a non-divisible axis):
over its real entries (FOAM_SPEC section 1). ``"zero_pad"``, the authors' release, zero-pads it
to the full block and divides by 2**level."""
TAIL_BLOCKS = (PAPER_TAIL_BLOCK, "zero_pad")
log = logging.getLogger("foam")


@dataclass(frozen=True)
class FoldPlan:
    """How one parameter is folded.

    ``rows x cols`` is the 2-d view of the parameter (more than two dims are viewed as
    ``(shape[0], prod(rest))``). ``axis`` is the axis of that view whose entries are averaged in
    blocks of ``block`` consecutive entries; the last block may be shorter (``tail`` entries), and
    ``tail_block`` says how it is averaged (one of :data:`TAIL_BLOCKS`).
    """

    rows: int
    cols: int
    axis: int  # 0 or 1 in the 2-d view
    block: int
    tail_block: str = PAPER_TAIL_BLOCK

    @property
    def length(self) -> int:
        """Entries along the fold axis."""
        return self.cols if self.axis == 1 else self.rows

    @property
    def full_blocks(self) -> int:
        return self.length // self.block

    @property
    def tail(self) -> int:
        """Entries in the last, shorter block (0 when the length is divisible)."""
        return self.length - self.full_blocks * self.block

    @property
    def num_blocks(self) -> int:
        return math.ceil(self.length / self.block)

    @property
    def folded_shape(self) -> tuple[int, int]:
        """Shape of a folded state: the fold axis shrinks to one value per block."""
        return (self.rows, self.num_blocks) if self.axis == 1 else (self.num_blocks, self.cols)


def matrix_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """The 2-d view FOAM folds: ``(shape[0], prod(rest))``."""
    if len(shape) < 2:
        raise ValueError(
            f"only tensors with at least two dims are folded, got shape {tuple(shape)}"
        )
    return shape[0], math.prod(shape[1:])


def check_level(level: Any) -> None:
    """The fold-level rule: an int >= 0 (blocks of ``2**level``), ``"mini"`` or ``None``."""
    if level is None or level == "mini":
        return
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise OptionError("level", f"level must be an int >= 0, 'mini' or None, got {level!r}")


@dataclass(frozen=True)
class FoldSettings:
    """A group's fold options, checked once, when the group is added; every plan comes from them.

    ``level`` is an int >= 0 (blocks of ``2**level``), ``"mini"`` (one block over the fold axis)
    or ``None`` (nothing folded); ``fold_axis`` one of :data:`FOLD_AXES`, ``tail_block`` one of
    :data:`TAIL_BLOCKS`.
    """

    level: int | str | None
    fold_axis: str = PAPER_FOLD_AXIS
    tail_block: str = PAPER_TAIL_BLOCK

    @classmethod
    def of(cls, group: Mapping[str, Any]) -> FoldSettings:
        """A group's fold options, unchecked; optimizers without a ``tail_block`` option (Muon,
        Adam-mini) average tails over real entries."""
        return cls(group["level"], group["fold_axis"], group.get("tail_block", PAPER_TAIL_BLOCK))

    def plan(self, p: torch.Tensor) -> FoldPlan | None:
        """How ``p`` is folded; ``None`` (stored in full) for ``level=None`` or 1-d ``p``."""
        if self.level is None or p.dim() < 2:
            return None
        return _plan(tuple(p.shape), self.level, self.fold_axis, self.tail_block)

    def check_fits(self, params: Iterable[torch.Tensor]) -> None:
        """The level rule: a level whose blocks are longer than every axis of one of the group's
        matrices is refused, naming the largest level all of them allow."""
        if not isinstance(self.level, int):
            return
        shapes = [matrix_shape(p.shape) for p in params if p.dim() >= 2]
        if not shapes:
            return
        smallest = min(shapes, key=max)
        if 2**self.level > max(smallest):
            largest = max(smallest).bit_length() - 1
            raise OptionError(
                "level",
                f"level {self.level} makes blocks of {2**self.level} entries, longer than every "
                f"axis of the {smallest[0]} x {smallest[1]} matrices; the largest level these "
                f"matrices allow is {largest} ('mini' folds each whole axis)",
            )


def validate_fold_settings(group: Mapping[str, Any]) -> FoldSettings:
    """Check the folding keywords of a param group (``level``, ``fold_axis``, ``tail_block``
    where the optimizer has it, ``residual``) and that its level fits the group's matrices."""
    settings = FoldSettings.of(group)
    check_level(settings.level)
    require_choice("fold_axis", settings.fold_axis, FOLD_AXES)
    require_choice("tail_block", settings.tail_block, TAIL_BLOCKS)
    if not float(group["residual"]) >= 0:
        raise OptionError(
            "residual", f"residual must be a bool or a scale >= 0, got {group['residual']!r}"
        )
    settings.check_fits(group["params"])
    return settings


def make_plan(
    shape: torch.Size | tuple[int, ...],
    level: int | str,
    fold_axis: str,
    tail_block: str = PAPER_TAIL_BLOCK,
) -> FoldPlan:
    """Plan the fold of a tensor of ``shape``, checking the settings first (the optimizers check
    a group's once, when it is added, and plan through :meth:`FoldSettings.plan`).

    ``fold_axis="larger"`` folds the larger dim (ties: the last), the paper's convention that makes
    FOAM-Mini keep one value per row of the smaller dim; ``"last"`` always folds the last dim of
    the 2-d view, as the authors' release does. ``level="mini"`` is one block over the whole fold
    axis. A level longer than every axis is refused when a group is added
    (:meth:`FoldSettings.check_fits`); one longer than the last axis only (``fold_axis="last"``)
    folds that axis as one block: with ``tail_block="mean"`` its mean (the matrix's FOAM-Mini
    along it, said once per shape), with ``"zero_pad"`` the release's one zero-padded block
    (sum / 2**level).
    """
    check_level(level)
    if level is None:
        raise ValueError("level None means no folding: there is no plan to make")
    require_choice("fold_axis", fold_axis, FOLD_AXES)
    require_choice("tail_block", tail_block, TAIL_BLOCKS)
    return _plan(tuple(shape), level, fold_axis, tail_block)


def fold_axis_index(shape: torch.Size | tuple[int, ...], fold_axis: str) -> int:
    """The axis of the 2-d view (0 or 1) that ``fold_axis`` folds in a tensor of ``shape``."""
    rows, cols = matrix_shape(shape)
    return 1 if fold_axis == "last" or cols >= rows else 0


@functools.cache
def _plan(shape: tuple[int, ...], level: int | str, fold_axis: str, tail_block: str) -> FoldPlan:
    """:func:`make_plan` for checked settings, cached: the optimizers plan at every step."""
    rows, cols = matrix_shape(shape)
    axis = fold_axis_index(shape, fold_axis)
    length = cols if axis == 1 else rows
    block = length if level == "mini" else 2**level
    if block > length and tail_block == PAPER_TAIL_BLOCK:
        log.warning(
            "fold level %s makes blocks of %d entries, but a parameter of shape %s has only %d "
            "along its fold axis: folding it as one block over that axis (its FOAM-Mini)",
            level,
            block,
            shape,
            length,
        )
        block = length
    return FoldPlan(rows=rows, cols=cols, axis=axis, block=block, tail_block=tail_block)


def fold_plan(p: torch.Tensor, group: Mapping[str, Any]) -> FoldPlan | None:
    """How ``p`` is folded in a group checked by :func:`validate_fold_settings`."""
    return FoldSettings.of(group).plan(p)


def blocks_of(x: torch.Tensor, plan: FoldPlan) -> list[torch.Tensor]:
    """Views of the full-size 2-d ``x`` by block: the full blocks as one 3-d view whose block
    axis has ``plan.block`` entries, then (non-divisible lengths only) the shorter tail block.
    Writing into a view writes into ``x``."""
    full, block, cut = plan.full_blocks, plan.block, plan.full_blocks * plan.block
    if plan.axis == 1:
        views = [x[:, :cut].view(plan.rows, full, block)] if full else []
        return views + ([x[:, cut:]] if plan.tail else [])
    views = [x[:cut].view(full, block, plan.cols)] if full else []
    return views + ([x[cut:]] if plan.tail else [])


def values_of(y: torch.Tensor, plan: FoldPlan) -> list[torch.Tensor]:
    """Views of the folded ``y`` that broadcast over the matching :func:`blocks_of` views.

    Broadcasting is how E(y) is applied without materialising it as a full-size tensor.
    """
    full = plan.full_blocks
    if plan.axis == 1:
        views = [y[:, :full].unsqueeze(-1)] if full else []
        return views + ([y[:, full:]] if plan.tail else [])
    views = [y[:full].unsqueeze(1)] if full else []
    return views + ([y[full:]] if plan.tail else [])


def block_views(
    x: torch.Tensor, y: torch.Tensor, plan: FoldPlan
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs ``(blocks of x, values of y)`` for in-place block-wise ops like ``x += E(y)``."""
    return zip(blocks_of(x, plan), values_of(y, plan), strict=True)


def fold(x: torch.Tensor, plan: FoldPlan) -> torch.Tensor:
    """A(x): the mean of each block. The tail block is the mean of its real entries, or with
    ``tail_block="zero_pad"`` their sum divided by the full block size."""
    block_axis = 2 if plan.axis == 1 else 1
    parts = []
    cut = plan.full_blocks * plan.block
    if plan.full_blocks:
        main = x[:, :cut] if plan.axis == 1 else x[:cut]
        shape = (
            (plan.rows, plan.full_blocks, plan.block)
            if plan.axis == 1
            else (plan.full_blocks, plan.block, plan.cols)
        )
        parts.append(main.reshape(shape).mean(dim=block_axis))
    if plan.tail:
        tail = x[:, cut:] if plan.axis == 1 else x[cut:]
        if plan.tail_block == "zero_pad":
            parts.append(tail.sum(dim=plan.axis, keepdim=True).div_(plan.block))
        else:
            parts.append(tail.mean(dim=plan.axis, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=plan.axis)


def unfold(y: torch.Tensor, plan: FoldPlan) -> torch.Tensor:
    """E(y): each block value repeated over its block, truncated to the full size."""
    out = y.new_empty((plan.rows, plan.cols))
    for blocks, values in block_views(out, y, plan):
        blocks.copy_(values.expand_as(blocks))
    return out


def residual(
    g: torch.Tensor, g_folded: torch.Tensor, plan: FoldPlan, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``R = g - E(g_folded)``, the detail the fold loses, written into ``out`` (may be ``g``)."""
    out = torch.empty_like(g) if out is None else out
    pairs = zip(blocks_of(out, plan), blocks_of(g, plan), values_of(g_folded, plan), strict=True)
    for r, gb, v in pairs:
        torch.sub(gb, v, out=r)
    return out


def add_unfolded_(x: torch.Tensor, y: torch.Tensor, plan: FoldPlan) -> torch.Tensor:
    """``x += E(y)`` in place, without materialising ``E(y)``."""
    for blocks, values in block_views(x, y, plan):
        blocks.add_(values)
    return x


def unfold_with_residual(
    g: torch.Tensor, g_folded: torch.Tensor, folded: torch.Tensor, plan: FoldPlan, rho: float
) -> torch.Tensor:
    """``E(folded) + rho * R``: a folded moment restored to full size, with the residual
    ``R = g - E(A(g))`` (the detail the fold loses) re-added at scale ``rho``.

    ``g`` is the 2-d gradient view, ``g_folded = A(g)`` and ``folded`` a folded state of the same
    plan; the result is a new tensor and the only full-size temporary.
    """
    out = residual(g, g_folded, plan)
    if rho != 1.0:
        out.mul_(rho)
    return add_unfolded_(out, folded, plan)


def folded_numel(plan: FoldPlan | None, numel: int) -> int:
    """Elements of one moment: the folded shape's, or the full tensor's when not folded."""
    return numel if plan is None else math.prod(plan.folded_shape)
