"""The paper's two fine-tuning tables from ``scripts/finetune.py``'s summaries under
``ROOT/finetune`` (``repro/finetune_grid.py``'s layout): each method at its best lr (per task on
GLUE, by the average on MMLU, as the paper reports), measured beside the paper's printed number.

GLUE's memory column is the estimator's (``repro.memory_estimator.finetune_gb``: bf16 weights,
LoRA's adapters included, plus the optimizer state the method plans), beside the paper's.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from repro.finetune_grid import FINETUNE_METHODS, GLUE_TRAIN_EXAMPLES
from repro.memory_estimator import finetune_gb

METHOD_LABELS = {
    "adamw": "Full-Adam",
    "lora": "LoRA",
    "galore": "GaLore",
    "apollo": "APOLLO",
    "foam": "FOAM",
}
GLUE_TASKS = tuple(GLUE_TRAIN_EXAMPLES)  # the paper's column order
PAPER_GLUE: dict[str, tuple[float, ...]] = {
    # memory (GB), CoLA, STS-B, MRPC, RTE, SST2, MNLI, QNLI, QQP, Avg.
    "adamw": (2.13, 64.85, 91.60, 92.79, 78.81, 96.44, 90.51, 94.43, 91.90, 87.66),
    "lora": (0.73, 64.32, 90.68, 91.39, 77.72, 95.98, 90.57, 94.78, 90.93, 87.04),
    "galore": (0.72, 62.52, 91.18, 90.94, 77.11, 96.10, 90.27, 94.21, 89.99, 86.54),
    "apollo": (0.72, 61.13, 91.66, 92.14, 80.14, 95.06, 89.65, 93.61, 89.27, 86.58),
    "foam": (0.71, 64.30, 92.44, 92.33, 83.03, 95.75, 89.74, 93.88, 89.65, 87.64),
}
"""``tab:fine_tuning_glue`` (RoBERTa-Large)."""
MMLU_COLUMNS = ("STEM", "social sciences", "humanities", "other", "average")
PAPER_MMLU: dict[str, dict[str, tuple[float, ...] | None]] = {
    # STEM, Soc., Hum., Other, Avg.
    "google/gemma-3-1b-pt": {
        "adamw": (27.63, 26.84, 25.12, 25.14, 26.04),
        "lora": (26.61, 25.93, 24.78, 25.02, 25.48),
        "galore": (27.40, 26.71, 24.80, 25.69, 25.99),
        "apollo": (27.47, 27.14, 25.61, 25.76, 26.38),
        "foam": (26.01, 26.39, 25.44, 26.40, 25.99),
    },
    "meta-llama/Llama-3.2-3B": {
        "adamw": (46.55, 65.81, 49.16, 63.17, 55.48),
        "lora": (47.22, 63.41, 49.56, 61.57, 54.86),
        "galore": (46.62, 65.58, 48.37, 63.33, 55.22),
        "apollo": (46.16, 65.91, 49.03, 62.80, 55.29),
        "foam": (46.72, 65.19, 49.29, 62.77, 55.33),
    },
    "Qwen/Qwen2.5-7B": {
        "adamw": None,  # out of memory on the paper's 40GB A100
        "lora": (67.69, 82.91, 66.29, 75.72, 72.41),
        "galore": (68.32, 82.87, 66.08, 76.10, 72.55),
        "apollo": (68.49, 82.97, 65.80, 76.65, 72.65),
        "foam": (69.12, 83.49, 66.48, 76.28, 73.04),
    },
}
"""``tab:fine_tune_mmlu``; the table's column order, the paper's models by hub name."""


def summaries(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / "finetune").rglob("summary.json"))]


def best_runs(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """(benchmark, model, task, method) -> the run of the best lr: the task's metric on GLUE,
    the average on MMLU."""
    best: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for run in runs:
        key = (run["benchmark"], run["model"], run["task"], run["method"])
        if key not in best or _score(run) > _score(best[key]):
            best[key] = run
    return best


def _score(run: dict[str, Any]) -> float:
    return run["metrics"]["average" if run["benchmark"] == "mmlu" else run["task"]]


def _cell(measured: float | None, paper: float | None) -> str:
    left = "-" if measured is None else f"{measured:.2f}"
    return f"{left} ({'-' if paper is None else f'{paper:.2f}'})"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def glue_table(best: dict[tuple[str, str, str, str], dict[str, Any]]) -> str:
    """Per model: methods x (memory, the eight tasks, their average); measured (paper's)."""
    by_model: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
    for (benchmark, model, task, method), run in best.items():
        if benchmark == "glue":
            by_model[model][(task, method)] = run
    parts = []
    for model, cells in sorted(by_model.items()):
        header = ["method", "memory (est.)", *GLUE_TASKS, "avg."]
        rows = []
        for method in FINETUNE_METHODS:
            paper = PAPER_GLUE[method]
            runs = [cells.get((task, method)) for task in GLUE_TASKS]
            scores = [
                None if r is None else r["metrics"][task]
                for r, task in zip(runs, GLUE_TASKS, strict=True)
            ]
            ran = [r for r in runs if r is not None]
            memory = (
                finetune_gb(ran[0]["params_total"], ran[0]["optimizer_state_numel"])
                if ran
                else None
            )
            average = statistics.fmean(scores) if None not in scores else None
            memory_cell = ("-" if memory is None else f"{memory:.2f}G") + f" ({paper[0]:.2f}G)"
            row = [METHOD_LABELS[method], memory_cell]
            row += [_cell(s, p) for s, p in zip(scores, paper[1:9], strict=True)]
            rows.append([*row, _cell(average, paper[9])])
        parts.append(
            f"{model}, best lr per task, measured (the paper's, RoBERTa-Large):\n\n"
            + _markdown(header, rows)
        )
    return "\n".join(parts)


def mmlu_table(best: dict[tuple[str, str, str, str], dict[str, Any]]) -> str:
    """Per model: methods x (the four categories, the average); measured (paper's)."""
    by_model: dict[str, dict[str, dict]] = defaultdict(dict)
    for (benchmark, model, _, method), run in best.items():
        if benchmark == "mmlu":
            by_model[model][method] = run
    parts = []
    for model, cells in sorted(by_model.items()):
        printed = PAPER_MMLU.get(model, {})
        rows = []
        for method in FINETUNE_METHODS:
            run, paper = cells.get(method), printed.get(method)
            measured = [None if run is None else run["metrics"].get(c) for c in MMLU_COLUMNS]
            papers = list(paper) if paper else [None] * len(MMLU_COLUMNS)
            rows.append([METHOD_LABELS[method], *map(_cell, measured, papers)])
        header = ["method", "STEM", "Soc.", "Hum.", "Other", "avg."]
        parts.append(
            f"{model}, best lr by the average, measured (the paper's):\n\n"
            + _markdown(header, rows)
        )
    return "\n".join(parts)


def finetune_outputs(root: Path) -> dict[str, str]:
    """``glue.md`` and ``mmlu.md``, those with runs under ``root``."""
    best = best_runs(summaries(root))
    out = {}
    if any(key[0] == "glue" for key in best):
        out["glue.md"] = glue_table(best)
    if any(key[0] == "mmlu" for key in best):
        out["mmlu.md"] = mmlu_table(best)
    return out
