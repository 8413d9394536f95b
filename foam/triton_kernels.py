"""The fused FOAM step on CUDA as a Triton kernel (imported by foam/fused.py only when needed).

Same arithmetic as foam/csrc/foam_step.cpp (FOAM_SPEC section 2), laid out for the GPU's memory
system, since FOAM's case is moving fewer bytes than AdamW:

* **Contiguous 2-d tiles.** A program owns a rectangle of the matrix in its row-major layout,
  addressed as ``row * cols + col`` from two ranges, so Triton sees runs of consecutive addresses
  and issues 128-bit loads and stores; no per-element division finds an entry's block. The blocks
  of a tile are a reshape of it (``[.., blocks, block]`` or ``[blocks, block, ..]``), which needs
  no data movement. Folding along the rows (FOAM-Mini of a tall matrix) reads rows of the same
  tile shape, so it never makes strided loads either.
* **One pass where a block fits in a tile** (FOAM-1 to FOAM-8 along the columns, to FOAM-6
  along the rows): gradient and parameter are loaded once, the folded states read and written
  once, the parameter written once. Longer blocks (FOAM-Mini of a large matrix) give a program
  one block across a band of rows or columns and walk it twice: once for its sums, once for the
  update.
* **One launch per group of like matrices.** Matrices with one shape, fold, dtypes and bias
  corrections (a transformer's q/k/v/o, say) are one launch: the second grid axis picks the
  matrix, and a table of element offsets from the group's first tensors says where its tensors
  are.

With ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how the tests check it;
``tests/test_triton_codegen.py`` compiles it for sm_90 without a GPU and reads the machine code.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from foam.folding import FoldPlan
from foam.update import StepScalars

TILE_ELEMENTS = 2048
"""Entries of one tile: 16 per thread at 4 warps, two 128-bit vectors of bf16 per tensor."""
ONE_PASS_BLOCK = 256
"""The longest block (padded to a power of two) a tile holds whole, so the step is one pass."""
ROW_RUN = 128
"""Columns of a tile that runs along the rows: 256 bytes of bf16 per row, whole cache lines."""
MIN_ROW_RUN = 32
"""Fewest columns of a one-pass tile folded along the rows (64 bytes of bf16: whole 32-byte
sectors); a taller block than that leaves takes two passes over ``ROW_RUN`` columns instead."""
NUM_WARPS = 4
VECTOR_BYTES = 16


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """float32 ``x`` in ``dtype``, bfloat16 rounded to nearest even by hand: the GPU rounds so
    itself, but the CPU interpreter truncates, and the tests compare against torch's rounding."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN stays NaN
    return x.to(dtype)


@triton.jit
def _tile(fold_at, other_at, cols, fold_live, other_live, ALONG_COLS: tl.constexpr):
    """Element offsets and mask of the 2-d tile of a ``cols``-wide row-major matrix at fold-axis
    positions ``fold_at`` and other-axis positions ``other_at``, in memory order: ``[other,
    fold]`` when folding along the columns, ``[fold, other]`` along the rows."""
    if ALONG_COLS:
        at = other_at[:, None] * cols + fold_at[None, :]
        live = other_live[:, None] & fold_live[None, :]
    else:
        at = fold_at[:, None] * cols + other_at[None, :]
        live = fold_live[:, None] & other_live[None, :]
    return at, live


@triton.jit
def _chunk(start, c0, i, block, length, other_at, other_live, cols, ALONG_COLS: tl.constexpr):
    """``_tile`` of the chunk ``c0 + i`` of the block that begins at fold-axis position
    ``start`` (two-pass mode)."""
    fold_at = start + c0 + i
    return _tile(
        fold_at, other_at, cols, (c0 + i < block) & (fold_at < length), other_live, ALONG_COLS
    )


@triton.jit
def _block_sums(x, BLOCKS: tl.constexpr, KP: tl.constexpr, ALONG_COLS: tl.constexpr):
    """Sum of each block of the tile ``x`` (``BLOCKS`` blocks of ``KP`` entries along the fold
    axis), in the folded state's layout: ``[other, BLOCKS]`` or ``[BLOCKS, other]``."""
    if ALONG_COLS:
        sums = tl.sum(tl.reshape(x, (x.shape[0], BLOCKS, KP)), 2)
    else:
        sums = tl.sum(tl.reshape(x, (BLOCKS, KP, x.shape[1])), 1)
    return sums


@triton.jit
def _expand(y, KP: tl.constexpr, ALONG_COLS: tl.constexpr):
    """E(y) over a tile: each block value of ``y`` (folded layout) repeated ``KP`` times."""
    if ALONG_COLS:
        wide = tl.broadcast_to(y[:, :, None], (y.shape[0], y.shape[1], KP))
        out = tl.reshape(wide, (y.shape[0], y.shape[1] * KP))
    else:
        tall = tl.broadcast_to(y[:, None, :], (y.shape[0], KP, y.shape[1]))
        out = tl.reshape(tall, (y.shape[0] * KP, y.shape[1]))
    return out


@triton.jit
def _apply(p_ptrs, live, x, mean, m_hat, v_hat, rho, rho_sq, eps, step_size, decay):
    """``p = round(p * decay) - step_size * (m_hat + rho R) / (sqrt(v_hat + rho_sq R^2) + eps)``
    with ``R = g - mean``, over one tile whose block values are given per entry."""
    p = tl.load(p_ptrs, mask=live, other=0.0).to(tl.float32)
    decayed = _rounded(p * decay, p_ptrs.dtype.element_ty).to(tl.float32)
    r = x - mean
    update = (m_hat + rho * r) / (tl.sqrt(v_hat + rho_sq * r * r) + eps)
    tl.store(p_ptrs, _rounded(decayed - step_size * update, p_ptrs.dtype.element_ty), mask=live)


@triton.jit
def _foam_step_kernel(
    p_ptr,  # the group's first matrix and its states; the others by `offsets_ptr`
    g_ptr,
    m_ptr,
    v_ptr,
    offsets_ptr,  # int64 [matrices, 4]: element offsets of each one's p, g, m, v from the first's
    rows,
    cols,
    block,
    num_blocks,  # along the fold axis
    bc1,
    bc2,
    beta1,
    beta2,
    rho,
    rho_sq,
    eps,
    step_size,
    decay,
    ALONG_COLS: tl.constexpr,
    MEAN_OF_SQUARES: tl.constexpr,
    FOLD: tl.constexpr,  # tile extent along the fold axis
    OTHER: tl.constexpr,  # tile extent along the other axis
    KP: tl.constexpr,  # one pass: the block padded to a power of two; 0: two passes
    P_ALIGN: tl.constexpr,  # elements every offset of the table is a multiple of
    G_ALIGN: tl.constexpr,
    S_ALIGN: tl.constexpr,
):
    table = offsets_ptr + tl.program_id(1) * 4
    p_ptr += tl.multiple_of(tl.load(table), P_ALIGN)
    g_ptr += tl.multiple_of(tl.load(table + 1), G_ALIGN)
    m_ptr += tl.multiple_of(tl.load(table + 2), S_ALIGN)
    v_ptr += tl.multiple_of(tl.load(table + 3), S_ALIGN)
    if ALONG_COLS:
        length, width, state_cols = cols, rows, num_blocks
    else:
        length, width, state_cols = rows, cols, cols
    other_tiles = tl.cdiv(width, OTHER)
    fold_tile = tl.program_id(0) // other_tiles  # per program, not per entry
    other_at = (tl.program_id(0) % other_tiles) * OTHER + tl.arange(0, OTHER)
    other_live = other_at < width
    i = tl.arange(0, FOLD)

    if KP > 0:  # one pass: the tile holds FOLD // KP whole blocks
        blocks_here: tl.constexpr = FOLD // KP
        blk = fold_tile * blocks_here + tl.arange(0, blocks_here)
        fold_at = fold_tile * blocks_here * block + i
        fold_live = (i < blocks_here * block) & (fold_at < length)  # a block < KP is alone
        at, live = _tile(fold_at, other_at, cols, fold_live, other_live, ALONG_COLS)
        x = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
        total = _block_sums(x, blocks_here, KP, ALONG_COLS)
        total_sq = _block_sums(x * x, blocks_here, KP, ALONG_COLS) if MEAN_OF_SQUARES else total
        count = tl.maximum(tl.minimum(length - blk * block, block), 1).to(tl.float32)
        count = count[None, :] if ALONG_COLS else count[:, None]
    else:  # two passes over one block across the tile's band: its sums, then the update
        blk = fold_tile + tl.arange(0, 1)
        start = fold_tile * block
        total = tl.zeros((OTHER, 1) if ALONG_COLS else (1, OTHER), dtype=tl.float32)
        total_sq = tl.zeros_like(total)
        for c0 in range(0, block, FOLD):
            at, live = _chunk(start, c0, i, block, length, other_at, other_live, cols, ALONG_COLS)
            x = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
            total += _block_sums(x, 1, FOLD, ALONG_COLS)
            if MEAN_OF_SQUARES:
                total_sq += _block_sums(x * x, 1, FOLD, ALONG_COLS)
        count = tl.maximum(tl.minimum(length - start, block), 1).to(tl.float32)

    # the folded moments, read once and written once, by the formulas of foam/optimizer.py's ema_
    s_at, s_live = _tile(blk, other_at, state_cols, blk < num_blocks, other_live, ALONG_COLS)
    mean = total / count
    m = tl.load(m_ptr + s_at, mask=s_live, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + s_at, mask=s_live, other=0.0).to(tl.float32)
    m = m + (1.0 - beta1) * (mean - m)
    if MEAN_OF_SQUARES:
        v = v + (1.0 - beta2) * (total_sq / count - v)
    else:
        v = v * beta2 + (1.0 - beta2) * mean * mean
    tl.store(m_ptr + s_at, _rounded(m, m_ptr.dtype.element_ty), mask=s_live)
    tl.store(v_ptr + s_at, _rounded(v, v_ptr.dtype.element_ty), mask=s_live)
    m_hat = m / bc1
    v_hat = v / bc2

    if KP > 0:
        mean = _expand(mean, KP, ALONG_COLS)
        m_hat = _expand(m_hat, KP, ALONG_COLS)
        v_hat = _expand(v_hat, KP, ALONG_COLS)
        _apply(p_ptr + at, live, x, mean, m_hat, v_hat, rho, rho_sq, eps, step_size, decay)
    else:
        for c0 in range(0, block, FOLD):
            at, live = _chunk(start, c0, i, block, length, other_at, other_live, cols, ALONG_COLS)
            x = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
            _apply(p_ptr + at, live, x, mean, m_hat, v_hat, rho, rho_sq, eps, step_size, decay)


@dataclass(frozen=True)
class Tiles:
    """How one group of like matrices is tiled: the kernel's compile-time shape arguments."""

    along_cols: bool
    fold: int
    other: int
    kp: int  # 0: two passes
    programs: int  # per matrix

    @classmethod
    def of(cls, plan: FoldPlan) -> Tiles:
        """Tiles of ``TILE_ELEMENTS``: blocks up to ``ONE_PASS_BLOCK`` (``TILE_ELEMENTS //
        MIN_ROW_RUN`` along the rows) whole in a tile, several to a tile where they are powers
        of two; rows of up to ``ROW_RUN`` columns where the matrix has them."""
        along_cols = plan.axis == 1
        length, width = (plan.cols, plan.rows) if along_cols else (plan.rows, plan.cols)
        kp = triton.next_power_of_2(plan.block)
        if kp > (ONE_PASS_BLOCK if along_cols else TILE_ELEMENTS // MIN_ROW_RUN):
            kp, fold = 0, ROW_RUN * 2 if along_cols else TILE_ELEMENTS // ROW_RUN
        elif kp != plan.block:
            fold = kp
        elif along_cols:
            fold = max(kp, min(triton.next_power_of_2(length), ROW_RUN))
        else:
            fold = max(kp, min(triton.next_power_of_2(length), TILE_ELEMENTS // ROW_RUN))
        other = max(1, TILE_ELEMENTS // fold)
        if not along_cols:
            other = min(other, ROW_RUN)
        other = min(other, triton.next_power_of_2(width))
        fold_tiles = plan.num_blocks if kp == 0 else triton.cdiv(plan.num_blocks, fold // kp)
        return cls(along_cols, fold, other, kp, fold_tiles * triton.cdiv(width, other))


def _addressing(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], int]:
    """Each of ``tensors``' element offset from the first's, and the elements every address is a
    multiple of, as far as it matters: a 128-bit vector's worth when all are 16-byte aligned (the
    caching allocator's blocks are), else 1. Each address is read once: a step of many small
    matrices is bound by such host work."""
    size = tensors[0].element_size()
    addresses = [t.data_ptr() for t in tensors]
    aligned = all(a % VECTOR_BYTES == 0 for a in addresses)
    return tuple((a - addresses[0]) // size for a in addresses), (
        VECTOR_BYTES // size if aligned else 1
    )


@functools.lru_cache(maxsize=256)
def _offset_table(addresses: tuple[tuple[int, ...], ...], device: torch.device) -> torch.Tensor:
    """The launch's table of element offsets on ``device``, made once per set of addresses (the
    parameters and states stay put; gradients mostly do), so a warm step copies nothing to it."""
    table = torch.tensor(addresses, dtype=torch.int64)
    if device.type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table


Launch = tuple[tuple[int, int], list[Any], dict[str, Any]]
"""One launch of ``_foam_step_kernel``: its grid, positional and keyword arguments."""


def launches(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    plans: list[FoldPlan],
    bias_corrections: list[tuple[float, float]],
    scalars: StepScalars,
) -> Iterator[Launch]:
    """The launches of one step: one per group of matrices with the same plan, dtypes and bias
    corrections (what tests/test_triton_codegen.py compiles for sm_90)."""
    groups: dict[tuple, list[int]] = {}
    for k, (p, g, m, plan, corrections) in enumerate(
        zip(params, grads, exp_avgs, plans, bias_corrections, strict=True)
    ):
        groups.setdefault((plan, p.dtype, g.dtype, m.dtype, corrections), []).append(k)
    for (plan, *_, (bc1, bc2)), members in groups.items():
        tensors = [[ts[k] for k in members] for ts in (params, grads, exp_avgs, exp_avg_sqs)]
        (p_at, p_align), (g_at, g_align), (m_at, m_align), (v_at, v_align) = map(
            _addressing, tensors
        )
        tiles = Tiles.of(plan)
        args = [
            *(ts[0] for ts in tensors),
            _offset_table(
                tuple(zip(p_at, g_at, m_at, v_at, strict=True)), params[members[0]].device
            ),
            plan.rows,
            plan.cols,
            plan.block,
            plan.num_blocks,
            bc1,
            bc2,
            scalars.beta1,
            scalars.beta2,
            scalars.rho,
            scalars.rho_sq,
            scalars.eps,
            scalars.step_size,
            scalars.decay,
        ]
        constants = {
            "ALONG_COLS": tiles.along_cols,
            "MEAN_OF_SQUARES": scalars.mean_of_squares,
            "FOLD": tiles.fold,
            "OTHER": tiles.other,
            "KP": tiles.kp,
            "P_ALIGN": p_align,
            "G_ALIGN": g_align,
            "S_ALIGN": min(m_align, v_align),
            "num_warps": NUM_WARPS,
        }
        yield (tiles.programs, len(members)), args, constants


def triton_step(*step: Any) -> None:
    """One fused FOAM step for every matrix, in place on params and states; the arguments are
    ``launches``'s (the same as foam/fused.py's ``fused_step``, with the gradients second)."""
    for grid, args, constants in launches(*step):
        _foam_step_kernel[grid](*args, **constants)
