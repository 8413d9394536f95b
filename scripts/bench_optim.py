"""Optimizer-step benchmark: every method against torch AdamW, measured in the same run.

For each model shape and dtype it reports the median ``optimizer.step()`` time, the persistent
state bytes and the peak transient memory of one step, each also as a ratio to AdamW-foreach
(the default multi-tensor AdamW). Ratios, not absolute times, are the result: absolute times
depend on the machine and on what else runs on it.

    python scripts/bench_optim.py                       # llama_60m + llama_130m, fp32 + bf16
    python scripts/bench_optim.py --models llama_60m --dtypes bf16 --methods adamw_foreach foam2
    python scripts/bench_optim.py --out results/bench/optim_cpu.md
"""

from __future__ import annotations

import argparse
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
from models import build_model, load_model_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINE = "adamw_foreach"


@dataclass
class Result:
    method: str
    step_ms: float
    state_bytes: int
    transient_bytes: int


def method_table(model_cfg: dict) -> dict[str, Callable[[torch.nn.Module], torch.optim.Optimizer]]:
    """Label -> builder. Torch's AdamW flavours first, then every registered method."""
    hidden = model_cfg["hidden_size"]
    table: dict[str, Callable] = {
        "adamw_foreach": lambda m: torch.optim.AdamW(m.parameters(), foreach=True),
        "adamw_fused": lambda m: torch.optim.AdamW(m.parameters(), fused=True),
        "foam2": lambda m: foam.build_optimizer("foam", m, level=2),
        "foam3": lambda m: foam.build_optimizer("foam", m, level=3),
    }
    model_keywords = {
        "rank": hidden // 4,
        "n_heads": model_cfg["num_attention_heads"],
        "n_kv_heads": model_cfg["num_key_value_heads"],
        "dim": hidden,
    }
    for name, accepted in foam.available_optimizers().items():
        if name in ("foam", "adamw"):
            continue
        extra = {k: v for k, v in model_keywords.items() if k in accepted}
        table[name] = lambda m, name=name, extra=extra: foam.build_optimizer(name, m, **extra)
    return table


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_one(
    model: torch.nn.Module,
    build: Callable[[torch.nn.Module], torch.optim.Optimizer],
    steps: int,
    warmup: int,
) -> tuple[float, int, int]:
    optimizer = build(model)
    device = next(model.parameters()).device
    for _ in range(warmup):
        optimizer.step()
    times = []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    transient, _ = peak_transient_bytes(optimizer.step)
    state = foam.state_bytes(optimizer)
    del optimizer
    gc.collect()
    return statistics.median(times) * 1e3, state, transient


def run(model_name: str, dtype: str, methods: list[str], steps: int, warmup: int, device: str):
    model_cfg = load_model_config(model_name)
    torch.manual_seed(0)
    model = build_model(model_cfg, device=device, dtype=DTYPES[dtype])
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    table = method_table(model_cfg)
    unknown = sorted(set(methods) - set(table))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; available: {sorted(table)}")
    results = []
    for label in methods:
        try:
            step_ms, state, transient = bench_one(model, table[label], steps, warmup)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
            print(f"  {label}: skipped ({type(error).__name__}: {error})", file=sys.stderr)
            continue
        results.append(Result(label, step_ms, state, transient))
        print(f"  {model_name} {dtype} {label}: {step_ms:.1f} ms", file=sys.stderr)
    return results


def markdown(model_name: str, dtype: str, results: list[Result]) -> str:
    base = next((r for r in results if r.method == BASELINE), None)
    mb = 2**20
    lines = [
        f"### {model_name}, {dtype}",
        "",
        "| method | step ms | time / AdamW-foreach | state MiB | state / AdamW | transient MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        time_ratio = f"{r.step_ms / base.step_ms:.2f}" if base else "-"
        state_ratio = f"{r.state_bytes / base.state_bytes:.3f}" if base else "-"
        lines.append(
            f"| {r.method} | {r.step_ms:.1f} | {time_ratio} | {r.state_bytes / mb:.1f} | "
            f"{state_ratio} | {r.transient_bytes / mb:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama_60m", "llama_130m"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--methods", nargs="+", default=None, help="default: all")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args()

    command = "python scripts/bench_optim.py " + " ".join(sys.argv[1:])
    header = (
        f"# Optimizer step benchmark\n\nCommand: `{command}`\n\n"
        f"Device: {args.device} ({torch.get_num_threads()} threads), torch {torch.__version__}. "
        f"Median of {args.steps} steps after {args.warmup} warm-up steps; transient = peak memory "
        "allocated during one step beyond the persistent state (foam.profiling).\n\n"
    )
    sections = []
    for model_name in args.models:
        methods = args.methods or list(method_table(load_model_config(model_name)))
        for dtype in args.dtypes:
            results = run(model_name, dtype, methods, args.steps, args.warmup, args.device)
            sections.append(markdown(model_name, dtype, results))
    report = header + "\n".join(sections)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    main()
