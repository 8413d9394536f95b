"""A FOAM group's step with its per-parameter decisions made once: which path each parameter
takes, and one fused kernel call for all its folded matrices of a device and dtypes.

Deciding a parameter's path (fused AdamW, the fused FOAM step, the eager one), finding its fold
and states and building a kernel's tables cost the host tens of microseconds per matrix, which on
a GPU is longer than the step's arithmetic. So a group's :class:`Routes` are made when it first
steps and kept while :func:`grad_key` (what they depend on that can change between steps: each
parameter's storage, whether it has a gradient and the gradient's dtype, layout and contiguity)
stays the same; a step then reads each gradient and makes one call per kernel group.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from foam import fused
from foam.folding import FoldPlan
from foam.sharding import local
from foam.update import StepScalars, bias_corrections

GradKey = tuple[tuple[int, torch.dtype, torch.layout, bool] | None, ...]


def grad_key(params: Iterable[torch.Tensor]) -> GradKey:
    """What a group's routes depend on, read at every step (a fraction of a microsecond per
    parameter): each one's storage address and its gradient's dtype, layout and contiguity;
    ``None`` for a parameter without a gradient."""
    return tuple(
        None
        if p.grad is None
        else (local(p).data_ptr(), p.grad.dtype, p.grad.layout, local(p.grad).is_contiguous())
        for p in params
    )


@dataclass
class KernelCall:
    """Folded matrices of one device and dtypes, stepped by one call of a fused kernel."""

    kernel: str  # one of fused.KERNELS' values
    params: list[torch.Tensor]  # whose ``.grad`` the call reads (DTensors: their shards)
    group: fused.KernelGroup

    def step(self, corrections: tuple[float, float], scalars: StepScalars) -> None:
        self.group.step([local(p.grad) for p in self.params], corrections, scalars)


@dataclass
class Cohort:
    """Folded matrices that have taken the same number of steps, so share bias corrections."""

    steps: int
    calls: list[KernelCall]


Member = tuple[torch.Tensor, dict[str, Any], FoldPlan]
"""A folded matrix: its parameter, its state and the fold of its local part (its shard)."""


def kernel_calls(members: list[Member]) -> list[KernelCall]:
    """One call per device and dtypes of ``members``; a rank's empty shard has nothing to
    step."""
    like: dict[tuple, list[Member]] = {}
    for p, state, plan in members:
        shard = local(p)
        if shard.numel():
            dtypes = (shard.dtype, local(p.grad).dtype, local(state["exp_avg"]).dtype)
            like.setdefault((shard.device, *dtypes), []).append((p, state, plan))
    calls = []
    for (device, *_), group in like.items():
        kernel = fused.KERNELS[device.type]
        made = fused.kernel_group(
            kernel,
            [local(p) for p, _, _ in group],
            [local(state["exp_avg"]) for _, state, _ in group],
            [local(state["exp_avg_sq"]) for _, state, _ in group],
            [plan for _, _, plan in group],
        )
        calls.append(KernelCall(kernel, [p for p, _, _ in group], made))
    return calls


class FoldedBatch:
    """A group's folded matrices that take the fused step: the kernel calls of each cohort
    (normally one: matrices that missed steps form their own), and their step counters.

    Each matrix's ``state["step"]`` becomes an element (a 0-d view) of one tensor of the batch,
    so a step counts them all with one ``add_`` (one call per counter costs about 1.5 µs each
    on the CPU, more than the rest of a matrix's host work); checkpoints see the same counters.
    """

    def __init__(self, members: list[Member]) -> None:
        steps = [int(state["step"].item()) for _, state, _ in members]
        self.counters = torch.tensor(steps, dtype=torch.float32)
        by_steps: dict[int, list[Member]] = {}
        for k, (member, count) in enumerate(zip(members, steps, strict=True)):
            member[1]["step"] = self.counters[k]
            by_steps.setdefault(count, []).append(member)
        self.cohorts = [Cohort(count, kernel_calls(group)) for count, group in by_steps.items()]
        self.kernels = {call.kernel for cohort in self.cohorts for call in cohort.calls}

    def step(self, group: dict[str, Any], scalars: StepScalars) -> None:
        """One step of every matrix, counted in each one's ``state["step"]``."""
        self.counters.add_(1.0)
        for cohort in self.cohorts:
            cohort.steps += 1
            bc1, bc2, _ = bias_corrections(group["bias_correction"], group["betas"], cohort.steps)
            for call in cohort.calls:
                call.step((bc1, bc2), scalars)


@dataclass
class Routes:
    """The path each parameter of a group that has a gradient takes, as decided for ``key``."""

    key: GradKey
    adamw: list[torch.Tensor] = field(default_factory=list)
    folded: FoldedBatch | None = None
    eager: list[torch.Tensor] = field(default_factory=list)
