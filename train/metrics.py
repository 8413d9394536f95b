"""Measurements: memory peaks, MFU, and the dtype/byte breakdown logged at start-up."""

from __future__ import annotations

import math
import resource
import sys
from collections import defaultdict
from collections.abc import Iterable

import torch

import foam
from foam.sharding import local

# Dense BF16 tensor-core peaks (FLOP/s) by a substring of torch.cuda.get_device_name().
# Order matters: the first match wins (H100 PCIe before the generic H100 = SXM).
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A6000", 155e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("4090", 165e12),
    ("3090", 71e12),
    ("V100", 125e12),
]


def peak_flops(device: torch.device) -> float | None:
    """The device's dense BF16 peak, or None (CPU, unknown GPU: MFU is then not reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def mfu(
    flops_per_token: int, token_slots_per_s_per_device: float, peak: float | None
) -> float | None:
    """Model FLOPs utilisation in [0, 1]; token slots include padding, which costs compute too."""
    if peak is None:
        return None
    return flops_per_token * token_slots_per_s_per_device / peak


def peak_memory(device: torch.device) -> dict[str, int]:
    """Peak bytes: CUDA allocated and reserved on GPU; the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"peak_memory_bytes": rss if sys.platform == "darwin" else rss * 1024}


def bytes_by_dtype(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Total bytes per dtype held by this rank (a DTensor's local shard), each tensor once."""
    seen: set[int] = set()
    out: dict[str, int] = defaultdict(int)
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out[str(t.dtype).removeprefix("torch.")] += local(t).numel() * t.element_size()
    return dict(out)


def predicted_per_rank(whole_bytes: int, world_size: int, sharded: bool) -> int:
    """The memory estimator's figure for one rank (``scripts/estimate_memory.py`` sizes the whole,
    unsharded model): all of it under DDP, an even ``1/N`` share under FSDP2."""
    return math.ceil(whole_bytes / world_size) if sharded else whole_bytes


def whole_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the whole (unsharded) tensors, each counted once."""
    unique = {id(t): t for t in tensors}.values()
    return sum(t.numel() * t.element_size() for t in unique)


def per_rank_memory_line(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, world_size: int, sharded: bool
) -> str:
    """Parameters, gradients (they take the trainable parameters' shapes and dtypes) and
    optimizer state of this rank, each with the estimator's prediction for this world size; the
    state is the planned one (``foam.planned_state_numel``), allocated at the first step."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    state_size = params[0].element_size() if params else 0
    planned_here = foam.planned_state_numel(optimizer) * state_size
    planned_whole = foam.planned_state_numel(optimizer, per_rank=False) * state_size
    parts = {
        "params": (sum(bytes_by_dtype(params).values()), whole_bytes(params)),
        "grads": (sum(bytes_by_dtype(trainable).values()), whole_bytes(trainable)),
        "optimizer state": (planned_here, planned_whole),
    }
    return " | ".join(
        f"{name} {here / 2**20:.2f} MiB (predicted "
        f"{predicted_per_rank(whole, world_size, sharded) / 2**20:.2f} MiB)"
        for name, (here, whole) in parts.items()
    )


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of the optimizer's per-parameter state (step counters included)."""
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


def format_bytes(by_dtype: dict[str, int]) -> str:
    if not by_dtype:
        return "none"
    return ", ".join(f"{dtype} {n / 2**20:.2f} MiB" for dtype, n in sorted(by_dtype.items()))
