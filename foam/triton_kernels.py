"""The fused FOAM step on CUDA as a Triton kernel (imported by foam/fused.py only when needed).

Same arithmetic as foam/csrc/foam_step.cpp (FOAM_SPEC section 2). A program owns ``GROUPS``
folded entries (blocks) of one matrix, in the row-major order of the folded state: it sums their
gradients chunk by chunk, updates the two folded moments, and makes a second pass that writes the
parameter. Each block is ``block`` entries ``stride`` apart starting at its ``base``: consecutive
entries of a row (fold along the columns) or of a column (fold along the rows). One launch per
matrix. With ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how the tests check it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from foam.folding import FoldPlan
from foam.update import StepScalars

ELEMENTS_PER_PROGRAM = 1024


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
def _foam_step_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    rows,
    cols,
    block,
    num_blocks,  # along the fold axis
    n_folded,  # entries of one folded state
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
    GROUPS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    folded = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    live = folded < n_folded
    if ALONG_COLS:
        row = folded // num_blocks
        start = (folded % num_blocks) * block
        base = row * cols + start
        length = tl.minimum(block, cols - start)
        stride = 1
    else:
        col = folded % cols
        start = (folded // cols) * block
        base = start * cols + col
        length = tl.minimum(block, rows - start)
        stride = cols

    total = tl.zeros([GROUPS], dtype=tl.float32)
    total_sq = tl.zeros([GROUPS], dtype=tl.float32)
    for c0 in range(0, block, CHUNK):
        i = c0 + tl.arange(0, CHUNK)
        mask = live[:, None] & (i[None, :] < length[:, None])
        offsets = base[:, None] + i[None, :].to(tl.int64) * stride
        x = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        total += tl.sum(x, axis=1)
        total_sq += tl.sum(x * x, axis=1)

    count = tl.maximum(length, 1).to(tl.float32)
    mean = total / count
    m = tl.load(m_ptr + folded, mask=live, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + folded, mask=live, other=0.0).to(tl.float32)
    m = m + (1.0 - beta1) * (mean - m)
    if MEAN_OF_SQUARES:
        v = v + (1.0 - beta2) * (total_sq / count - v)
    else:
        v = v * beta2 + (1.0 - beta2) * mean * mean
    tl.store(m_ptr + folded, _rounded(m, m_ptr.dtype.element_ty), mask=live)
    tl.store(v_ptr + folded, _rounded(v, v_ptr.dtype.element_ty), mask=live)
    m_hat = (m / bc1)[:, None]
    v_hat = (v / bc2)[:, None]

    for c0 in range(0, block, CHUNK):
        i = c0 + tl.arange(0, CHUNK)
        mask = live[:, None] & (i[None, :] < length[:, None])
        offsets = base[:, None] + i[None, :].to(tl.int64) * stride
        x = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + offsets, mask=mask, other=0.0)
        decayed = _rounded(p.to(tl.float32) * decay, p_ptr.dtype.element_ty).to(tl.float32)
        r = x - mean[:, None]
        update = (m_hat + rho * r) / (tl.sqrt(v_hat + rho_sq * r * r) + eps)
        tl.store(
            p_ptr + offsets, _rounded(decayed - step_size * update, p_ptr.dtype.element_ty), mask
        )


def triton_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    plans: list[FoldPlan],
    bias_corrections: list[tuple[float, float]],
    scalars: StepScalars,
) -> None:
    """One fused FOAM step per matrix, in place on params and states."""
    for p, g, m, v, plan, (bc1, bc2) in zip(
        params, grads, exp_avgs, exp_avg_sqs, plans, bias_corrections, strict=True
    ):
        chunk = min(triton.next_power_of_2(plan.block), ELEMENTS_PER_PROGRAM)
        groups = max(1, ELEMENTS_PER_PROGRAM // chunk)
        n_folded = m.numel()
        _foam_step_kernel[(triton.cdiv(n_folded, groups),)](
            p,
            g,
            m,
            v,
            plan.rows,
            plan.cols,
            plan.block,
            plan.num_blocks,
            n_folded,
            bc1,
            bc2,
            scalars.beta1,
            scalars.beta2,
            scalars.rho,
            scalars.rho_sq,
            scalars.eps,
            scalars.step_size,
            scalars.decay,
            ALONG_COLS=plan.axis == 1,
            MEAN_OF_SQUARES=scalars.mean_of_squares,
            GROUPS=groups,
            CHUNK=chunk,
        )
