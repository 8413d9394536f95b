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
* **One launch per step.** All folded matrices of a device and dtypes are one launch over
  all their tiles, whatever their shapes: a table made once on the device says where each
  matrix's tensors are, its geometry and its tile *kind* (tile shape, one pass or two), and
  the kernel has one branch per kind that occurs, so every program runs one compiled shape.
* **Scalars in device memory.** The bias corrections, step size and decay of a step are read
  from a small device tensor that a one-program launch writes before the step's, so the step's
  launch has the same arguments at every step and a CUDA graph that captured it stays right.

With ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how the tests check it;
``tests/foam/test_triton_codegen.py`` compiles it for sm_90 without a GPU and reads the machine code.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
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
VECTOR_ELEMENTS = 8
"""Entries of the narrowest 128-bit vector (bfloat16): the multiple a row width or block length
is known to be, for the compiler's vectorisation, up to this."""
STEP_SCALARS = ("bc1", "bc2", "beta1", "beta2", "rho", "rho_sq", "eps", "step_size", "decay")
"""What a step's launch reads from the group's device tensor of scalars, in order: the bias
corrections, then ``StepScalars.as_list()``."""
FIELDS = tl.constexpr(9)
"""Columns of a launch's table: offsets of p, m, v; rows, cols, block, num_blocks; kind; first
program."""


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
def _apply(p_ptrs, live, x, mean, m_hat, v_hat, scalars_ptr):
    """``p = round(p * decay) - step_size * (m_hat + rho R) / (sqrt(v_hat + rho_sq R^2) + eps)``
    with ``R = g - mean``, over one tile whose block values are given per entry. The scalars
    are read here, where they are used, so that they hold no registers before."""
    rho, rho_sq, eps = tl.load(scalars_ptr + 4), tl.load(scalars_ptr + 5), tl.load(scalars_ptr + 6)
    step_size, decay = tl.load(scalars_ptr + 7), tl.load(scalars_ptr + 8)
    p = tl.load(p_ptrs, mask=live, other=0.0).to(tl.float32)
    decayed = _rounded(p * decay, p_ptrs.dtype.element_ty).to(tl.float32)
    r = x - mean
    update = (m_hat + rho * r) / (tl.sqrt(v_hat + rho_sq * r * r) + eps)
    tl.store(p_ptrs, _rounded(decayed - step_size * update, p_ptrs.dtype.element_ty), mask=live)


@triton.jit
def _step_matrix(
    p_ptr,  # this matrix's tensors
    g_ptr,
    m_ptr,
    v_ptr,
    program,  # which of the matrix's tiles
    geometry,  # its rows, cols, block, num_blocks (along the fold axis)
    scalars_ptr,  # the step's `STEP_SCALARS`
    ALONG_COLS: tl.constexpr,
    MEAN_OF_SQUARES: tl.constexpr,
    FOLD: tl.constexpr,  # tile extent along the fold axis
    OTHER: tl.constexpr,  # tile extent along the other axis
    KP: tl.constexpr,  # one pass: the block padded to a power of two; 0: two passes
    COLS_MULTIPLE: tl.constexpr,  # what cols, num_blocks and block are known multiples of
    BLOCKS_MULTIPLE: tl.constexpr,
    BLOCK_MULTIPLE: tl.constexpr,
):
    """One tile of one matrix, in place on its parameter and folded states. The geometry is
    loaded here, in the kind's branch: a hint marks the op that made a value, so values shared
    by two branches would take the last branch's hints."""
    rows = tl.load(geometry).to(tl.int32)
    cols = tl.multiple_of(tl.load(geometry + 1).to(tl.int32), COLS_MULTIPLE)
    block = tl.multiple_of(tl.load(geometry + 2).to(tl.int32), BLOCK_MULTIPLE)
    num_blocks = tl.multiple_of(tl.load(geometry + 3).to(tl.int32), BLOCKS_MULTIPLE)
    if ALONG_COLS:
        length, width, state_cols = cols, rows, num_blocks
    else:
        length, width, state_cols = rows, cols, cols
    other_tiles = tl.cdiv(width, OTHER)
    fold_tile = program // other_tiles  # per program, not per entry
    other_at = (program % other_tiles) * OTHER + tl.arange(0, OTHER)
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

    # the folded moments, read once and written once, by the formulas of foam/numerics.py's ema_
    s_at, s_live = _tile(blk, other_at, state_cols, blk < num_blocks, other_live, ALONG_COLS)
    mean = total / count
    beta1, beta2 = tl.load(scalars_ptr + 2), tl.load(scalars_ptr + 3)
    m = tl.load(m_ptr + s_at, mask=s_live, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + s_at, mask=s_live, other=0.0).to(tl.float32)
    m = m + (1.0 - beta1) * (mean - m)
    if MEAN_OF_SQUARES:
        v = v + (1.0 - beta2) * (total_sq / count - v)
    else:
        v = v * beta2 + (1.0 - beta2) * mean * mean
    tl.store(m_ptr + s_at, _rounded(m, m_ptr.dtype.element_ty), mask=s_live)
    tl.store(v_ptr + s_at, _rounded(v, v_ptr.dtype.element_ty), mask=s_live)
    m_hat = m / tl.load(scalars_ptr)
    v_hat = v / tl.load(scalars_ptr + 1)

    if KP > 0:
        mean = _expand(mean, KP, ALONG_COLS)
        m_hat = _expand(m_hat, KP, ALONG_COLS)
        v_hat = _expand(v_hat, KP, ALONG_COLS)
        _apply(p_ptr + at, live, x, mean, m_hat, v_hat, scalars_ptr)
    else:
        for c0 in range(0, block, FOLD):
            at, live = _chunk(start, c0, i, block, length, other_at, other_live, cols, ALONG_COLS)
            x = tl.load(g_ptr + at, mask=live, other=0.0).to(tl.float32)
            _apply(p_ptr + at, live, x, mean, m_hat, v_hat, scalars_ptr)


@triton.jit
def _write_scalars(out_ptr, bc1, bc2, beta1, beta2, rho, rho_sq, eps, step_size, decay):
    """A step's scalars into the device tensor ``_foam_step_kernel`` reads (``STEP_SCALARS``'
    order). They travel as this launch's arguments, copied when it is issued, so the host
    neither waits for the device nor keeps a buffer the device reads later."""
    tl.store(out_ptr, bc1)
    tl.store(out_ptr + 1, bc2)
    tl.store(out_ptr + 2, beta1)
    tl.store(out_ptr + 3, beta2)
    tl.store(out_ptr + 4, rho)
    tl.store(out_ptr + 5, rho_sq)
    tl.store(out_ptr + 6, eps)
    tl.store(out_ptr + 7, step_size)
    tl.store(out_ptr + 8, decay)


@triton.jit
def _foam_step_kernel(
    p_ptr,  # the launch's first matrix and its states; the others by `table_ptr`
    g_ptr,  # the first gradient; the others by `g_offsets_ptr`
    m_ptr,
    v_ptr,
    table_ptr,  # int64 [matrices, FIELDS]
    g_offsets_ptr,  # int64 [matrices]: each gradient's element offset from the first's
    owner_ptr,  # int32 [programs]: the matrix each program steps
    scalars_ptr,  # float32 [len(STEP_SCALARS)]: this step's, written by `_write_scalars`
    KINDS: tl.constexpr,  # the launch's `Tiles.kind`s: the tile shape and hints of each
    MEAN_OF_SQUARES: tl.constexpr,
    P_ALIGN: tl.constexpr,  # elements every offset of the tables is a multiple of
    G_ALIGN: tl.constexpr,
    S_ALIGN: tl.constexpr,
):
    program = tl.program_id(0)
    matrix = tl.load(owner_ptr + program)
    row = table_ptr + matrix * FIELDS
    p_ptr += tl.multiple_of(tl.load(row), P_ALIGN)
    m_ptr += tl.multiple_of(tl.load(row + 1), S_ALIGN)
    v_ptr += tl.multiple_of(tl.load(row + 2), S_ALIGN)
    g_ptr += tl.multiple_of(tl.load(g_offsets_ptr + matrix), G_ALIGN)
    kind = tl.load(row + 7)
    program -= tl.load(row + 8).to(tl.int32)
    for k in tl.static_range(len(KINDS)):  # one branch per tile shape; a program takes one
        if kind == k:
            _step_matrix(
                p_ptr,
                g_ptr,
                m_ptr,
                v_ptr,
                program,
                row + 3,
                scalars_ptr,
                KINDS[k][0],
                MEAN_OF_SQUARES,
                KINDS[k][1],
                KINDS[k][2],
                KINDS[k][3],
                KINDS[k][4],
                KINDS[k][5],
                KINDS[k][6],
            )


@dataclass(frozen=True)
class Tiles:
    """How one matrix is tiled: its ``kind`` (the kernel's compile-time tile shape and hints)
    and how many programs cover it."""

    along_cols: bool
    fold: int
    other: int
    kp: int  # 0: two passes
    cols_multiple: int  # of which the row width is a multiple (as far as 128-bit vectors care)
    blocks_multiple: int  # the same of the number of blocks (an along-columns state's width)
    block_multiple: int
    programs: int

    @property
    def kind(self) -> tuple[bool, int, int, int, int, int, int]:
        """What ``_step_matrix`` is compiled for (the order the kernel reads): matrices of one
        kind share a branch."""
        return (
            self.along_cols,
            self.fold,
            self.other,
            self.kp,
            self.cols_multiple,
            self.blocks_multiple,
            self.block_multiple,
        )

    @classmethod
    def of(cls, plan: FoldPlan) -> Tiles:
        """Tiles of ``TILE_ELEMENTS``: blocks up to ``ONE_PASS_BLOCK`` (``TILE_ELEMENTS //
        MIN_ROW_RUN`` along the rows) whole in a tile, several to a tile where they are powers
        of two; rows of up to ``ROW_RUN`` columns where the matrix has them. A longer block is
        walked twice by each program of a band across it: ``2 * ROW_RUN`` of a row's entries at
        a time along the columns, ``MIN_ROW_RUN`` columns wide along the rows (FOAM-Mini of a
        tall matrix: a band per 32 columns, so a 512-wide one has 16 programs, not 4).

        Rows whose width is no multiple of a vector (LLaMA-1B's 5461) start at addresses no
        128-bit access can reach, so their entries move one at a time, each with its own 64-bit
        address: those matrices get tiles of half the entries, which keeps the registers of a
        thread within the occupancy bound (a walk by phase that kept 128-bit accesses was slower:
        ``results/bench/gpu_nvidia_h200.md``)."""
        along_cols = plan.axis == 1
        length, width = (plan.cols, plan.rows) if along_cols else (plan.rows, plan.cols)
        cols_multiple = math.gcd(plan.cols, VECTOR_ELEMENTS)
        tile = TILE_ELEMENTS if cols_multiple == VECTOR_ELEMENTS else TILE_ELEMENTS // 2
        kp = triton.next_power_of_2(plan.block)
        if kp > (ONE_PASS_BLOCK if along_cols else tile // MIN_ROW_RUN):
            kp, fold = 0, ROW_RUN * 2 if along_cols else tile // MIN_ROW_RUN
        elif kp != plan.block:
            fold = kp
        elif along_cols:
            fold = max(kp, min(triton.next_power_of_2(length), ROW_RUN))
        else:
            fold = max(kp, min(triton.next_power_of_2(length), tile // ROW_RUN))
        other = max(1, tile // fold)
        if not along_cols:
            other = min(other, ROW_RUN)
        other = min(other, triton.next_power_of_2(width))
        fold_tiles = plan.num_blocks if kp == 0 else triton.cdiv(plan.num_blocks, fold // kp)
        return cls(
            along_cols,
            fold,
            other,
            kp,
            cols_multiple,
            math.gcd(plan.num_blocks, VECTOR_ELEMENTS),
            math.gcd(plan.block, VECTOR_ELEMENTS),
            fold_tiles * triton.cdiv(width, other),
        )


def _addressing(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], int]:
    """Each of ``tensors``' element offset from the first's, and the elements every address is a
    multiple of, as far as it matters: a 128-bit vector's worth when all are 16-byte aligned (the
    caching allocator's blocks are), else 1."""
    size = tensors[0].element_size()
    addresses = [t.data_ptr() for t in tensors]
    aligned = all(a % VECTOR_BYTES == 0 for a in addresses)
    return tuple((a - addresses[0]) // size for a in addresses), (
        VECTOR_BYTES // size if aligned else 1
    )


Launch = tuple[tuple[int], list[Any], dict[str, Any]]
"""One launch of ``_foam_step_kernel``: its grid, positional and keyword arguments."""


class TritonGroup:
    """Folded matrices of one device and dtypes stepped by one launch of ``_foam_step_kernel``
    over all their tiles (as torch's fused AdamW steps its tensors in one multi-tensor launch).

    What stays put between steps is on the device from the start: a table of each matrix's
    parameter and state offsets, geometry, tile kind and first program, the matrix of each
    program, and a tensor of the step's scalars (``STEP_SCALARS``). A step writes its scalars
    into that tensor in place (``write_scalars``) and refreshes the gradients' offsets only when
    the gradients moved relative to each other (never, when they live in one persistent buffer),
    so a warm step allocates nothing, never synchronises and costs the host the same for any
    number of matrices, beyond reading each gradient's address. The step's kernel (``launch``)
    then has the same arguments at every step, which is what a CUDA graph needs: captured once,
    it is replayed after ``write_scalars`` with the current step's bias corrections and step
    size, as torch's capturable AdamW reads its lr and step from tensors.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        plans: list[FoldPlan],
    ) -> None:
        self.tensors = params[0], exp_avgs[0], exp_avg_sqs[0]
        tiles = [Tiles.of(plan) for plan in plans]
        self.kinds = tuple(dict.fromkeys(t.kind for t in tiles))
        (p_at, p_align), (m_at, m_align), (v_at, v_align) = map(
            _addressing, (params, exp_avgs, exp_avg_sqs)
        )
        firsts = itertools.accumulate((t.programs for t in tiles), initial=0)
        geometry = [(plan.rows, plan.cols, plan.block, plan.num_blocks) for plan in plans]
        rows = [
            (*at, *shape, self.kinds.index(t.kind), first)
            for *at, shape, t, first in zip(p_at, m_at, v_at, geometry, tiles, firsts, strict=False)
        ]  # firsts has one more: the end
        self.device = device = params[0].device
        self.table = torch.tensor(rows, dtype=torch.int64).to(device)
        programs = torch.tensor([t.programs for t in tiles])
        self.owner = torch.repeat_interleave(
            torch.arange(len(plans), dtype=torch.int32), programs
        ).to(device)
        self.g_offsets = torch.zeros(len(plans), dtype=torch.int64, device=device)
        self.g_moved_from: tuple[int, ...] | None = None
        self.scalars = torch.zeros(len(STEP_SCALARS), dtype=torch.float32, device=device)
        self.constants = {"KINDS": self.kinds, "P_ALIGN": p_align, "S_ALIGN": min(m_align, v_align)}

    def write_scalars(self, corrections: tuple[float, float], scalars: StepScalars) -> None:
        """This step's bias corrections and scalars into ``self.scalars``, in place, by one
        launch on the device's current stream (ordered before the step's kernel)."""
        with self._on_device():
            _write_scalars[(1,)](self.scalars, *corrections, *scalars.as_list())

    def launch(self, grads: list[torch.Tensor], mean_of_squares: bool) -> Launch:
        """The kernel launch of one step (what tests/foam/test_triton_codegen.py compiles for sm_90):
        the same arguments at every step while the gradients stay put; what changes between
        steps is in ``self.scalars``."""
        offsets, g_align = _addressing(grads)
        if offsets != self.g_moved_from:
            self.g_offsets.copy_(torch.tensor(offsets, dtype=torch.int64), non_blocking=True)
            self.g_moved_from = offsets
        p, m, v = self.tensors
        args = [p, grads[0], m, v, self.table, self.g_offsets, self.owner, self.scalars]
        constants = {
            **self.constants,
            "MEAN_OF_SQUARES": mean_of_squares,
            "G_ALIGN": g_align,
            "num_warps": NUM_WARPS,
        }
        return (self.owner.numel(),), args, constants

    def step(
        self, grads: list[torch.Tensor], corrections: tuple[float, float], scalars: StepScalars
    ) -> None:
        """One fused FOAM step of every matrix, in place on parameters and states."""
        self.write_scalars(corrections, scalars)
        grid, args, constants = self.launch(grads, scalars.mean_of_squares)
        with self._on_device():
            _foam_step_kernel[grid](*args, **constants)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """Triton launches on the current GPU: make it this group's."""
        on_gpu = self.device.type == "cuda"
        return torch.cuda.device(self.device) if on_gpu else contextlib.nullcontext()
