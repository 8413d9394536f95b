"""What a checkpoint's self-proof and its background write cost: the manifest's checksum per GiB
(beside SHA-256 and BLAKE2b) and the training stall per save, synchronous against
``trainer.async_save``, at ``llama_60m``'s state on this machine.

    python scripts/bench_checkpoint.py                    # both parts, a markdown report
    python scripts/bench_checkpoint.py --checksum-mib 1024 --repeats 5 --out results/bench/ckpt.md

Checksum (``train/manifest.py``): seconds per GiB of the manifest's CRC-32 over a file in the
page cache (the read included), beside SHA-256 and BLAKE2b read the same way, so the choice is visible. Stall: the
seconds a training loop is held per save at ``llama_60m``'s state (weights and AdamW moments in
``--dtype``), synchronous (``dcp.save``, checksums, publish) against ``trainer.async_save``
(the call that copies the state and starts ``dcp.async_save``, plus the wait left at the next
save after ``--train-seconds`` of training, during which this benchmark computes matmuls).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import models
from tools.bench_report import Machine, command_line, publish
from train import checkpoint as ckpt
from train.manifest import crc32_of
from train.state import TrainState

_CHUNK = 8 << 20


def _hashlib_of(name: str) -> Callable[[Path], Any]:
    def digest(path: Path) -> bytes:
        h = hashlib.new(name)
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.digest()

    return digest


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def checksum_rows(mib: int, repeats: int, folder: Path) -> list[str]:
    path = folder / "shard.bin"
    path.write_bytes(os.urandom(mib << 20))
    gib = mib / 1024
    rows = []
    for name, fn in (
        ("CRC-32 (zlib; the manifest's)", crc32_of),
        ("SHA-256", _hashlib_of("sha256")),
        ("BLAKE2b", _hashlib_of("blake2b")),
    ):
        seconds = _best_seconds(lambda fn=fn: fn(path), repeats)
        rows.append(f"| {name} | {seconds / gib:.3f} | {gib / seconds:.2f} |")
    path.unlink()
    return rows


class _Position:
    def state_dict(self) -> dict[str, int]:
        return {"records": 0}

    def load_positions(self, positions: list[dict[str, int]]) -> None:
        pass


def _llama_60m(dtype: torch.dtype) -> ckpt.Resumable:
    torch.manual_seed(0)
    model = models.build_model(models.load_model_config("llama_60m"), dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # allocates the moments
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return ckpt.Resumable(model, optimizer, scheduler, _Position())


def _train_for(seconds: float) -> None:
    """Stand-in for training steps: matmuls on the CPU, as a step would use it."""
    a = torch.randn(512, 512)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def stall_rows(dtype: torch.dtype, repeats: int, train_seconds: float, folder: Path) -> list[str]:
    live = _llama_60m(dtype)
    state_bytes = sum(p.numel() * p.element_size() for p in live.model.parameters()) + sum(
        t.numel() * t.element_size()
        for s in live.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    sync, started, waited = [], [], []
    for i in range(repeats):
        state = TrainState(step=2 * i + 1)
        t0 = time.perf_counter()
        ckpt.save_training_state(folder, live, state, rank=0, keep_last=2)
        sync.append(time.perf_counter() - t0)
        state = TrainState(step=2 * i + 2)
        t0 = time.perf_counter()
        ckpt.save_training_state(folder, live, state, rank=0, keep_last=2, background=True)
        started.append(time.perf_counter() - t0)
        _train_for(train_seconds)
        t0 = time.perf_counter()
        ckpt.finish_background_save()
        waited.append(time.perf_counter() - t0)
    med = statistics.median
    total = [s + w for s, w in zip(started, waited, strict=True)]
    return [
        f"State: {state_bytes / 2**20:.0f} MiB ({dtype}: weights and AdamW moments); "
        f"median of {repeats}; {train_seconds:g} s of training between an async save's start "
        "and the next save.",
        "",
        "| save | stall per save (s) | of which: start (copy + plan) | wait at the next save |",
        "|---|---|---|---|",
        f"| synchronous | {med(sync):.3f} | | |",
        f"| trainer.async_save | {med(total):.3f} | {med(started):.3f} | {med(waited):.3f} |",
        "",
        f"Async stall / sync stall: x{med(total) / med(sync):.2f}.",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checksum-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--train-seconds", type=float, default=5.0)
    parser.add_argument(
        "--parts", nargs="+", choices=("checksum", "stall"), default=["checksum", "stall"]
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    machine = Machine("cpu")
    lines = [f"# Checkpoint costs\n\n`{command_line()}`\n"]
    with tempfile.TemporaryDirectory() as folder:
        if "checksum" in args.parts:
            lines += [
                f"## Checksum ({args.checksum_mib} MiB file in the page cache, best of "
                f"{args.repeats})\n",
                "| checksum | s per GiB | GiB/s |",
                "|---|---|---|",
                *checksum_rows(args.checksum_mib, args.repeats, Path(folder)),
                "",
            ]
        if "stall" in args.parts:
            dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
            lines += [
                "## Stall per save at llama_60m\n",
                *stall_rows(dtype, args.repeats, args.train_seconds, Path(folder)),
                "",
            ]
    lines.append(machine.describe())
    publish("\n".join(lines) + "\n", args.out)
