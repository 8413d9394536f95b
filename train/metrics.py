"""Measurements: memory peaks, MFU and the dtype/byte breakdown logged at start-up (the estimated
time per step is ``train/estimate.py``'s)."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import resource
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch

import foam
from foam.sharding import local

log = logging.getLogger(__name__)

# Dense BF16 tensor-core peaks (FLOP/s), keyed by the words of torch.cuda.get_device_name() that
# name the product. A key matches when all its words are words of the name ("NVIDIA H100 PCIe"
# has the words NVIDIA, H100, PCIe), so "NVIDIA L40" is not an L4 and "NVIDIA A10G" is not an
# A10. The first matching entry wins: variants come before their generic model.
PEAK_BF16_FLOPS: list[tuple[tuple[str, ...], float]] = [
    (("H200",), 989e12),
    (("H100", "PCIe"), 756e12),
    (("H100", "NVL"), 835e12),
    (("H100",), 989e12),
    (("A100",), 312e12),
    (("L40S",), 362e12),
    (("L40",), 181e12),
    (("L4",), 121e12),
    (("A6000",), 155e12),
    (("A10",), 125e12),
    (("4090",), 165e12),
    (("3090",), 71e12),
    (("V100",), 125e12),
]


def peak_flops_for_name(name: str) -> float | None:
    """The dense BF16 peak of the GPU called ``name``, or None when it is not in the table."""
    words = set(re.split(r"[\s\-_]+", name))
    return next((flops for key, flops in PEAK_BF16_FLOPS if words.issuperset(key)), None)


def peak_flops(device: torch.device) -> float | None:
    """The device's dense BF16 peak, or None (CPU, unknown GPU: MFU is then not reported)."""
    if device.type != "cuda":
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))


def mfu(
    flops_per_token: int, token_slots_per_s_per_device: float, peak: float | None
) -> float | None:
    """Model FLOPs utilisation in [0, 1]; token slots include padding, which costs compute too."""
    if peak is None:
        return None
    return flops_per_token * token_slots_per_s_per_device / peak


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics on GPU; the process's peak RSS on Linux
    (``/proc/self/clear_refs``; elsewhere the RSS peak cannot be reset and stays the process's).
    The RSS also holds memory that an earlier phase freed but the C allocator kept, so on CPU a
    phase's peak is an upper bound."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory(device: torch.device) -> dict[str, int]:
    """Peak bytes since the last reset: CUDA allocated and reserved on GPU; the peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
        }
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"peak_memory_bytes": int(line.split()[1]) * 1024}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"peak_memory_bytes": rss if sys.platform == "darwin" else rss * 1024}


class PhasePeaks:
    """Peak memory per phase of a run (``setup``, ``train``, ``eval``, ``checkpoint``).

    The peak is reset whenever the run enters another phase, so the ``train`` peak covers
    training steps only: not the initialisation, resume-time copies, evaluation or saving, which
    are the same for every method and would otherwise hide the optimizers' differences. A phase
    entered several times keeps the largest of its peaks. Reading and resetting the allocator's
    statistics does not synchronise with the GPU.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.current = "setup"
        self.peaks: dict[str, dict[str, int]] = {}
        reset_peak_memory(device)

    def _fold(self) -> None:
        now = peak_memory(self.device)
        old = self.peaks.get(self.current, {})
        self.peaks[self.current] = {k: max(v, old.get(k, 0)) for k, v in now.items()}

    def enter(self, phase: str) -> None:
        """Close the current phase and start measuring ``phase`` (nothing when already in it)."""
        if phase != self.current:
            self._fold()
            reset_peak_memory(self.device)
            self.current = phase

    def record(self) -> dict:
        """``peak_memory_bytes`` (and ``_reserved_bytes`` on GPU) of the train phase, plus
        ``peak_memory_by_phase``: every phase seen so far, the current one included."""
        self._fold()
        train = self.peaks.get("train", {})
        return {
            "peak_memory_bytes": train.get("peak_memory_bytes"),
            "peak_memory_reserved_bytes": train.get("peak_memory_reserved_bytes"),
            "peak_memory_by_phase": {k: dict(v) for k, v in self.peaks.items()},
        }


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
