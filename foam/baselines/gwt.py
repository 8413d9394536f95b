"""GWT (Wen et al., 2025): Adam moments on the Haar-wavelet approximation of each gradient row.

Reference: ``WaveAdamW`` of github.com/zqOuO/GWT (``galore_torch/waveadamw.py``, HEAD ``58b8ccc``),
GitHub-only; tests compare against golden trajectories in ``tests/data/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard

from foam.errors import OptionError
from foam.hparams import group_defaults, signature_defaults
from foam.lowrank import CompressedAdamW, CompressedStep, limit_norm_growth
from foam.numerics import compute_dtype, resolve_dtype
from foam.param_groups import ParamSplit
from foam.registry import (
    COMMON_DEFAULTS,
    OTHERS,
    adam_settings,
    method_groups,
    register,
    with_adamw_for_others,
)
from foam.shard_blocks import local_shape, mesh_group, placed_zeros
from foam.shard_sums import PartialSums
from foam.sharded_steps import apply_update, normalized_moments
from foam.sharding import LayoutCheck, ShardingNotSupported, is_sharded, local
from foam.state import count_step, new_step_counter, run_closure

_SQRT_HALF = math.sqrt(0.5)


def mini_level(width: int) -> int:
    """The level that leaves one approximation coefficient per row: ``ceil(log2(width))``."""
    return (width - 1).bit_length()


def resolve_level(level: int | str, width: int) -> int:
    """``level`` as an int for rows of ``width`` entries; ``"mini"`` -> ``mini_level(width)``."""
    if level == "mini":
        return mini_level(width)
    if not isinstance(level, int) or isinstance(level, bool) or level < 1:
        raise OptionError("level", f"level must be an int >= 1 or 'mini', got {level!r}")
    if level > mini_level(width):
        raise OptionError(
            "level",
            f"wavelet level {level} is beyond rows of {width} entries, which reach one "
            f"coefficient at level {mini_level(width)}; use a smaller level or 'mini'",
        )
    return level


def approx_width(width: int, level: int) -> int:
    """Entries per row after ``level`` Haar steps (an odd input is zero-padded by one)."""
    for _ in range(level):
        width = (width + 1) // 2
    return width


def transforms_alone(shape: tuple[int, ...], dim: int, ranks: int, level: int) -> bool:
    """Whether each rank's shard of a ``shape`` matrix sharded by ``dim`` over ``ranks`` takes
    its level-``level`` wavelet alone: a row shard always (each row is its own signal), as does
    one rank's; a column shard when its width is a multiple of ``2**level`` (no pair straddles
    two ranks, no level pads)."""
    return dim == 0 or ranks == 1 or (shape[1] // ranks) % 2**level == 0


def wavelet_layout(level: int | str | None) -> LayoutCheck:
    """The FSDP2 layout rule (``foam.registry.shard_dims``) of GWT at ``level``: columns only
    where ``transforms_alone``, else rows, which any level steps exactly."""

    def accepts(shape: tuple[int, ...], dim: int, ranks: int) -> bool:
        return level is None or transforms_alone(shape, dim, ranks, resolve_level(level, shape[1]))

    return accepts


def haar_dwt(x: torch.Tensor, level: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Orthonormal Haar DWT along the last axis: ``(A_L, [D_L, ..., D_1])``.

    Each step pads an odd-length input with one trailing zero (pywt's ``"zero"`` mode for Haar)
    and maps pairs to ``((a + b) / sqrt 2, (a - b) / sqrt 2)``.
    """
    details = []
    for _ in range(level):
        if x.shape[-1] % 2:
            x = F.pad(x, (0, 1))
        even, odd = x[..., 0::2], x[..., 1::2]
        details.append((even - odd) * _SQRT_HALF)
        x = (even + odd) * _SQRT_HALF
    return x, details[::-1]


def haar_idwt(approx: torch.Tensor, details: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``haar_dwt`` (details coarsest first); drops the padding of odd levels."""
    x = approx
    for detail in details:
        x = x[..., : detail.shape[-1]]
        x = torch.stack(((x + detail) * _SQRT_HALF, (x - detail) * _SQRT_HALF), dim=-1)
        x = x.flatten(-2)
    return x


class GWT(CompressedAdamW):
    """HF-style AdamW whose moments keep only the level-``level`` Haar approximation of each row.

    For a 2-d parameter ``G`` (``rows x n``) in a group whose ``level`` is not ``None``, each row
    is an independent signal (the transform runs along the last axis, as the reference):

    1. ``A_L, D_L..D_1 = haar_dwt(G)``; Adam moments of ``A_L`` only, ``N = m / (sqrt(v) + eps)``;
    2. Fira's norm-growth limiter on ``N`` (divisor ``lam``; ``norm_growth_limit=None`` disables);
    3. the stateless details are normalised by their parent's Adam denominator, ``D_L / (den
       lam)``, then ``den`` is repeated twice per entry (and cropped) for ``D_{L-1}``, and so on;
    4. ``update = alpha * haar_idwt(N, details)`` cropped to ``n``; ``W -= lr sqrt(bc2)/bc1
       update``, then decoupled decay with the group lr.

    ``level="mini"`` is **GWT-Mini**, which has no public definition (the GWT paper and code have
    none; the FOAM paper reports it without defining it): here it is GWT at ``ceil(log2 n)``, the
    level that leaves one approximation coefficient -- one ``m`` and one ``v`` -- per row,
    analogous to FOAM-Mini. Other parameters take HF-style AdamW. Betas default to the paper's
    (0.9, 0.95); eps to the reference's 1e-6.

    State per compressed parameter: ``exp_avg``, ``exp_avg_sq`` (``rows x ceil(n / 2**level)``
    after per-level padding), ``grad_norm`` (one element, with the limiter), all ``state_dtype``;
    plus the step counter.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        level: int | str | None = 2,
        alpha: float = 0.25,
        norm_growth_limit: float | None = 1.01,
        state_dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__(params, group_defaults(locals()))

    def validate_group(self, group: dict[str, Any]) -> None:
        limit = group["norm_growth_limit"]
        if limit is not None and not limit >= 1.0:
            raise OptionError(
                "norm_growth_limit", f"norm_growth_limit must be >= 1 or None, got {limit!r}"
            )
        for p in group["params"]:
            self.level_for(p, group)  # raises for a level beyond the matrix
        self.check_shards(group)

    @staticmethod
    def level_for(p: torch.Tensor, group: dict[str, Any]) -> int | None:
        """The wavelet level of ``p``; ``None`` when it takes uncompressed AdamW."""
        if group["level"] is None or p.dim() != 2:
            return None
        return resolve_level(group["level"], p.shape[-1])

    def compressed_shape(self, p: torch.Tensor, group: dict[str, Any]) -> tuple[int, ...] | None:
        level = self.level_for(p, group)
        return None if level is None else (p.shape[0], approx_width(p.shape[1], level))

    def extra_state_shapes(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, tuple]:
        if self.level_for(p, group) is None or group["norm_growth_limit"] is None:
            return {}
        return {"grad_norm": ()}

    def compress(
        self, g: torch.Tensor, state: dict[str, Any], group: dict[str, Any], t: int
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return haar_dwt(g, resolve_level(group["level"], g.shape[-1]))

    def expand(self, step: CompressedStep) -> torch.Tensor:
        return self.expanded(
            step.g, step.normalized, step.denom, step.context, step.state, step.group, step.t
        )

    @staticmethod
    def expanded(
        g: torch.Tensor,
        normalized: torch.Tensor,
        denom: torch.Tensor,
        details: list[torch.Tensor],
        state: dict[str, Any],
        group: dict[str, Any],
        t: int,
        norm: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Steps 2-4 of the class docstring; ``norm`` is the whole matrix's ``||N||`` when
        ``normalized`` is one rank's shard of it."""
        limiter: torch.Tensor | float = 1.0
        if group["norm_growth_limit"] is not None:
            normalized, limiter = limit_norm_growth(
                normalized, local(state["grad_norm"]), t == 1, group["norm_growth_limit"], norm
            )
        rows = []
        for detail in details:
            rows.append(detail / (denom[..., : detail.shape[-1]] * limiter))
            denom = denom.repeat_interleave(2, dim=-1)
        update = haar_idwt(normalized, rows)[..., : g.shape[-1]]
        return update.mul_(group["alpha"])

    # -- the sharded (FSDP2) step ----------------------------------------------------------------

    def check_shards(self, group: dict[str, Any]) -> None:
        """A row shard transforms its rows alone; a column shard only when its width is a
        multiple of ``2**level`` (the wavelet's pairs then never straddle two ranks, and no
        level pads): otherwise one line says what fits."""
        for index, p in enumerate(group["params"]):
            level = self.level_for(p, group)
            if level is None or not is_sharded(p) or not isinstance(p.placements[0], Shard):
                continue
            ranks = p.device_mesh.size()
            if not transforms_alone(tuple(p.shape), p.placements[0].dim, ranks, level):
                width = p.shape[1] // ranks
                raise ShardingNotSupported(
                    f"GWT under FSDP2: parameter {index} of group {group.get('name', '')!r} "
                    f"(shape {tuple(p.shape)}) is sharded by the columns its level-{level} "
                    f"wavelet runs along, {width} per rank, which 2**{level} does not divide, so "
                    "a wavelet pair would straddle two ranks; use a level whose 2**level divides "
                    f"{width}, shard it by rows, or trainer.parallelism=ddp"
                )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """On DTensor parameters (FSDP2) each rank transforms its shard's rows (or its aligned
        columns, ``check_shards``) and the limiter's norms are summed across ranks in one
        ``PartialSums`` reduction a step."""
        ranks = mesh_group(p for g in self.param_groups for p in g["params"])
        if ranks is None:
            return super().step(closure)
        loss = run_closure(closure)
        sums = PartialSums(ranks)
        begun = [
            self._begin_shard(p, group, sums)
            for group in self.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        sums.reduce()
        for p, group, state, t, g, details, normalized, denom, norm in begun:
            update = normalized
            if details is not None:
                whole = None if norm is None else norm.sqrt()
                update = self.expanded(g, normalized, denom, details, state, group, t, whole)
            apply_update(p, update, group, t)
        return loss

    def _begin_shard(self, p: torch.Tensor, group: dict[str, Any], sums: PartialSums) -> tuple:
        if p.grad.is_sparse:
            raise RuntimeError("GWT does not support sparse gradients")
        state = self.state[p]
        if not state:
            self._init_shard_state(p, group)
        t = count_step(state)
        g = local(p.grad).to(compute_dtype(p.dtype))
        level = self.level_for(p, group)
        low, details = (g, None) if level is None else haar_dwt(g, level)
        normalized, denom = normalized_moments(state, low, group)
        norm = None
        if level is not None and group["norm_growth_limit"] is not None:
            norm = sums.add(normalized.square().sum())
        return p, group, state, t, g, details, normalized, denom, norm

    def _init_shard_state(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        """Moments with ``p``'s placement (a row shard keeps its rows' coefficients, an aligned
        column shard its columns'), so DCP reshards them."""
        state, shape = self.state[p], self.compressed_shape(p, group)
        dtype = resolve_dtype(group["state_dtype"], p.dtype)
        state["step"] = new_step_counter()
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = (
                torch.zeros_like(p, dtype=dtype)
                if shape is None
                else placed_zeros(p, shape, p.placements[0], dtype)
            )
        if shape is not None and group["norm_growth_limit"] is not None:
            state["grad_norm"] = torch.zeros((), dtype=dtype, device=local(p).device)

    def planned_param_numel(self, p: torch.Tensor, group: dict[str, Any], per_rank: bool) -> int:
        """``p``'s share of the state on this rank (``per_rank``): its shard of the transformed
        moments and the replicated norm; otherwise as ``CompressedAdamW`` counts it."""
        shape = self.compressed_shape(p, group)
        if not per_rank or shape is None or not is_sharded(p):
            return super().planned_param_numel(p, group, per_rank)
        moments = 2 * math.prod(local_shape(p, shape, p.placements[0]))
        return moments + (group["norm_growth_limit"] is not None)


OPTIONS = ("alpha", "norm_growth_limit", "state_dtype")
_DEFAULTS = {**signature_defaults(GWT, "eps", *OPTIONS), **OTHERS}


def _build(split: ParamSplit, hp: dict[str, Any], level: int | str) -> torch.optim.Optimizer:
    groups = method_groups(split, {"level": level}, {"level": None}, hp)
    gwt = GWT(groups, **adam_settings(hp), **{k: hp[k] for k in OPTIONS})
    return with_adamw_for_others(split, gwt, hp, eps=COMMON_DEFAULTS["eps"])


def _gwt_layout(settings: Mapping[str, Any]) -> LayoutCheck:
    return wavelet_layout(settings["level"])


def _gwt_mini_layout(settings: Mapping[str, Any]) -> LayoutCheck:
    return wavelet_layout("mini")


@register("gwt", shards=True, layout=_gwt_layout, **signature_defaults(GWT, "level"), **_DEFAULTS)
def _gwt(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """GWT on the attention/MLP matrices (level 2, alpha 0.25: the paper's and the GWT scripts')."""
    return _build(split, hp, hp["level"])


@register("gwt_mini", shards=True, layout=_gwt_mini_layout, **_DEFAULTS)
def _gwt_mini(split: ParamSplit, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """GWT-Mini: GWT at the level that leaves one state per row (an assumption, see ``GWT``)."""
    return _build(split, hp, "mini")
