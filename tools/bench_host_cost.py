"""Host cost of FOAM's fused step: what a step costs the CPU beyond the kernels' arithmetic.

On a GPU a step of many small matrices is bound by this work (deciding each parameter's path,
reading its state, preparing launches), not by the kernels. The kernels are stubbed, so the
figure is the host's alone and can be measured on any machine: FOAM-2 over as many matrices as a
model folds (small stand-ins: the host's work does not depend on their size), either in one group
(one kernel call a step) or one group per matrix (one call per matrix), for the C++ operator and
for the Triton launch (its tables built, the launch itself stubbed). Rounds interleave the two
layouts; medians are reported, and the ratio per-matrix / grouped.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from unittest import mock

import torch

import foam
from foam import fused
from models import build_model, load_model_config

STAND_IN = (8, 16)
LAYOUTS = ("per-matrix", "grouped")


def matrices_of(model_name: str) -> int:
    """How many matrices FOAM folds in ``model_name`` (counted on the meta device)."""
    model = build_model(load_model_config(model_name), device="meta")
    return len(foam.split_params(model).matrices)


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def stubbed(kernel: str) -> Iterator[None]:
    """CPU matrices take ``kernel`` ("cpp" or "triton") with its arithmetic stubbed out."""
    if not fused.kernel_available("cpu"):  # built and probed before the stub
        raise RuntimeError("the fused CPU step does not build here (see the foam.fused log)")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(fused.KERNELS, {"cpu": kernel}))
        stack.enter_context(mock.patch.object(torch.ops.foam, "step_", lambda *args: None))
        if kernel == "triton":
            from foam import triton_kernels

            for launched in ("_write_scalars", "_foam_step_kernel"):
                stack.enter_context(mock.patch.object(triton_kernels, launched, _NoLaunch()))
        yield


def step_us(count: int, layout: str, steps: int) -> float:
    """Median host microseconds of ``steps`` steps of FOAM-2 over ``count`` stand-in matrices,
    each with a fresh gradient a step (as after ``zero_grad()``)."""
    params = [torch.nn.Parameter(torch.zeros(STAND_IN)) for _ in range(count)]
    groups = [{"params": [p]} for p in params] if layout == "per-matrix" else [{"params": params}]
    optimizer = foam.FOAM(groups, lr=1e-3, level=2, implementation="fused")
    times = []
    for _ in range(steps + 1):  # the first step makes the states and kernel tables
        for p in params:
            p.grad = torch.zeros(STAND_IN)
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e6


def report(models: list[str], rounds: int, steps: int) -> str:
    """A markdown table: per model and kernel, host µs a step in each layout and their ratio."""
    lines = [
        "| model | matrices | kernel | per-matrix µs/step | grouped µs/step | grouped µs/matrix "
        "| per-matrix / grouped |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for model_name in models:
        count = matrices_of(model_name)
        for kernel in ("cpp", "triton"):
            with stubbed(kernel):
                times = {layout: [] for layout in LAYOUTS}
                for _ in range(rounds):
                    for layout in LAYOUTS:
                        times[layout].append(step_us(count, layout, steps))
            per_matrix, grouped = (statistics.median(times[layout]) for layout in LAYOUTS)
            lines.append(
                f"| {model_name} | {count} | {kernel} | {per_matrix:.0f} | {grouped:.0f} | "
                f"{grouped / count:.2f} | {per_matrix / grouped:.1f} |"
            )
    return "\n".join(lines) + "\n"
