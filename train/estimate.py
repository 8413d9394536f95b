"""How long a step will take: said before the first step, checked against the measured one after.

Two figures. The FLOP bound (the model's FLOPs at ``ASSUMED_MFU`` of a GPU's known peak, or at the
measured matmul rate of another device) is right where big matmuls dominate: the paper's sizes on
GPUs, and the warning that a paper-size model on a CPU takes hours. A small model's step is
something else: hundreds of small kernels dispatched one by one from Python, the optimizer's work
per tensor, batches handed over by the data thread. There the bound is off by an order of
magnitude (the demo's said 0.011 s a step; it trained at 0.13-0.17 s). So a step the bound puts
under ``TRIAL_BELOW_S``, in a run of at least ``TRIAL_MIN_STEPS`` (where the trial costs a few
percent at most), is measured instead: the run's own step function (``train/step.py``) on a
throwaway copy of the model and optimizer with a random batch, under ``torch.random.fork_rng``, so
the run's weights, optimizer state and random stream are untouched. A run that compiles its
decoder layers (``trainer.compile``, on by default on a GPU) has the copy's compiled too: the
uncompiled step is far slower (``results/bench/train_compile_h100_*.md``), and the compiled code
is not thrown away with the copy, since same-shaped layers share it (the run's own layers start
without compiling again). The trial is a collective (the step all-reduces its token counts):
every rank runs it, as rank 0 decides.

After the first interval that does not hold step 1 (its warm-up is not a steady step) the log
gives the measured time per step beside the estimate (``StepTimeEstimate.compare``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import models
from train import distributed as dist
from train.config import build_optimizer
from train.metrics import peak_flops, synchronize
from train.objective import IGNORE_INDEX
from train.parallelism import compile_decoder_layers
from train.plan import RunPlan
from train.schedule import build_scheduler
from train.schema import Config
from train.step import loss_sum_for, train_step

log = logging.getLogger(__name__)

ASSUMED_MFU = 0.4
"""Utilisation assumed for a GPU with a known peak: well-tuned LLM pre-training reaches 30-50 %."""
CPU_PRESETS = (
    "trainer=cpu_debug with +model=llama_tiny, qwen_tiny or llama_1m (see scripts/demo.py)"
)
SLOW_STEP_S = 10.0
TRIAL_BELOW_S = 1.0
"""A step the FLOP bound puts under this is timed on a copy instead (four such steps at start-up;
on a CPU the real step of such a model takes up to ~10x the bound)."""
TRIAL_STEPS = 3  # timed after one warm-up step; the median is the estimate
TRIAL_MIN_STEPS = 100


def measured_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 512) -> float:
    """FLOP/s of an n x n matmul in ``dtype`` on ``device`` (best of 3): an optimistic rate for a
    device without a known peak, since a training step also runs what is not a big matmul."""
    a = torch.randn(n, n, device=device).to(dtype)
    best = math.inf
    for _ in range(4):  # the first is warm-up
        start = time.perf_counter()
        a @ a
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def format_duration(seconds: float) -> str:
    """``0.25 s``, ``12 min``, ``5.2 h``, ``430 days``: a duration at a glance."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def flop_bound(
    flops_per_token: int, tokens_per_step: int, device: torch.device, kind: str
) -> tuple[float, str]:
    """Seconds per step from FLOPs alone, and the rate it assumed (in words).

    ``tokens_per_step`` are this device's token slots per optimizer step (padding included);
    ``kind`` is what the matmuls run in (``train.metrics.matmul_kind``)."""
    peak = peak_flops(device, kind)
    if peak is not None:
        rate = peak * ASSUMED_MFU
        source = f"{ASSUMED_MFU:.0%} of the device's {peak / 1e12:.0f} TFLOP/s {kind} peak"
    else:
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        rate = measured_matmul_flops(device, dtype)
        source = f"this {device.type}'s measured {kind} matmul rate, {rate / 1e9:.0f} GFLOP/s"
    flops = flops_per_token * tokens_per_step
    return flops / rate, f"{flops / 1e12:.3g} TFLOP per step per device at {source}"


@dataclass(frozen=True)
class StepSetup:
    """How the run steps, which is what a trial copies."""

    cfg: Config
    device: torch.device
    plan: RunPlan
    """The run's: the weights' dtype, micro-batches per step, ranks, compiled or not, the matmuls'
    kind (``train/plan.py``)."""
    autocast: Callable[[], contextlib.AbstractContextManager]


def trial_step_seconds(setup: StepSetup) -> float:
    """The median time of ``TRIAL_STEPS`` steps of ``train_step`` after one warm-up, on a fresh
    copy of the run's model and optimizer (same dtype, device, checkpointing, compilation and
    micro-batch)."""
    cfg, device, plan = setup.cfg, setup.device, setup.plan
    t = cfg.trainer
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = models.build_model(cfg.model, device=device, dtype=plan.param_dtype)
        model.train()
        if t.grad_checkpointing:
            models.enable_gradient_checkpointing(model)
        if plan.compiled:  # after checkpointing, as the run orders them (train/parallelism.py)
            compile_decoder_layers(model)
        model.config.use_cache = False
        optimizer = build_optimizer(cfg.optim, model)
        scheduler = build_scheduler(optimizer, max_steps=TRIAL_STEPS + 1)
        batch = trial_batch(cfg)
        times = []
        for _ in range(TRIAL_STEPS + 1):
            start = time.perf_counter()
            train_step(
                model,
                optimizer,
                scheduler,
                itertools.repeat(batch),
                accumulation=plan.accumulation,
                device=device,
                world_size=plan.world_size,
                autocast=setup.autocast,
                grad_clip=t.grad_clip,
                loss_sum=loss_sum_for(plan.compiled),
            )
            synchronize(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def trial_batch(cfg: Config) -> dict[str, torch.Tensor]:
    """A random micro-batch shaped as the run's: unpacked data pads its short documents, so one
    token of the last row is padding (right padding: it reaches the model without a mask, as
    the run's batches do, see ``train.step.to_device``)."""
    ids = torch.randint(cfg.model.vocab_size, (cfg.trainer.micro_batch_size, cfg.data.seq_len))
    mask = torch.ones_like(ids)
    if not cfg.data.pack:
        mask[-1, -1] = 0
    return {
        "input_ids": ids,
        "labels": ids.masked_fill(mask == 0, IGNORE_INDEX),
        "attention_mask": mask,
    }


@dataclass
class StepTimeEstimate:
    """The estimate logged before the first step; ``compare`` logs the measured time beside it."""

    seconds: float
    how: str
    measured: float | None = field(default=None, init=False)
    """Seconds per step over the first interval ``compare`` was given (``summary.json``'s
    ``step_s_measured`` beside ``step_s_estimated``)."""

    def compare(self, step: int, steps: int, seconds: float) -> None:
        """Log, once, the time per step measured over the interval of ``steps`` steps ending at
        ``step``, beside the estimate; an interval holding step 1 (warm-up) is not steady."""
        if self.measured is not None or step - steps < 1:
            return
        self.measured = seconds / steps
        log.info(
            "time per optimizer step: %s measured over steps %d-%d, %s estimated (%s; x%.2f)",
            format_duration(self.measured),
            step - steps + 1,
            step,
            format_duration(self.seconds),
            self.how,
            self.measured / self.seconds,
        )


def estimate_step_time(setup: StepSetup, *, steps: int, is_main: bool) -> StepTimeEstimate:
    """The step time, logged by rank 0 with the run's duration of ``steps`` steps (collective; see
    the module docstring); on a CPU, a slow step points at the CPU presets."""
    cfg, device = setup.cfg, setup.device
    slots = cfg.trainer.global_batch_size * cfg.data.seq_len // setup.plan.world_size
    flops_per_token = models.flops_per_token(cfg.model, cfg.data.seq_len)
    bound, flops = flop_bound(flops_per_token, slots, device, setup.plan.matmul_kind)
    if dist.broadcast_object(bound < TRIAL_BELOW_S and steps >= TRIAL_MIN_STEPS):
        seconds = trial_step_seconds(setup)
        how = f"timed on a copy of the model; the FLOP bound alone says {format_duration(bound)}"
    else:
        seconds, how = bound, "the FLOP bound"
    estimate = StepTimeEstimate(seconds, how)
    if not is_main:
        return estimate
    message = (
        f"estimated time per optimizer step: {format_duration(seconds)} ({how}), {steps} steps "
        f"in about {format_duration(seconds * steps)} ({flops})"
    )
    if device.type == "cpu" and seconds > SLOW_STEP_S:
        log.warning("%s; on a CPU use the CPU presets: %s", message, CPU_PRESETS)
    else:
        log.info("%s", message)
    return estimate
