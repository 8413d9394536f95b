"""Measurements: memory peaks, MFU, the dtype/byte breakdown logged at start-up and the estimated
time per step logged before the first one."""

from __future__ import annotations

import logging
import math
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterable

import torch

log = logging.getLogger(__name__)

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


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


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
    """Total bytes per dtype, each tensor counted once."""
    seen: set[int] = set()
    out: dict[str, int] = defaultdict(int)
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out[str(t.dtype).removeprefix("torch.")] += t.numel() * t.element_size()
    return dict(out)


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


# ---------------------------------------------------------------------------------------------
# The time a step will take, said before the first one (a 350M model on a CPU takes hours)

ASSUMED_MFU = 0.4
"""Utilisation assumed for a GPU with a known peak: well-tuned LLM pre-training reaches 30-50 %."""
CPU_PRESETS = (
    "trainer=cpu_debug with +model=llama_tiny, qwen_tiny or llama_1m (see scripts/demo.py)"
)
SLOW_STEP_S = 10.0


def measured_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 512) -> float:
    """FLOP/s of an n x n matmul in ``dtype`` on ``device`` (best of 3): an optimistic rate for a
    device without a known peak, since a training step also runs what is not a big matmul."""
    a = torch.randn(n, n, device=device).to(dtype)
    best = math.inf
    for _ in range(4):  # the first is warm-up
        start = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def format_duration(seconds: float) -> str:
    """``0.25 s``, ``12 min``, ``5.2 h``, ``430 days``: a duration at a glance."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def log_step_time_estimate(
    flops_per_token: int, tokens_per_step: int, device: torch.device, dtype: torch.dtype, steps: int
) -> float:
    """Log the estimated seconds per optimizer step (and for the run) from the model's FLOPs and
    the device; on CPU, point at the CPU presets when a step would be slow. Returns the estimate.

    ``tokens_per_step`` are this device's token slots per optimizer step (padding included).
    """
    peak = peak_flops(device)
    if peak is not None:
        rate = peak * ASSUMED_MFU
        source = f"{ASSUMED_MFU:.0%} of the device's {peak / 1e12:.0f} TFLOP/s bf16 peak"
    else:
        rate = measured_matmul_flops(device, dtype)
        kind = str(dtype).removeprefix("torch.")
        source = f"this {device.type}'s measured {kind} matmul rate, {rate / 1e9:.0f} GFLOP/s"
    seconds = flops_per_token * tokens_per_step / rate
    message = (
        f"estimated time per optimizer step: {format_duration(seconds)}, {steps} steps in about "
        f"{format_duration(seconds * steps)} ({flops_per_token * tokens_per_step / 1e12:.3g} "
        f"TFLOP per step per device at {source})"
    )
    if device.type == "cpu" and seconds > SLOW_STEP_S:
        log.warning("%s; on a CPU use the CPU presets: %s", message, CPU_PRESETS)
    else:
        log.info("%s", message)
    return seconds
