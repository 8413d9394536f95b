"""Throughput at a memory cap: the largest micro-batch of each optimizer that trains within a
fixed number of bytes, and its tokens/s (``scripts/bench_train.py --memory-cap GIB``).

The paper's case for FOAM is that the memory it saves buys a larger batch, or a larger model, on
the same GPU. Peak bytes alone do not say what that is worth; the tokens/s each optimizer reaches
at the largest micro-batch that fits the same cap do. This module holds the search and the
report; ``tools/bench_train.py`` runs the trials on a CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest ``n`` in ``[1, limit]`` with ``fits(n)``, for a ``fits`` that holds up to some
    size and fails beyond it (memory grows with the micro-batch); 0 when not even 1 fits.

    Doubles from 1 until a size fails (or passes ``limit``), then bisects between the last size
    that fit and the first that did not: about ``2 log2(n)`` trials, the small ones cheap.
    """
    good, size = 0, 1
    while size <= limit and fits(size):
        good, size = size, 2 * size
    bad = min(size, limit + 1)
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


@dataclass(frozen=True)
class Trial:
    """One micro-batch size that trained within the cap."""

    tokens_per_s: float
    peak_bytes: int


@dataclass(frozen=True)
class CapResult:
    label: str
    checkpointing: bool
    micro_batch: int
    """The largest that fits; 0 when not even one sequence does."""
    trial: Trial | None


def search(label: str, checkpointing: bool, trial: Callable[[int], Trial | None], limit: int):
    """``label``'s largest micro-batch under ``trial`` (None: out of memory or over the cap),
    each size tried once."""
    trials: dict[int, Trial | None] = {}

    def fits(size: int) -> bool:
        trials[size] = trial(size)
        return trials[size] is not None

    best = largest_fitting(fits, limit)
    return CapResult(label, checkpointing, best, trials.get(best))


def cap_table(title: str, results: list[CapResult], baseline: str, seq_len: int) -> str:
    """One row per optimizer and checkpointing setting; tokens/s as a ratio to ``baseline``'s
    at the same setting, and the headline ratios below."""
    base = {r.checkpointing: r for r in results if r.label == baseline}
    lines = [
        f"### {title}",
        "",
        "| optimizer | checkpointing | largest micro-batch | tokens / step | tokens/s | "
        f"tokens/s / {baseline} | peak MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rate = r.trial.tokens_per_s if r.trial else None
        reference = base.get(r.checkpointing)
        to_base = reference.trial.tokens_per_s if reference and reference.trial else None
        lines.append(
            f"| {r.label} | {'on' if r.checkpointing else 'off'} | {r.micro_batch} | "
            f"{r.micro_batch * seq_len} | {_fmt(rate, '.0f')} | "
            f"{_fmt(rate / to_base if rate and to_base else None, '.3f')} | "
            f"{_fmt(r.trial.peak_bytes / 2**20 if r.trial else None, '.0f')} |"
        )
    best = {label: max((r.trial.tokens_per_s for r in results if r.label == label and r.trial),
                       default=None) for label in dict.fromkeys(r.label for r in results)}  # fmt: skip
    headline = [
        f"* {label} / {baseline}, tokens/s at the cap (each at its faster setting) = "
        f"{rate / best[baseline]:.2f}"
        for label, rate in best.items()
        if label != baseline and rate and best.get(baseline)
    ]
    return "\n".join([*lines, "", *headline]) + "\n"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
