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

Bytes are not the only floor. Every entry of an Adam-type step (FOAM's residual makes its second
moment per entry too) takes an exact square root and a division, which most CPUs run on one
unit that is not fully pipelined; ``sqrt_div_ns`` measures them alone, on arrays that stay in
the first-level cache, compiled as the C++ step is. Where a step's square roots and divisions
alone take more than its byte floor allows (bf16 parameters move few bytes an entry), no exact
implementation reaches that floor on this CPU, and the report says so beside the ratio.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


SQRT_DIV_SOURCE = r"""
#include <math.h>
#include <stddef.h>
/* out = num / (sqrt(v) + eps) over n entries, `repeats` times: the exact arithmetic that every
   entry of an Adam-type step does, and nothing else. */
void sqrt_div(float* out, const float* num, const float* v, float eps, size_t n, long repeats) {
  for (long r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < n; ++i) out[i] = num[i] / (sqrtf(v[i]) + eps);
    __asm__ volatile("" : : "r"(out) : "memory"); /* each repeat is done, not folded away */
  }
}
"""
SQRT_DIV_ENTRIES = 2048
"""Three float arrays of this many entries: 24 KiB, within any first-level data cache."""


def sqrt_div_ns(repeats: int = 20_000, rounds: int = 5) -> float | None:
    """Nanoseconds an entry of an exact float32 square root and division take on one core here
    (best of ``rounds``), compiled with the C++ step's optimisation flags (foam/fused.py); None
    where no C compiler (``$CC``, else ``cc``) builds it."""
    from foam.fused import CPU_CFLAGS

    flags = [f for f in CPU_CFLAGS if f != "-fopenmp"]
    with tempfile.TemporaryDirectory() as folder:
        source, library = Path(folder) / "sqrt_div.c", Path(folder) / "sqrt_div.so"
        source.write_text(SQRT_DIV_SOURCE)
        compiler = os.environ.get("CC", "cc")
        try:
            subprocess.run(
                [compiler, *flags, "-shared", "-fPIC", str(source), "-o", str(library)],
                check=True,
                capture_output=True,
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        sqrt_div = ctypes.CDLL(str(library)).sqrt_div
    sqrt_div.restype = None
    sqrt_div.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_size_t, ctypes.c_long]
    num = torch.rand(SQRT_DIV_ENTRIES) + 0.5
    v = torch.rand(SQRT_DIV_ENTRIES) + 0.5
    out = torch.empty(SQRT_DIV_ENTRIES)
    pointers = (out.data_ptr(), num.data_ptr(), v.data_ptr())
    sqrt_div(*pointers, 1e-8, SQRT_DIV_ENTRIES, 10)  # warm
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        sqrt_div(*pointers, 1e-8, SQRT_DIV_ENTRIES, repeats)
        best = min(best, time.perf_counter() - start)
    return best / (SQRT_DIV_ENTRIES * repeats) * 1e9


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
    sqrt_div_ns: float | None = None
    """An entry's exact square root and division here (``sqrt_div_ns``), if measured."""

    @property
    def floor_ms(self) -> float:
        return self.bytes_moved / self.bandwidth * 1e3

    @property
    def ratio(self) -> float:
        return self.best_ms / self.floor_ms

    @property
    def arithmetic_ratio(self) -> float | None:
        """The step's square roots and divisions alone (one of each an entry) over its floor."""
        if self.sqrt_div_ns is None:
            return None
        return self.params * self.sqrt_div_ns * 1e-6 / self.floor_ms


def markdown(title: str, floors: list[Floor], baseline: str) -> str:
    """One table: each method's best step, bytes, floor and ratios."""
    base = next((f for f in floors if f.method == baseline), None)
    lines = [
        f"### {title}",
        "",
        "| method | best step ms | bytes / param | floor ms | step / floor "
        "| sqrt + div alone / floor | time / AdamW-fused |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in floors:
        versus = f"{f.best_ms / base.best_ms:.2f}" if base else "-"
        arithmetic = "-" if f.arithmetic_ratio is None else f"{f.arithmetic_ratio:.2f}"
        lines.append(
            f"| {f.method} | {f.best_ms:.2f} | {f.bytes_moved / f.params:.1f} | "
            f"{f.floor_ms:.2f} | {f.ratio:.2f} | {arithmetic} | {versus} |"
        )
    return "\n".join(lines) + "\n"


def headline(label: str, floors: list[Floor]) -> list[str]:
    """A line a method: its step over its floor, and where its square roots and divisions alone
    exceed 1.25x of the floor, that no exact step gets within 1.25x here."""
    lines = []
    for f in floors:
        line = f"* {label}: {f.method} step = {f.ratio:.2f}x its byte floor"
        if f.arithmetic_ratio is not None and f.arithmetic_ratio > 1.25:
            line += (
                f" (its square roots and divisions alone take {f.arithmetic_ratio:.2f}x: "
                "no exact step is within 1.25x here)"
            )
        lines.append(line)
    return lines
