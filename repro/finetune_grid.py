"""The paper's fine-tuning grids as runs of ``scripts/finetune.py``: ``sweep.py --experiment glue``
and ``--experiment mmlu``.

GLUE: RoBERTa-Large on the eight tasks of the paper's table, Full-Adam, LoRA, GaLore, APOLLO
(rank 4) and FOAM (level 8), each over the paper's eight lrs (Appendix: 1e-5 ... 4e-4; the table
reports each task's best). MMLU: Gemma3-1B, LLaMA3.2-3B and Qwen2.5-7B, the same methods at rank
8 and level 8 (7 for Gemma3-1B), over the six lrs APOLLO's recipe sweeps (1e-5 ... 2e-4).

Runs live in ``ROOT/finetune/BENCHMARK/MODEL/TASK/METHOD/lr{lr}`` (a name the pre-training
tables do not read), and a run whose ``summary.json`` exists is finished. ``--dry-run``'s
GPU-hours are 6 x parameters x tokens (forward and backward) at the stated MFU of the dense BF16
peak, with every sequence at its cut-off length (GLUE pads to 256 tokens; MMLU's 2048 is an upper
bound, most questions are far shorter).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from repro.runs import REPO, hparam
from train.metrics import peak_flops_for_name

GLUE_LRS = (1e-5, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 4e-4)
MMLU_LRS = (1e-5, 2.5e-5, 5e-5, 1e-4, 1.5e-4, 2e-4)
FINETUNE_METHODS = ("adamw", "lora", "galore", "apollo", "foam")
"""The tables' rows, in their order."""
EPOCHS = 3
GLUE_SEQ_LEN, MMLU_SEQ_LEN = 256, 2048
MMLU_TRAIN_EXAMPLES = 99_842  # MMLU's auxiliary training set
GLUE_TRAIN_EXAMPLES = {
    "cola": 8_551,
    "stsb": 5_749,
    "mrpc": 3_668,
    "rte": 2_490,
    "sst2": 67_349,
    "mnli": 392_702,
    "qnli": 104_743,
    "qqp": 363_846,
}
"""The training sets' sizes, in the paper's column order."""


@dataclass(frozen=True)
class HubModel:
    name: str
    params: int
    """Published parameter count (the FLOP estimate's)."""
    level: int = 8


GLUE_MODEL = HubModel("FacebookAI/roberta-large", 355_359_744)
MMLU_MODELS = (
    HubModel("google/gemma-3-1b-pt", 999_885_952, level=7),
    HubModel("meta-llama/Llama-3.2-3B", 3_212_749_824),
    HubModel("Qwen/Qwen2.5-7B", 7_615_616_512),
)


@dataclass(frozen=True)
class FinetuneRun:
    benchmark: str
    model: HubModel
    task: str
    method: str
    lr: float

    def run_dir(self, root: Path) -> Path:
        slug = Path(self.model.name).name if Path(self.model.name).exists() else self.model.name
        slug = slug.replace("/", "--")
        return (
            root
            / "finetune"
            / self.benchmark
            / slug
            / self.task
            / self.method
            / f"lr{hparam(self.lr)}"
        )

    def command(self, root: Path, extra: Sequence[str]) -> list[str]:
        """``scripts/finetune.py``'s command."""
        args = [sys.executable, str(REPO / "scripts" / "finetune.py"), self.benchmark]
        args += ["--task", self.task] if self.benchmark == "glue" else []
        args += ["--model", self.model.name, "--method", self.method]
        args += ["--lr", hparam(self.lr), "--out", str(self.run_dir(root))]
        if self.method == "foam":
            args += ["--level", str(self.model.level)]
        return [*args, *extra]

    def tokens(self) -> int:
        if self.benchmark == "glue":
            return EPOCHS * GLUE_TRAIN_EXAMPLES[self.task] * GLUE_SEQ_LEN
        return EPOCHS * MMLU_TRAIN_EXAMPLES * MMLU_SEQ_LEN

    def gpu_hours(self, gpu: str, mfu: float) -> float:
        return 6 * self.model.params * self.tokens() / (peak_flops_for_name(gpu) * mfu) / 3600


def grid(benchmark: str) -> list[FinetuneRun]:
    """The paper's grid of ``benchmark``."""
    if benchmark == "glue":
        cells = [(GLUE_MODEL, task, GLUE_LRS) for task in GLUE_TRAIN_EXAMPLES]
    else:
        cells = [(model, "mmlu", MMLU_LRS) for model in MMLU_MODELS]
    return [
        FinetuneRun(benchmark, model, task, method, lr)
        for model, task, lrs in cells
        for method in FINETUNE_METHODS
        for lr in lrs
    ]


FINETUNE_EXPERIMENTS = {
    "glue": "Table: fine-tuning RoBERTa-Large on GLUE (8 tasks), 5 methods, lr grid",
    "mmlu": "Table: fine-tuning Gemma3-1B, LLaMA3.2-3B, Qwen2.5-7B on MMLU, 5 methods, lr grid",
}


def listing_lines() -> list[str]:
    return [f"{n:<15} {len(grid(n)):>3} runs  {text}" for n, text in FINETUNE_EXPERIMENTS.items()]


def finetune_todo(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[FinetuneRun], dict[Path, list[str]]]:
    """The experiment's runs (``--methods`` of them) and the commands of those not finished."""
    if args.launcher != "local":
        parser.error(f"--experiment {args.experiment} runs locally (--launcher local)")
    runs = grid(args.experiment)
    if args.model:  # another model (a hub name or a local DIR) in the paper's model's place
        renamed = [replace(run, model=replace(run.model, name=args.model)) for run in runs]
        runs = list({run.run_dir(args.root): run for run in reversed(renamed)}.values())[::-1]
    if args.methods:
        unknown = sorted(set(args.methods) - set(FINETUNE_METHODS))
        if unknown:
            parser.error(
                f"--methods {unknown} not in {args.experiment}: {', '.join(FINETUNE_METHODS)}"
            )
        runs = [run for run in runs if run.method in args.methods]
    todo = {
        run.run_dir(args.root): run.command(args.root, args.overrides)
        for run in runs
        if not (run.run_dir(args.root) / "summary.json").exists()
    }
    return runs, todo


def finetune_plan(
    runs: Sequence[FinetuneRun],
    todo: dict[Path, list[str]],
    args: argparse.Namespace,
    mfu: float,
    gpus: Sequence[str],
) -> str:
    """``--dry-run``: each run's tokens, GPU-hours on ``gpus`` and command, then the totals."""
    lines, totals = [], dict.fromkeys(gpus, 0.0)
    for run in runs:
        hours = {gpu: run.gpu_hours(gpu, mfu) for gpu in gpus}
        totals = {gpu: totals[gpu] + hours[gpu] for gpu in gpus}
        cost = ", ".join(f"{hours[gpu]:,.2f} h {gpu}" for gpu in gpus)
        lines.append(
            f"# {run.model.name} {run.task} {run.method} lr {hparam(run.lr)}: {run.tokens() / 1e6:,.0f}M tokens, {cost}"
        )
        command = todo.get(run.run_dir(args.root))
        lines.append(shlex.join(command) if command else "#   finished")
    cost = ", ".join(f"{totals[gpu]:,.0f} GPU-hours on {gpu}" for gpu in gpus)
    lines.append(
        f"# {args.experiment}: {len(runs)} runs, {cost} (6 x params x tokens at {mfu:.0%} MFU of "
        "the dense BF16 peak, sequences at their cut-off length; finished runs included)"
    )
    return "\n".join(lines)
