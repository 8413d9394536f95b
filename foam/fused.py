"""The fused FOAM step: one pass per folded matrix instead of the eager chain of ops.

The eager step (``FOAM._update`` in foam/optimizer.py) is the readable reference; this module
runs the same arithmetic (FOAM_SPEC section 2) as one kernel call for a whole parameter group:
a C++ operator on the CPU (foam/csrc/foam_step.cpp, built on first use with
``torch.utils.cpp_extension``) and a Triton kernel on CUDA (foam/triton_kernels.py, imported
only when a CUDA parameter steps). A device whose kernel cannot be built (or, on CUDA, compiled
and run: ``triton_runs``) falls back to the eager step after one log line. Per-step numbers (bias
corrections, step size, decay) are computed here and passed in, so the kernels know nothing of
how they are derived.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from foam.folding import FoldPlan, make_plan

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "fused", "eager")
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
CPU_SOURCE = Path(__file__).with_name("csrc") / "foam_step.cpp"
CPU_CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp")


def cpu_extension_name() -> str:
    """The CPU operator's name in torch's extension cache, unique to its source file and flags.

    torch keys the cache by name alone and rebuilds whenever the build's source path or content
    differ from the cached build, so two checkouts (a study's and a development tree) under one
    name would rebuild it for each other on every load (about 30 s, and a process that loads it
    meanwhile waits). Hashing the path and content gives each checkout its own build, made once.
    """
    digest = hashlib.sha256(str(CPU_SOURCE.resolve()).encode())
    digest.update(CPU_SOURCE.read_bytes())
    digest.update(" ".join(CPU_CFLAGS).encode())
    return f"foam_step_cpu_{digest.hexdigest()[:16]}"


@functools.cache
def kernel_available(device_type: str) -> bool:
    """Whether the fused kernel for ``device_type`` can run here; builds the CPU one on first call.

    The CPU operator is compiled once per machine into torch's extension cache (``make install``
    does it up front); a missing compiler or a failed build logs one line and returns False.
    """
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            log.warning("foam: triton is not installed; CUDA parameters take the eager FOAM step")
            return False
        return triton_runs(torch.device("cuda", torch.cuda.current_device()))
    if device_type != "cpu":
        return False
    try:
        from torch.utils.cpp_extension import load

        load(
            name=cpu_extension_name(),
            sources=[str(CPU_SOURCE)],
            extra_cflags=list(CPU_CFLAGS),
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as error:  # any build or load failure means: use the eager step
        log.warning(
            "foam: the fused CPU step could not be built (%s: %s); using the eager step",
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        return False
    return True


def triton_runs(device: torch.device) -> bool:
    """Whether the Triton kernel compiles and runs on ``device`` for every pair of parameter and
    state dtypes (a 2 x 4 matrix each): a GPU or dtype Triton cannot compile for then sends the
    parameters to the eager step with one log line, instead of stopping a run at its first step."""
    try:
        from foam.triton_kernels import triton_step

        plan = make_plan((2, 4), 1, "larger")
        scalars = StepScalars(0.9, 0.95, 1.0, 1.0, 1e-8, 1e-3, 1.0, mean_of_squares=False)
        for param_dtype, state_dtype in itertools.product(KERNEL_DTYPES, repeat=2):
            p = torch.zeros(plan.rows, plan.cols, dtype=param_dtype, device=device)
            m, v = (torch.zeros(plan.folded_shape, dtype=state_dtype, device=device) for _ in "mv")
            triton_step([p], [torch.ones_like(p)], [m], [v], [plan], [(1.0, 1.0)], scalars)
    except Exception as error:  # any compile or launch failure means: use the eager step
        log.warning(
            "foam: the Triton FOAM kernel does not run on %s (%s: %s); using the eager step",
            device,
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        return False
    return True


def applies(p: torch.Tensor, plan: FoldPlan | None, state_dtype: torch.dtype) -> bool:
    """Whether the fused kernels cover ``p``: a folded matrix (block > 1) of plain contiguous
    float32/bfloat16 tensors on the CPU or CUDA. Level 0, float16/float64 and sharded (DTensor)
    parameters take the eager step."""
    grad = p.grad
    return (
        plan is not None
        and plan.block > 1
        and p.device.type in ("cpu", "cuda")
        and type(p.data) is torch.Tensor
        and p.dtype in KERNEL_DTYPES
        and grad.dtype in KERNEL_DTYPES
        and state_dtype in KERNEL_DTYPES
        and p.is_contiguous()
        and grad.is_contiguous()
    )


@dataclass(frozen=True)
class StepScalars:
    """The numbers one FOAM step of a group needs, beyond each matrix's bias corrections.

    The update is ``p = p * decay - step_size * (m_hat + rho R) / (sqrt(v_hat + rho_sq R^2) + eps)``
    with ``m_hat = m / bc1`` and ``v_hat = v / bc2``.
    """

    beta1: float
    beta2: float
    rho: float
    rho_sq: float
    eps: float
    step_size: float
    decay: float
    mean_of_squares: bool

    @classmethod
    def of_group(cls, group: dict[str, Any]) -> StepScalars:
        rho = float(group["residual"])
        beta1, beta2 = group["betas"]
        return cls(
            beta1=beta1,
            beta2=beta2,
            rho=rho,
            rho_sq=rho * rho if group["residual_in_second_moment"] else 0.0,
            eps=group["eps"],
            step_size=group["lr"] * group["alpha"],
            decay=1 - group["lr"] * group["weight_decay"],
            mean_of_squares=group["second_moment"] == "mean_of_squares",
        )

    def as_list(self) -> list[float]:
        return [
            self.beta1,
            self.beta2,
            self.rho,
            self.rho_sq,
            self.eps,
            self.step_size,
            self.decay,
        ]


def fused_step(
    params: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    plans: list[FoldPlan],
    bias_corrections: list[tuple[float, float]],
    scalars: StepScalars,
) -> None:
    """One FOAM step for folded matrices on one device, in place on params and states."""
    grads = [p.grad for p in params]
    if params[0].device.type == "cuda":
        from foam.triton_kernels import triton_step

        with torch.cuda.device(params[0].device):  # Triton launches on the current device
            triton_step(params, grads, exp_avgs, exp_avg_sqs, plans, bias_corrections, scalars)
        return
    geometry = [n for plan in plans for n in (plan.rows, plan.cols, plan.axis, plan.block)]
    torch.ops.foam.step_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        geometry,
        [c for pair in bias_corrections for c in pair],
        scalars.as_list(),
        scalars.mean_of_squares,
    )
