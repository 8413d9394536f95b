"""Optimizer-step benchmark: every method against torch's fused AdamW, measured in the same run.

For each model shape and dtype it reports the median ``optimizer.step()`` time, the persistent
state bytes and the peak transient memory of one step, with time ratios to fused AdamW (the
kernel users run) and to foreach AdamW. Methods are interleaved: each round builds and steps every
method once, so load that comes and goes on a shared machine hits all of them alike, and the
median over rounds is reported. Ratios, not absolute times, are the result. Each method is its
optim config built as a training run builds it (tools/bench_methods.py); ``foam2_eager`` is
FOAM-2 through its readable reference step (``implementation="eager"``), to show what the fused
step (foam/fused.py) buys. GaLore's and APOLLO's projection refresh falls in the warm-up step, so
their times are those of the steps between refreshes.

    python scripts/bench_optim.py                       # llama_60m + llama_130m, fp32 + bf16
    python scripts/bench_optim.py --models llama_60m --dtypes bf16 --methods adamw_fused foam2
    python scripts/bench_optim.py --out results/bench/optim_cpu.md
    python scripts/bench_optim.py --by-shape --models llama_1b --dtypes bf16    # per matrix shape
    python scripts/bench_optim.py --host-cost --models llama_60m llama_1b llama_7b
    python scripts/bench_optim.py --floor               # each step over its byte floor

``--floor`` times the attention/MLP matrices alone (by default FOAM-2, FOAM-3, FOAM-Mini and
fused AdamW at LLaMA-60M and 350M, fp32 and bf16) and reports each method's best step as a
multiple of its own byte floor, the bytes it must move over the bandwidth measured in the same
process (tools/bench_floor.py).
``--host-cost`` measures instead what FOAM's fused step costs the host, the kernels stubbed
(tools/bench_host_cost.py): one kernel call per matrix against one per step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import foam
from foam.fused import cpu_vector_width
from foam.profiling import peak_transient_bytes
from models import available_models, build_model, load_model_config
from tools import bench_floor
from tools.bench_host_cost import report as host_cost_report
from tools.bench_methods import DEFAULT_LABELS, available_labels, builder
from tools.bench_report import Machine, command_line, publish
from train.metrics import synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINE = "adamw_fused"
FOREACH = "adamw_foreach"
HEADLINE = ("foam2", "foam3", "foam_mini")


@dataclass
class Result:
    method: str
    step_ms: float
    best_ms: float
    state_bytes: int
    transient_bytes: int
    foam_steps: str
    """The step each FOAM group took (``foam.steps_run``: cpp, triton, eager); - for the rest."""


def time_steps(optimizer: torch.optim.Optimizer, steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def stepped_sets(
    model: torch.nn.Module, args: argparse.Namespace
) -> list[tuple[str, list[torch.nn.Parameter]]]:
    """What each table times, titled: the whole model (or its matrices), then with ``--by-shape``
    the matrices of each distinct shape alone, which says which shape a model's ratio comes from
    (one slow tile kind hides in a whole-model median)."""
    matrices = [p for _, p in foam.split_params(model).matrices]
    sets = [("", matrices if args.matrices_only else list(model.parameters()))]
    if args.by_shape:
        for shape in dict.fromkeys(tuple(p.shape) for p in matrices):
            alike = [p for p in matrices if tuple(p.shape) == shape]
            sets.append((f", {shape[0]} x {shape[1]} ({len(alike)} matrices)", alike))
    return sets


def run(
    model: torch.nn.Module,
    model_name: str,
    stepped: list[torch.nn.Parameter],
    methods: list[str],
    args: argparse.Namespace,
) -> list[Result]:
    """``args.rounds`` rounds; in each, every method is built, warmed up and timed in turn, with
    gradients on ``stepped`` alone (every method skips a parameter without one)."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = None
    for p in stepped:
        p.grad = torch.randn_like(p) * 1e-3
    device = next(model.parameters()).device
    table = {label: builder(label, model_name) for label in methods}
    times: dict[str, list[float]] = {}
    memory: dict[str, tuple[int, int, str]] = {}
    for round_index in range(args.rounds):
        for label in methods:
            if label in memory or round_index == 0:
                try:
                    optimizer = table[label](model)
                except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
                    print(f"  {label}: skipped ({type(error).__name__}: {error})", file=sys.stderr)
                    continue
                time_steps(optimizer, args.warmup, device)
                times.setdefault(label, []).extend(time_steps(optimizer, args.steps, device))
                if label not in memory:
                    transient, _ = peak_transient_bytes(optimizer.step)
                    ran = ", ".join(sorted(set(foam.steps_run(optimizer).values()))) or "-"
                    memory[label] = (foam.state_bytes(optimizer), transient, ran)
                del optimizer
                gc.collect()
        print(f"  {model_name}: round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    return [
        Result(
            label, statistics.median(times[label]) * 1e3, min(times[label]) * 1e3, *memory[label]
        )
        for label in methods
        if label in memory
    ]


def markdown(title: str, results: list[Result]) -> str:
    by_name = {r.method: r for r in results}
    base, foreach = by_name.get(BASELINE), by_name.get(FOREACH)
    mb = 2**20

    def ratio(value: float, reference: Result | None, attr: str, digits: int) -> str:
        return f"{value / getattr(reference, attr):.{digits}f}" if reference else "-"

    lines = [
        f"### {title}",
        "",
        "| method | step ms | time / AdamW-fused | time / AdamW-foreach | state MiB | "
        "state / AdamW | transient MiB | FOAM step |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.method} | {r.step_ms:.1f} | {ratio(r.step_ms, base, 'step_ms', 2)} | "
            f"{ratio(r.step_ms, foreach, 'step_ms', 2)} | {r.state_bytes / mb:.1f} | "
            f"{ratio(r.state_bytes, base, 'state_bytes', 3)} | {r.transient_bytes / mb:.1f} | "
            f"{r.foam_steps} |"
        )
    return "\n".join(lines) + "\n"


def headline_lines(label: str, results: list[Result]) -> list[str]:
    """The numbers the fused FOAM step is judged by: step time over fused AdamW's."""
    by_name = {r.method: r for r in results}
    if BASELINE not in by_name:
        return []
    base = by_name[BASELINE].step_ms
    return [
        f"* {label}: {name} / fused AdamW = {by_name[name].step_ms / base:.2f}"
        for name in HEADLINE
        if name in by_name
    ]


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options: what to time (models, dtypes, methods) and how often."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=None,
        choices=available_models(),
        metavar="MODEL",
        help="configs/model names; default: llama_60m llama_130m (--floor: "
        f"{' '.join(bench_floor.FLOOR_MODELS)})",
    )
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        choices=available_labels(),
        metavar="LABEL",
        help="optim config names (configs/optim), NAME_eager for a FOAM one's eager step, "
        "adamw_fused, adamw_foreach; default: every method of the paper's tables (--floor: "
        f"{' '.join(bench_floor.FLOOR_METHODS)})",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all methods")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per method and round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per method and round")
    parser.add_argument(
        "--matrices-only",
        action="store_true",
        help="time the attention/MLP matrices' update alone: the other parameters get no gradient, "
        "so every method skips them (the whole-model step gives them all the same fused AdamW)",
    )
    parser.add_argument(
        "--by-shape",
        action="store_true",
        help="also time the matrices of each distinct shape alone, a table per shape",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="each method's best step over its byte floor (bytes it must move / the copy "
        "bandwidth measured in this process), on the matrices alone",
    )
    parser.add_argument(
        "--bandwidth-mib",
        type=int,
        default=bench_floor.BANDWIDTH_MIB,
        help="--floor: MiB of each of the two buffers the bandwidth is measured on (more than "
        "the last-level cache)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")
    parser.add_argument(
        "--host-cost",
        action="store_true",
        help="FOAM-2's host work per step with the kernels stubbed: one call per matrix against "
        "one per step, at each model's number of matrices (uses --models, --rounds, --steps)",
    )
    return parser


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The models and methods not given: the floor's few, or the paper's tables."""
    if args.models is None:
        args.models = list(bench_floor.FLOOR_MODELS if args.floor else ("llama_60m", "llama_130m"))
    if args.methods is None:
        args.methods = list(bench_floor.FLOOR_METHODS if args.floor else DEFAULT_LABELS)
    args.matrices_only = args.matrices_only or args.floor
    return args


def cpu_step(machine: Machine) -> str:
    """Which vectors FOAM's C++ step was built for here: a ratio's meaning depends on them."""
    if machine.device.type != "cpu":
        return ""
    width = cpu_vector_width()
    if width is None:
        return "FOAM's C++ step did not build here: FOAM took the eager step."
    return f"FOAM's C++ step: {width}-wide float32 vectors (`foam.fused.cpu_vector_width()`)."


def arithmetic_line(sqrt_div: float | None) -> str:
    """What the report's square-root-and-division column was measured from."""
    if sqrt_div is None:
        return "Square root and division alone: not measured (no C compiler, or not a CPU)."
    return (
        f"Square root and division alone (`tools/bench_floor.sqrt_div_ns`: an exact float32 "
        f"`num / (sqrt(v) + eps)` over arrays in the first-level cache, one core): "
        f"{sqrt_div:.3f} ns an entry; the column gives one of each an entry over the floor."
    )


def floor_report(args: argparse.Namespace, machine: Machine) -> str:
    """``--floor``: every method's best step on each model's matrices over its byte floor."""
    bandwidth_before = bench_floor.copy_bandwidth(machine.device, args.bandwidth_mib)
    measured = []
    for model_name in args.models:
        for dtype in args.dtypes:
            torch.manual_seed(0)
            model = build_model(
                load_model_config(model_name), device=args.device, dtype=DTYPES[dtype]
            )
            for title, stepped in stepped_sets(model, args):
                results = run(model, model_name, stepped, args.methods, args)
                numel = sum(p.numel() for p in stepped)
                moved = {r.method: bench_floor.step_bytes(stepped, r.state_bytes) for r in results}
                measured.append((f"{model_name} {dtype}{title}", results, moved, numel))
            del model
            gc.collect()
    bandwidth_after = bench_floor.copy_bandwidth(machine.device, args.bandwidth_mib)
    bandwidth = max(bandwidth_before, bandwidth_after)
    sqrt_div = bench_floor.sqrt_div_ns() if machine.device.type == "cpu" else None
    sections, headline = [], []
    for label, results, moved, numel in measured:
        floors = [
            bench_floor.Floor(r.method, r.best_ms, moved[r.method], numel, bandwidth, sqrt_div)
            for r in results
        ]
        sections.append(bench_floor.markdown(label, floors, BASELINE))
        headline += bench_floor.headline(label, floors)
    gbs = [f"{b / 1e9:.1f}" for b in (bandwidth_before, bandwidth_after)]
    header = (
        f"# Optimizer step against its byte floor\n\nCommand: `{command_line()}`\n\n"
        f"{machine.describe()} Copy bandwidth (`a.add_(b)`, 2 x {args.bandwidth_mib} MiB, "
        f"best of 5): {gbs[0]} GB/s before the steps, {gbs[1]} GB/s after; the floor takes "
        f"{bandwidth / 1e9:.1f}. Step: best of {args.rounds} interleaved rounds x {args.steps} "
        "steps, the matrices alone. Floor: (parameters read and written + gradients read + "
        "states read and written) / bandwidth; above 1x is time the step spends beyond moving "
        f"its bytes (computing, or waiting on memory it did not overlap). {cpu_step(machine)} "
        + arithmetic_line(sqrt_div)
        + "\n\n"
        + "\n".join(headline)
        + "\n\n"
    )
    return header + "\n".join(sections)


def main() -> None:
    args = resolve_defaults(build_parser().parse_args())
    if args.host_cost:
        header = f"# FOAM step: host cost\n\nCommand: `{command_line()}`\n\n"
        publish(header + host_cost_report(args.models, args.rounds, args.steps), args.out)
        return

    machine = Machine(args.device)
    if args.floor:
        publish(floor_report(args, machine), args.out)
        return
    sections, headline = [], []
    for model_name in args.models:
        for dtype in args.dtypes:
            torch.manual_seed(0)
            model_cfg = load_model_config(model_name)
            model = build_model(model_cfg, device=args.device, dtype=DTYPES[dtype])
            for title, stepped in stepped_sets(model, args):
                results = run(model, model_name, stepped, args.methods, args)
                sections.append(markdown(f"{model_name}, {dtype}{title}", results))
                headline += headline_lines(f"{model_name} {dtype}{title}", results)
            del model
            gc.collect()
    header = (
        f"# Optimizer step benchmark\n\nCommand: `{command_line()}`\n\n{machine.describe()} "
        f"Median over {args.rounds} interleaved rounds "
        f"x {args.steps} steps (after {args.warmup} warm-up step(s) per round); transient = peak "
        "memory allocated during one step beyond the persistent state (foam.profiling)."
        + (
            " **Matrices only**: the other parameters have no gradient."
            if args.matrices_only
            else ""
        )
        + "\n\n"
        + "\n".join(headline)
        + "\n\n"
    )
    publish(header + "\n".join(sections), args.out)
