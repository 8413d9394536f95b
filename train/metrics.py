"""Measurements: memory peaks, MFU, the dtype/byte breakdown logged at start-up, and the device
synchronisation a timer needs (the estimated time per step is ``train/estimate.py``'s)."""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

import foam
from foam.numerics import resolve_dtype
from foam.sharding import local

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeakFlops:
    """A GPU's dense peaks (FLOP/s, no sparsity) for the matmuls a run's precision uses."""

    bf16: float
    """BF16 tensor cores, fp32 accumulation (``trainer.precision=bf16`` / ``bf16_mixed``)."""
    tf32: float
    """TF32 tensor cores (fp32 runs that allow TF32); the fp32 rate where there are none."""
    fp32: float
    """FP32 on the CUDA cores (fp32 runs at ``torch.get_float32_matmul_precision() ==
    "highest"``, torch's default)."""


# Dense peaks keyed by the words of torch.cuda.get_device_name() that name the product. A key
# matches when all its words are words of the name, in any case ("NVIDIA H100 PCIe" has the words NVIDIA, H100,
# PCIe), so "NVIDIA L40" is not an L4 and "NVIDIA A10G" is not an A10. The first matching entry
# wins: variants come before their generic model. Figures are the vendor's datasheets (NVIDIA
# H100, H200, H800, GH200 Grace Hopper Superchip, HGX B200, A100, L40S, L40, L4, RTX A6000, A10,
# GeForce RTX 4090 / 3090 (Ada and Ampere whitepapers), V100), halved where the sheet gives the
# figure "with sparsity"; HGX B200's 8-GPU figures divided by 8. V100 has no BF16 or TF32
# tensor cores (its 125 TFLOP/s are FP16): its bf16 and tf32 matmuls run on the FP32 units.
PEAK_FLOPS: list[tuple[tuple[str, ...], PeakFlops]] = [
    (("B200",), PeakFlops(bf16=2250e12, tf32=1125e12, fp32=75e12)),
    (("GH200",), PeakFlops(bf16=989e12, tf32=494e12, fp32=67e12)),
    (("H200", "NVL"), PeakFlops(bf16=835e12, tf32=417e12, fp32=60e12)),
    (("H200",), PeakFlops(bf16=989e12, tf32=494e12, fp32=67e12)),
    (("H100", "PCIe"), PeakFlops(bf16=756e12, tf32=378e12, fp32=51e12)),
    (("H100", "NVL"), PeakFlops(bf16=835e12, tf32=417e12, fp32=60e12)),
    (("H100",), PeakFlops(bf16=989e12, tf32=494e12, fp32=67e12)),
    (("H800", "PCIe"), PeakFlops(bf16=756e12, tf32=378e12, fp32=51e12)),
    (("H800",), PeakFlops(bf16=989e12, tf32=494e12, fp32=67e12)),
    (("A100",), PeakFlops(bf16=312e12, tf32=156e12, fp32=19.5e12)),
    (("L40S",), PeakFlops(bf16=362e12, tf32=183e12, fp32=91.6e12)),
    (("L40",), PeakFlops(bf16=181e12, tf32=90.5e12, fp32=90.5e12)),
    (("L4",), PeakFlops(bf16=121e12, tf32=60e12, fp32=30.3e12)),
    (("A6000",), PeakFlops(bf16=155e12, tf32=77.4e12, fp32=38.7e12)),
    (("A10",), PeakFlops(bf16=125e12, tf32=62.5e12, fp32=31.2e12)),
    (("4090",), PeakFlops(bf16=165e12, tf32=82.6e12, fp32=82.6e12)),
    (("3090",), PeakFlops(bf16=71e12, tf32=35.6e12, fp32=35.6e12)),
    (("V100", "PCIe"), PeakFlops(bf16=14e12, tf32=14e12, fp32=14e12)),
    (("V100",), PeakFlops(bf16=15.7e12, tf32=15.7e12, fp32=15.7e12)),
]
MATMUL_KINDS = ("bf16", "tf32", "fp32")


def matmul_kind(precision: str) -> str:
    """What a run's matmuls run in: bf16 for ``bf16``/``bf16_mixed``; for ``fp32``, tf32 when
    torch is allowed to use it (``torch.set_float32_matmul_precision("high")``), else fp32."""
    if precision.startswith("bf16"):
        return "bf16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_flops_for_name(name: str, kind: str = "bf16") -> float | None:
    """The dense ``kind`` peak (``MATMUL_KINDS``) of the GPU called ``name``, or None when it is
    not in the table."""
    words = set(re.split(r"[\s\-_]+", name.lower()))  # "Tesla V100-PCIE-16GB", "H100 PCIe"
    peaks = next(
        (peaks for key, peaks in PEAK_FLOPS if words.issuperset(k.lower() for k in key)), None
    )
    return None if peaks is None else getattr(peaks, kind)


def peak_flops(device: torch.device, kind: str = "bf16") -> float | None:
    """The device's dense ``kind`` peak, or None (CPU, unknown GPU: MFU is then not reported)."""
    if device.type != "cuda":
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device), kind)


def mfu(
    flops_per_token: int, token_slots_per_s_per_device: float, peak: float | None
) -> float | None:
    """Model FLOPs utilisation in [0, 1]; token slots include padding, which costs compute too."""
    if peak is None:
        return None
    return flops_per_token * token_slots_per_s_per_device / peak


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work, so that a timer read after it measures that work (a CPU's
    work is done when its call returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def whole_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the whole (unsharded) tensors, each counted once."""
    unique = {id(t): t for t in tensors}.values()
    return sum(t.numel() * t.element_size() for t in unique)


def planned_state_bytes(optimizer: torch.optim.Optimizer, *, per_rank: bool = True) -> int:
    """``foam.planned_state_numel`` in bytes: each state element in its group's ``state_dtype``
    (the parameters' dtype where a group sets none), the widest one where groups differ (then an
    upper bound); on this rank or for the whole model (``per_rank``)."""
    sizes = [
        resolve_dtype(group.get("state_dtype"), group["params"][0].dtype).itemsize
        for group in optimizer.param_groups
        if group["params"]
    ]
    return foam.planned_state_numel(optimizer, per_rank=per_rank) * max(sizes, default=0)


def per_rank_memory_line(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Parameters, gradients (they take the trainable parameters' shapes and dtypes) and the
    optimizer's planned state (``planned_state_bytes``, allocated at the first step): this rank's
    share of each, then the whole model's. Under FSDP2 a method's state is not an even share of
    the whole (GaLore's projected moments, APOLLO's limiter, Muon's owners' buffers are not), so
    this line states what the optimizer plans; ``scripts/estimate_memory.py --fsdp-ranks N``
    predicts it before a run, from the same plan."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    parts = {
        "params": (sum(bytes_by_dtype(params).values()), whole_bytes(params)),
        "grads": (sum(bytes_by_dtype(trainable).values()), whole_bytes(trainable)),
        "optimizer state": (
            planned_state_bytes(optimizer),
            planned_state_bytes(optimizer, per_rank=False),
        ),
    }
    return " | ".join(
        f"{name} {here / 2**20:.2f} MiB (whole model {whole / 2**20:.2f} MiB)"
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
