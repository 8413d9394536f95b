"""The run's plan: what its config and its machine decide about how it trains (sharded or not,
autocast, compiled, the weights' dtype, what the matmuls run in, micro-batches per step), decided
once when the run is built. Every later reader (model building, the step, evaluation, export, the estimate, the logs)
takes these facts from the plan, so a changed ``trainer.parallelism`` cannot reach one reader and
miss another; the rules themselves live in ``train/parallelism.py`` and ``train/config.py``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.config import PARAM_DTYPES, accumulation_steps
from train.metrics import matmul_kind
from train.parallelism import compiles_layers, shards_parameters, uses_autocast
from train.schema import TrainerConfig


@dataclass(frozen=True)
class RunPlan:
    world_size: int
    accumulation: int
    """Micro-batches per rank per optimizer step."""
    sharded: bool
    """FSDP2 shards the parameters (``trainer.parallelism=fsdp`` over several ranks): the model
    is built on the meta device, every forward is a collective, export gathers the weights."""
    autocast: bool
    """Forwards run under a bf16 ``torch.autocast`` (bf16_mixed without FSDP2's own cast)."""
    compiled: bool
    """Each decoder layer is compiled (``trainer.compile`` resolved for this device)."""
    param_dtype: torch.dtype
    """The weights' dtype (and so the optimizer states')."""
    matmul_kind: str
    """bf16, tf32 or fp32: what the matmuls run in, the device peak MFU is scored against."""


def plan_run(trainer: TrainerConfig, world_size: int, device: torch.device) -> RunPlan:
    """The plan of a run with trainer config ``trainer`` on ``world_size`` ranks of ``device``."""
    return RunPlan(
        world_size=world_size,
        accumulation=accumulation_steps(
            trainer.global_batch_size, trainer.micro_batch_size, world_size
        ),
        sharded=shards_parameters(trainer.parallelism, world_size),
        autocast=uses_autocast(trainer.parallelism, trainer.precision, world_size),
        compiled=compiles_layers(trainer.compile, device),
        param_dtype=PARAM_DTYPES[trainer.precision],
        matmul_kind=matmul_kind(trainer.precision),
    )
