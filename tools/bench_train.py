"""End-to-end training throughput: tokens/s and peak memory of each optimizer, as ratios to AdamW.

Every optimizer trains its own copy of the same model (same seed) on the same token batches, with
the trainer's forward/backward (train/step.py). Optimizers are interleaved: each round runs a
few steps of every one in turn, so load that comes and goes on a shared machine hits them alike;
the median step time over all rounds gives tokens/s. Peak memory is the persistent bytes (params,
grads, optimizer state) plus the peak allocated during one training step (CUDA: the allocator's
peak; CPU: foam.profiling's count of every allocation). Every optimizer is warmed up (and
compiled) before the first timed round, and each round starts with the next optimizer in turn, so
none is always first. ``--compile`` repeats the measurement with ``torch.compile`` of each decoder
layer (``trainer.compile=true``) and reports its effect per optimizer; ``--compiled-only``
measures the compiled model alone.

``--memory-cap GIB`` asks instead which optimizer trains more tokens per second within GIB of GPU
memory: for each, with and without gradient checkpointing, the largest micro-batch whose steps
fit the cap (``tools/memory_cap.py``'s search; the process may allocate no more than the cap, so a
step beyond it runs out of memory), and the tokens/s at it. It needs a CUDA device.

    python scripts/bench_train.py                                  # llama_1m, fp32, CPU
    python scripts/bench_train.py --compile --out results/bench/train_cpu.md
    python scripts/bench_train.py --model llama_60m --precision bf16 --optimizers adamw foam2
    python scripts/bench_train.py --model llama_350m --precision bf16 --memory-cap 16 \
        --optimizers adamw foam2 foam_mini
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import foam
from foam.profiling import peak_transient_bytes
from models import available_models, build_model, enable_gradient_checkpointing, load_model_config
from tools.bench_methods import DEFAULT_LABELS, available_labels, builder
from tools.bench_report import Machine, command_line, publish
from tools.memory_cap import CapResult, Trial, cap_table, search
from train.metrics import peak_memory, reset_peak_memory, synchronize
from train.parallelism import compile_decoder_layers
from train.step import Batch, accumulate_gradients, loss_sum_for

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINE = "adamw"
"""The project's AdamW as the trainer builds it (configs/optim/adamw.yaml)."""
FUSED_BASELINE = "adamw_fused"
DEFAULT_OPTIMIZERS = tuple(label for label in DEFAULT_LABELS if label != "adamw_foreach")


@dataclass
class Runner:
    """One optimizer training its own model copy."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    times: list[float]
    compiled: bool


@dataclass
class Result:
    label: str
    tokens_per_s: float
    peak_bytes: int


def batches(vocab: int, batch: int, seq: int, count: int) -> list[Batch]:
    """``count`` fixed batches of random tokens (no padding), the same for every optimizer."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        ids = torch.randint(2, vocab, (batch, seq), generator=generator)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def build_runner(
    label: str, model_cfg: dict, args: argparse.Namespace, compiled: bool, checkpointing=False
) -> Runner:
    """As the trainer builds its model: checkpointing first, then compilation."""
    make_optimizer = builder(label, args.model)
    torch.manual_seed(0)
    model = build_model(model_cfg, device=args.device, dtype=DTYPES[args.precision])
    model.train()
    model.config.use_cache = False
    if checkpointing:
        enable_gradient_checkpointing(model)
    if compiled:
        compile_decoder_layers(model)
    return Runner(model, make_optimizer(model), [], compiled)


def train_step(runner: Runner, batch: Batch, device: torch.device) -> None:
    accumulate_gradients(
        runner.model,
        [batch],
        device=device,
        world_size=1,
        autocast=contextlib.nullcontext,
        loss_sum=loss_sum_for(runner.compiled),
    )
    runner.optimizer.step()
    runner.optimizer.zero_grad(set_to_none=True)


def persistent_bytes(runner: Runner) -> int:
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    return 2 * params + foam.state_bytes(runner.optimizer)  # + the gradients, as big as params


def peak_step_bytes(runner: Runner, step: Callable[[], None], device: torch.device) -> int:
    if device.type == "cuda":
        reset_peak_memory(device)
        step()
        return peak_memory(device)["peak_memory_bytes"]
    peak, _ = peak_transient_bytes(step)
    return persistent_bytes(runner) + peak


def round_order(runners: list[Runner], round_index: int) -> list[Runner]:
    """Round ``round_index``'s order: each round starts with the next optimizer, so none always
    runs first (after a pause) or last."""
    turn = round_index % len(runners)
    return runners[turn:] + runners[:turn]


def measure(labels: list[str], args: argparse.Namespace, compiled: bool) -> list[Result]:
    model_cfg = load_model_config(args.model)
    device = torch.device(args.device)
    data = batches(model_cfg["vocab_size"], args.batch_size, args.seq_len, args.steps)
    runners = {label: build_runner(label, model_cfg, args, compiled) for label in labels}
    tokens = args.batch_size * args.seq_len
    peaks = {}
    for label, runner in runners.items():  # warm-up (and compilation), then the memory peak
        for batch in data[: args.warmup]:
            train_step(runner, batch, device)
        peaks[label] = peak_step_bytes(
            runner, lambda r=runner: train_step(r, data[0], device), device
        )
    for round_index in range(args.rounds):
        for runner in round_order(list(runners.values()), round_index):
            for batch in data:
                synchronize(device)
                start = time.perf_counter()
                train_step(runner, batch, device)
                synchronize(device)
                runner.times.append(time.perf_counter() - start)
        print(
            f"  {'compiled' if compiled else 'eager'} round {round_index + 1} done", file=sys.stderr
        )
    results = [
        Result(label, tokens / statistics.median(r.times), peaks[label])
        for label, r in runners.items()
    ]
    del runners
    gc.collect()
    return results


def table(title: str, results: list[Result]) -> str:
    base = next(r for r in results if r.label == BASELINE)
    fused = next((r for r in results if r.label == FUSED_BASELINE), None)
    lines = [
        f"### {title}",
        "",
        "| optimizer | tokens/s | tokens/s / AdamW | tokens/s / AdamW-fused | peak MiB | "
        "peak / AdamW |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        to_fused = f"{r.tokens_per_s / fused.tokens_per_s:.3f}" if fused else "-"
        lines.append(
            f"| {r.label} | {r.tokens_per_s:.0f} | {r.tokens_per_s / base.tokens_per_s:.3f} | "
            f"{to_fused} | {r.peak_bytes / 2**20:.1f} | {r.peak_bytes / base.peak_bytes:.3f} |"
        )
    return "\n".join(lines) + "\n"


def compile_table(eager: list[Result], compiled: list[Result]) -> str:
    lines = [
        "### Effect of trainer.compile=true (torch.compile of each decoder layer)",
        "",
        "| optimizer | tokens/s eager | tokens/s compiled | speed-up | peak MiB eager | "
        "peak MiB compiled |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for e, c in zip(eager, compiled, strict=True):
        lines.append(
            f"| {e.label} | {e.tokens_per_s:.0f} | {c.tokens_per_s:.0f} | "
            f"{c.tokens_per_s / e.tokens_per_s:.2f} | {e.peak_bytes / 2**20:.1f} | "
            f"{c.peak_bytes / 2**20:.1f} |"
        )
    return "\n".join(lines) + "\n"


def cap_trial(runner: Runner, micro_batch: int, args: argparse.Namespace) -> Trial | None:
    """Tokens/s and peak of ``micro_batch`` sequences per step (one warm-up step, then
    ``args.steps`` timed), or None when a step runs out of the capped memory."""
    device = torch.device(args.device)
    data = batches(runner.model.config.vocab_size, micro_batch, args.seq_len, args.steps + 1)
    try:
        train_step(runner, data[0], device)
        reset_peak_memory(device)
        times = []
        for batch in data[1:]:
            synchronize(device)
            start = time.perf_counter()
            train_step(runner, batch, device)
            synchronize(device)
            times.append(time.perf_counter() - start)
    except torch.OutOfMemoryError:
        runner.optimizer.zero_grad(set_to_none=True)
        return None
    finally:
        del data
        gc.collect()
        torch.cuda.empty_cache()
    peak = peak_memory(device)["peak_memory_bytes"]
    return Trial(micro_batch * args.seq_len / statistics.median(times), peak)


def memory_cap(labels: list[str], args: argparse.Namespace) -> list[CapResult]:
    """Each optimizer's largest micro-batch within ``args.memory_cap`` GiB, checkpointing off
    and on; the process is held to the cap (``set_per_process_memory_fraction``)."""
    device = torch.device(args.device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(args.memory_cap * 2**30 / total, index)
    model_cfg = load_model_config(args.model)
    results = []
    for checkpointing in (False, True):
        for label in labels:
            runner = build_runner(label, model_cfg, args, args.compiled_only, checkpointing)
            results.append(
                search(
                    label,
                    checkpointing,
                    lambda size, r=runner: cap_trial(r, size, args),
                    args.max_micro_batch,
                )
            )
            print(f"  {label}, checkpointing {checkpointing}: done", file=sys.stderr)
            del runner
            gc.collect()
            torch.cuda.empty_cache()
    return results


def cap_error(args: argparse.Namespace) -> str | None:
    """Why ``--memory-cap`` cannot run with these arguments (None: it can)."""
    device = torch.device(args.device)
    if device.type != "cuda":
        return f"--memory-cap needs a CUDA device (got --device {args.device})"
    if not 0 < args.memory_cap * 2**30 <= torch.cuda.get_device_properties(device).total_memory:
        return f"--memory-cap {args.memory_cap:g} GiB is not within this GPU's memory"
    return None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--model",
        default="llama_1m",
        choices=available_models(),
        metavar="MODEL",
        help="a configs/model name; default: llama_1m",
    )
    parser.add_argument("--precision", default="fp32", choices=sorted(DTYPES))
    parser.add_argument(
        "--optimizers",
        nargs="+",
        default=list(DEFAULT_OPTIMIZERS),
        choices=available_labels(),
        metavar="LABEL",
        help="optim config names, NAME_eager, adamw_fused, adamw_foreach (tools/bench_methods.py);"
        " default: every method of the paper's tables",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per optimizer and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also measure a compiled model")
    parser.add_argument("--compiled-only", action="store_true", help="the compiled model alone")
    parser.add_argument(
        "--memory-cap",
        type=float,
        default=None,
        metavar="GIB",
        help="the largest micro-batch within GIB GiB and its tokens/s, per optimizer (CUDA)",
    )
    parser.add_argument("--max-micro-batch", type=int, default=1024, help="--memory-cap's limit")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")
    return parser


def main() -> None:
    args = parser().parse_args()
    error = cap_error(args) if args.memory_cap is not None else None
    if error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
    labels = [BASELINE] + [label for label in args.optimizers if label != BASELINE]
    machine = Machine(args.device)
    compiled = "compiled" if args.compiled_only else "eager"
    if args.memory_cap is not None:
        title = f"{args.model}, {args.precision}, {compiled} model, at most {args.memory_cap:g} GiB"
        sections = [cap_table(title, memory_cap(labels, args), BASELINE, args.seq_len)]
        how = f"Micro-batches of {args.seq_len}-token sequences; median of {args.steps} steps"
    else:
        results = measure(labels, args, compiled=args.compiled_only)
        sections = [table(f"{args.model}, {args.precision}, {compiled} model", results)]
        if args.compile and not args.compiled_only:
            with_compile = measure(labels, args, compiled=True)
            sections += [
                table(f"{args.model}, {args.precision}, compiled model", with_compile),
                compile_table(results, with_compile),
            ]
        how = (
            f"Batch {args.batch_size} x {args.seq_len} tokens; median over {args.rounds} "
            f"interleaved rounds x {args.steps} steps after {args.warmup} warm-up steps"
        )
    header = (
        f"# Training throughput benchmark\n\nCommand: `{command_line()}`\n\n"
        f"{machine.describe()} {how}.\n\n"
    )
    publish(header + "\n".join(sections), args.out)
