"""What a sharded (FSDP2) optimizer step costs in communication and time, for every registered
method, against the gradient reduce-scatter FSDP2 runs every step anyway.

For each world size W it spawns W gloo ranks on the CPU, builds the model (``llama_60m`` shapes
by default), shards it as the trainer does (``train.parallelism.parallelize``: each matrix along
``foam.registry.shard_dims``, the method's dim), feeds seeded gradients and runs ``--steps`` optimizer steps of each
method, counting every ``torch.distributed`` collective the step calls (by wrapping them) and the
bytes each rank sends in the bandwidth-optimal algorithm of each (``all_to_all``: what leaves the
rank; ``all_reduce``: ``2 (W-1)/W`` of the tensor; ``broadcast``: the tensor). Step 1 (where the
projection methods refresh their bases) is reported apart from the steady steps after it.

The reference is FSDP2's gradient reduce-scatter of the same model: ``(W-1)/W`` of its padded
flat gradients (each parameter's largest shard times W) leave each rank every step; "matrices"
is the part of it for the matrices the method steps (attention and MLP), which is what an owner
exchange moves (Muon's aim: about ``2/W`` of that). The optimizer step time is the median over
the steady steps of the slowest rank, against the same method's unsharded step in one process
measured in the same run (on a shared CPU the times are noisy; the bytes are exact).

    python scripts/bench_shard_comm.py                               # every method, W = 2 and 4
    python scripts/bench_shard_comm.py --methods muon galore --worlds 2 4 --layers 2
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, distribute_tensor

import foam
from models import build_model, load_model_config
from tools.bench_report import Machine, command_line, publish
from train.distributed import shutdown
from train.parallelism import parallelize  # FSDP2 before any group: see shutdown's docstring

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COUNTED = (
    "all_to_all_single",
    "all_to_all",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)


@dataclass
class Tally:
    """Collectives (by name) and bytes this rank sent, over some stretch of calls."""

    calls: Counter = field(default_factory=Counter)
    sent: int = 0


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def sent_bytes(name: str, args: tuple, kwargs: dict, ranks: int, rank: int) -> int:
    """Bytes this rank sends in the bandwidth-optimal algorithm of collective ``name``."""
    if name == "all_to_all_single":
        inp = args[1]
        splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
        if not splits:
            return _bytes(inp) * (ranks - 1) // ranks
        per = inp.element_size() * (inp.numel() // max(sum(splits), 1))
        return (sum(splits) - splits[rank]) * per
    if name == "all_to_all":
        return sum(_bytes(t) for i, t in enumerate(args[1]) if i != rank)
    if name == "all_reduce":
        return 2 * _bytes(args[0]) * (ranks - 1) // ranks
    if name == "broadcast":
        return _bytes(args[0]) if rank == kwargs.get("src", args[1] if len(args) > 1 else 0) else 0
    if name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        big = args[0] if name == "all_gather_into_tensor" else args[1]
        return _bytes(big) * (ranks - 1) // ranks
    if name == "all_gather":
        return _bytes(args[1]) * (ranks - 1)
    return 0


def count_collectives(tally: Tally) -> None:
    """Wrap ``torch.distributed``'s collectives so each call is counted into ``tally``."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    for name in COUNTED:
        original = getattr(dist, name)

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original, **kwargs):
            tally.calls[_name] += 1
            tally.sent += sent_bytes(_name, args, kwargs, ranks, rank)
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def build(model_name: str, layers: int | None, dtype: torch.dtype) -> torch.nn.Module:
    cfg = dict(load_model_config(model_name))
    if layers is not None:
        cfg["n_layers" if "n_layers" in cfg else "num_hidden_layers"] = layers
    torch.manual_seed(0)
    return build_model(cfg, dtype=dtype)


def seeded_gradients(model: torch.nn.Module, step: int) -> None:
    for i, p in enumerate(model.parameters()):
        g = torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * step + i))
        g = g.to(p.dtype)
        p.grad = distribute_tensor(g, p.device_mesh, p.placements) if isinstance(p, DTensor) else g


def reduce_scatter_bytes(model: torch.nn.Module, matrices: set[str]) -> tuple[int, int]:
    """Bytes each rank sends in FSDP2's gradient reduce-scatter (its padded flat gradient: each
    parameter's largest shard times W), for all parameters and for the matrices."""
    ranks = dist.get_world_size()
    total = mats = 0
    for name, p in model.named_parameters():
        dim = p.placements[0].dim
        padded = math.ceil(p.shape[dim] / ranks) * ranks * (p.numel() // p.shape[dim])
        sent = padded * p.element_size() * (ranks - 1) // ranks
        total += sent
        mats += sent if name in matrices else 0
    return total, mats


def time_step(optimizer: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    optimizer.step()
    return time.perf_counter() - start


def _run_methods(
    methods: list[str], model_name: str, layers: int | None, dtype: torch.dtype, steps: int
) -> dict[str, dict]:
    """Each method's steps on the current process group (or unsharded, without one)."""
    results = {}
    sharded = dist.is_initialized()
    ranks = dist.get_world_size() if sharded else 1
    tally = Tally()
    if sharded:
        count_collectives(tally)
    for method in methods:
        model = build(model_name, layers, dtype)
        matrices = {name for name, _ in foam.split_params(model).matrices}
        if sharded:
            model = parallelize(
                model, sharded=True, precision="fp32", device=torch.device("cpu"),
                world_size=ranks, optimizer=method,
            )  # fmt: skip
        try:
            optimizer = foam.build_optimizer(method, model)
        except Exception as err:  # a refused layout is a result of the benchmark
            results[method] = {"error": str(err).split(";")[0]}
            continue
        rows = []
        for step in range(steps):
            seeded_gradients(model, step)
            before = Tally(Counter(tally.calls), tally.sent)
            seconds = time_step(optimizer)
            rows.append((seconds, tally.calls - before.calls, tally.sent - before.sent))
        result = {"steps": rows}
        if not sharded or dist.get_rank() == 0:
            print(f"{method} on {ranks} rank(s): {[round(s, 3) for s, _, _ in rows]} s", flush=True)
        if sharded:
            result["reduce_scatter"] = reduce_scatter_bytes(model, matrices)
        results[method] = result
    return results


def _worker(rank: int, ranks: int, init_file: str, args: tuple, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ranks)
    results = _run_methods(*args)
    every = [None] * ranks
    dist.all_gather_object(every, results)
    if rank == 0:
        torch.save(every, out)
    shutdown(require_stopped=True)


def run_sharded(ranks: int, args: tuple) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.pt")
        mp.spawn(_worker, args=(ranks, str(Path(tmp) / "init"), args, out), nprocs=ranks)
        return torch.load(out, weights_only=False)


def _steady(rows: list) -> list:
    return rows[1:] or rows


def report_rows(methods: list[str], single: dict, by_world: dict[int, list[dict]]) -> list[str]:
    """The table: one row per method and world size."""
    lines = [
        "| method | W | collectives per steady step | bytes sent per rank, steady step | "
        "step 1 (refresh) | / reduce-scatter (all grads) | / reduce-scatter (matrices) | "
        "step time sharded / unsharded |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        for world, ranks in sorted(by_world.items()):
            first = ranks[0][method]
            if "error" in first:
                lines.append(f"| `{method}` | {world} | refused: {first['error']} | | | | | |")
                continue
            steady_bytes = max(
                statistics.mean(sent for _, _, sent in _steady(r[method]["steps"])) for r in ranks
            )
            first_bytes = max(r[method]["steps"][0][2] for r in ranks)
            calls = sum(_steady(first["steps"])[0][1].values())
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(_steady(first["steps"])[0][1].items()))
            total, mats = first["reduce_scatter"]
            sharded_s = statistics.median(
                max(r[method]["steps"][i][0] for r in ranks) for i in range(1, len(first["steps"]))
            )
            single_s = statistics.median(s for s, _, _ in _steady(single[method]["steps"]))
            lines.append(
                f"| `{method}` | {world} | {calls}{f' ({kinds})' if kinds else ''} | "
                f"{steady_bytes / 1e6:.2f} MB | {first_bytes / 1e6:.2f} MB | "
                f"{steady_bytes / total:.3f} | {steady_bytes / mats:.3f} | "
                f"{sharded_s / single_s:.2f} ({sharded_s * 1e3:.0f} / {single_s * 1e3:.0f} ms) |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=None, help="default: every registered")
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--model", default="llama_60m")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--steps", type=int, default=3, help="step 1 plus the steady steps")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    options = parser.parse_args(argv)
    methods = options.methods or sorted(foam.available_optimizers())
    args = (methods, options.model, options.layers, DTYPES[options.dtype], options.steps)
    torch.set_num_threads(1)
    machine = Machine("cpu")
    single = _run_methods(*args)
    by_world = {world: run_sharded(world, args) for world in options.worlds}
    header = (
        f"# Sharded optimizer step: communication and time\n\nCommand: `{command_line()}`\n\n"
        f"{options.model}{f' ({options.layers} layers)' if options.layers else ''}, "
        f"{options.dtype}, {options.steps} steps, gloo, one thread per rank. "
        f"{machine.describe()}\n\n"
    )
    publish(header + "\n".join(report_rows(methods, single, by_world)) + "\n", options.out)
