"""torch's fused AdamW on FSDP2 shards (CPU), bitwise the step of the whole tensor.

torch's CPU kernel (ATen's ``FusedAdamKernel.cpp``) steps a tensor of ``n`` entries in vectors of
``W`` entries (``at::vec::Vectorized``, one register of the CPU capability: 8 float32 or 16
bfloat16 under AVX2, twice that under AVX512) and its last ``n % W`` entries in scalar code, which
rounds differently (the vector code fuses the moment's lerp into one multiply-add). Threads take
runs of whole 64-byte cache lines, which hold whole vectors, so the rule holds at any thread
count: **entry ``i`` of a call of ``n`` entries is stepped by the vector code iff
``i < n - n % W``**. A rank calling the kernel on its shard would step the shard's own tail by the
scalar code where the whole tensor's call vectorised it (and vice versa), an ulp apart.

``fused_adamw`` therefore steps each shard in up to three calls of the same kernel, each taking
the path the whole tensor's call takes for its entries: the globally vectorised entries in one
call of a multiple of ``W``, the few left over (fewer than ``W``) in a zero-padded buffer of ``W``
entries, and the entries of the whole tensor's scalar tail in a call shorter than ``W``. ``W`` is
measured on the running torch (``vector_width``); where a probe cannot tell the two paths apart
the shard is stepped in one call as before. CUDA's kernel has no such split: its tensors are
stepped as they come.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.optim.adamw import adamw as functional_adamw

from foam.shard_blocks import chunk_range

TASK_BYTES = 64
"""The kernel hands threads whole cache lines of this many bytes."""
_PROBE = {"amsgrad": False, "beta1": 0.9, "beta2": 0.999, "lr": 1e-3, "weight_decay": 0.1}


def _step(pieces: Sequence[Sequence[torch.Tensor]], steps: Sequence[torch.Tensor], **hp) -> None:
    """One fused AdamW call over ``pieces`` of ``(param, grad, exp_avg, exp_avg_sq)``."""
    functional_adamw(
        [p[0] for p in pieces],
        [p[1] for p in pieces],
        [p[2] for p in pieces],
        [p[3] for p in pieces],
        [],
        list(steps),
        fused=True,
        maximize=False,
        **hp,
    )


def _stepped(data: Sequence[torch.Tensor], lengths: Sequence[int]) -> torch.Tensor:
    """``data`` (param, grad, exp_avg, exp_avg_sq of one length) stepped once in calls of
    ``lengths`` entries: the stacked (param, exp_avg, exp_avg_sq) after the step."""
    copies = [t.clone() for t in data]
    pieces = list(zip(*(c.split(list(lengths)) for c in copies), strict=True))
    _step(pieces, [torch.zeros((), dtype=torch.float32) for _ in pieces], eps=1e-8, **_PROBE)
    return torch.stack([copies[0], copies[2], copies[3]])


def _probe_width(dtype: torch.dtype) -> int | None:
    """``W`` of the CPU kernel for ``dtype``, read off its results: an entry that a long call
    steps unlike a one-entry call (all scalar) is a witness of the vector code; a call of
    ``length`` copies of it then steps its first ``length - length % W`` entries as the long
    call and the rest as the one-entry call. ``None`` when no witness turns up or the results
    do not follow that rule."""
    unit = TASK_BYTES // torch.empty((), dtype=dtype).element_size()
    n = 64 * unit
    generator = torch.Generator().manual_seed(0)
    data = [torch.randn(n, generator=generator).to(dtype) for _ in range(4)]
    data[3] = data[3].abs()
    vector, scalar = _stepped(data, [n]), _stepped(data, [1] * n)
    witnesses = (vector != scalar).any(dim=0).nonzero()
    if not len(witnesses):
        return None
    i = int(witnesses[0])

    def scalar_tail(length: int) -> int | None:
        out = _stepped([t[i : i + 1].repeat(length) for t in data], [length])
        is_scalar = (out == scalar[:, i : i + 1]).all(dim=0)
        tail = int(is_scalar.sum())
        is_vector = (out[:, : length - tail] == vector[:, i : i + 1]).all()
        return tail if is_vector and is_scalar[length - tail :].all() else None

    tail = scalar_tail(2 * unit - 1)  # W divides the unit: W - 1 scalar entries
    if tail is None or unit % (tail + 1) or scalar_tail(unit + 1) != (unit + 1) % (tail + 1):
        return None
    return tail + 1


@functools.cache
def vector_width(dtype: torch.dtype) -> int | None:
    """Entries per vector of torch's CPU fused AdamW for ``dtype`` (see the module docstring),
    measured once per process; ``None``: the vector and scalar code agree as far as a probe sees.

    bfloat16/float16 compute in float32 in both paths and round to 16 bits, so their paths part
    too rarely for a probe; their vector is float32's register, ``Vectorized<T>`` being one
    register for every ``T``."""
    width = _probe_width(dtype)
    if width is None and dtype in (torch.bfloat16, torch.float16):
        fp32 = vector_width(torch.float32)
        width = None if fp32 is None else fp32 * 4 // torch.empty((), dtype=dtype).element_size()
    return width


def _global_tail_in_shard(p: DTensor, tail: int) -> int | None:
    """How many of the whole tensor's last ``tail`` entries (row-major) this rank holds; ``None``
    for layouts other than one ``Shard``/``Replicate`` on a 1-d mesh."""
    if p.device_mesh.ndim != 1:
        return None
    placement = p.placements[0]
    if isinstance(placement, Replicate):
        return tail
    if not isinstance(placement, Shard):
        return None
    shape, dim = p.shape, placement.dim
    start, stop = chunk_range(shape[dim], p.device_mesh.size(), p.device_mesh.get_local_rank())
    stride = math.prod(shape[dim + 1 :])
    total = p.numel()
    return sum(start <= flat // stride % shape[dim] < stop for flat in range(total - tail, total))


def _shard_pieces(
    tensors: Sequence[torch.Tensor], p: DTensor
) -> tuple[list[tuple[torch.Tensor, ...]], list[tuple[torch.Tensor, ...]]]:
    """This rank's ``(param, grad, exp_avg, exp_avg_sq)`` cut into calls that each take the
    whole tensor's path (the module docstring), and the padded ``(buffers, originals)`` to copy
    back after the step. One piece, the shard itself, where the rule does not apply."""
    shards = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    width = vector_width(p.dtype)
    tail = None if width is None else _global_tail_in_shard(p, p.numel() % width)
    if tail is None or not all(t.is_contiguous() for t in shards):
        return [tuple(shards)], []
    flat = [t.view(-1) for t in shards]
    vectorised = flat[0].numel() - tail
    left = vectorised % width
    cuts = [vectorised - left, left, tail]
    head, rest, scalar = zip(*(t.split(cuts) for t in flat), strict=True)
    pieces, padded = [head], []
    if left:
        buffers = tuple(torch.zeros(width, dtype=t.dtype) for t in rest)
        for buffer, part in zip(buffers, rest, strict=True):
            buffer[:left].copy_(part)
        pieces.append(buffers)
        padded.append((buffers, rest))
    if tail:
        pieces.append(scalar)
    return pieces, padded


def fused_adamw(
    params: Sequence[torch.Tensor],
    states: Sequence[dict[str, Any]],
    **hyperparams: Any,
) -> None:
    """torch's fused AdamW on ``params`` (their ``.grad``) and ``states`` (``exp_avg``,
    ``exp_avg_sq``, ``step``); a CPU DTensor's shard is cut as the module docstring says."""
    pieces, steps, padded = [], [], []
    for p, state in zip(params, states, strict=True):
        tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"])
        if not isinstance(p, DTensor) or p.device.type != "cpu":
            pieces.append(tensors)
            steps.append(state["step"])
            continue
        cut, copy_back = _shard_pieces(tensors, p)
        pieces += cut
        # the kernel increments each counter it is given: the state's goes with the first piece
        steps += [state["step"]] + [state["step"].clone() for _ in cut[1:]]
        padded += copy_back
    _step(pieces, steps, **hyperparams)
    for buffers, originals in padded:
        for k in (0, 2, 3):  # the kernel writes the param and the moments, not the gradient
            originals[k].copy_(buffers[k][: originals[k].numel()])
