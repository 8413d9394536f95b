"""An optimizer step against its byte floor: the bytes it must move over the bandwidth this
machine gives, measured in the same process (``scripts/bench_optim.py --floor``).

A step time alone says nothing about whether a kernel is written to the bytes or tuned to one
CPU; against its own floor it does: 1.0x is a step that runs at the machine's memory bandwidth,
and more than that is time spent computing (or waiting) beyond the bytes. The floor of a step is

    (each stepped parameter read and written + its gradient read
     + every state tensor read and written) / bandwidth,

the least any implementation of the method moves (FOAM's folded states are a small part of
its bytes: fp32 level 2 moves ~16 bytes a parameter against AdamW's 28). The bandwidth is that of
``a.add_(b)`` on buffers far larger than any cache, the same read-modify-write pattern as a step,
with the process's threads: measured before and after the steps, and the higher kept, so that a
burst of load from elsewhere lowers neither.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

FLOOR_METHODS = ("adamw_fused", "foam2", "foam3", "foam_mini")
FLOOR_MODELS = ("llama_60m", "llama_350m")
BANDWIDTH_MIB = 512
"""Each of the two buffers ``add_`` runs on: beyond the last-level cache of any current CPU."""


def copy_bandwidth(device: torch.device, mib: int = BANDWIDTH_MIB, repeats: int = 5) -> float:
    """Bytes a second ``a.add_(b)`` moves (reads a and b, writes a) on two buffers of ``mib``
    MiB each on ``device``, best of ``repeats``."""
    a = torch.ones(mib * 2**18, device=device)
    b = torch.ones(mib * 2**18, device=device)
    a.add_(b)  # touch every page once before timing
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a.add_(b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 3 * a.nbytes / best


def step_bytes(stepped: Sequence[torch.Tensor], state_bytes: int) -> int:
    """Bytes a step must move at least: each parameter with a gradient read and written, the
    gradient read, and all ``state_bytes`` of state read and written."""
    moved = sum(2 * p.nbytes + p.grad.nbytes for p in stepped if p.grad is not None)
    return moved + 2 * state_bytes


@dataclass
class Floor:
    """A method's best step against the floor of its bytes at ``bandwidth`` bytes a second."""

    method: str
    best_ms: float
    bytes_moved: int
    params: int
    bandwidth: float

    @property
    def floor_ms(self) -> float:
        return self.bytes_moved / self.bandwidth * 1e3

    @property
    def ratio(self) -> float:
        return self.best_ms / self.floor_ms


def markdown(title: str, floors: list[Floor], baseline: str) -> str:
    """One table: each method's best step, bytes, floor and ratios."""
    base = next((f for f in floors if f.method == baseline), None)
    lines = [
        f"### {title}",
        "",
        "| method | best step ms | bytes / param | floor ms | step / floor | time / AdamW-fused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in floors:
        versus = f"{f.best_ms / base.best_ms:.2f}" if base else "-"
        lines.append(
            f"| {f.method} | {f.best_ms:.2f} | {f.bytes_moved / f.params:.1f} | "
            f"{f.floor_ms:.2f} | {f.ratio:.2f} | {versus} |"
        )
    return "\n".join(lines) + "\n"


def headline(label: str, floors: list[Floor]) -> list[str]:
    return [f"* {label}: {f.method} step = {f.ratio:.2f}x its byte floor" for f in floors]
