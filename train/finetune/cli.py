"""Fine-tune a pre-trained model on GLUE or MMLU with Full-Adam, FOAM, GaLore, APOLLO or LoRA (the
paper's fine-tuning tables), on ``transformers.Trainer``.

    python scripts/finetune.py glue --task rte --model roberta-large --method foam --lr 1e-4
    python scripts/finetune.py mmlu --model meta-llama/Llama-3.2-3B --method lora --lr 2.5e-5
    python scripts/finetune.py glue --task cola --model DIR --data-dir GLUE/cola --out runs/ft/cola

GLUE trains ``--epochs`` (3) epochs at the paper's batch size of the task, sequences padded to
``--max-length`` (256), and scores the validation split as the paper's table does (MNLI over
matched and mismatched together, CoLA Matthews, STS-B Pearson, accuracy for the rest). MMLU
trains on the auxiliary training set (the answer letter is the target, the question is context),
sequences cut at 2048 tokens, and scores the test set 5-shot (the dev set's questions of the
subject as the shots) by the likeliest answer letter, per super-category and over all questions.
Level and rank default to the paper's (FOAM 8; rank 4 on GLUE, 8 on MMLU).

Writes ``OUT/summary.json``: the metrics in percent, the setting, the steps, and the parameter
and planned optimizer-state counts the tables' memory column is computed from. Models and data
come from the hub, or from local paths (``--model DIR``, ``--data-dir DIR`` with ``SPLIT.jsonl``
files); without a network, a hub name stops with one line naming the flag. Exit status 2 on bad
input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from train.data.corpus import hub_reachable
from train.finetune.args import FinetuneArgs
from train.finetune.methods import DEFAULT_LEVEL, DEFAULT_RANK, METHODS, MethodSetting
from train.finetune.recipes import run_glue, run_mmlu
from train.finetune.tasks import GLUE_TASKS, FinetuneError
from train.summary import git_sha


def parse_args(argv: list[str] | None) -> FinetuneArgs:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=["glue", "mmlu"])
    parser.add_argument("--task", choices=sorted(GLUE_TASKS), help="glue: the task")
    parser.add_argument("--model", required=True, help="a hub name or a local checkpoint DIR")
    parser.add_argument("--data-dir", type=Path, default=None, help="SPLIT.jsonl files")
    parser.add_argument("--method", choices=METHODS, default="foam")
    parser.add_argument("--lr", type=float, default=None, help="glue: FOAM's paper lr of the task")
    parser.add_argument("--level", type=int, default=DEFAULT_LEVEL, help="FOAM's fold level")
    parser.add_argument("--rank", type=int, default=None, help="GaLore/APOLLO/LoRA (4 / 8)")
    parser.add_argument("--alpha", type=float, default=None, help="default: the method's")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=None, help="glue: the task's; mmlu: 16")
    parser.add_argument("--max-length", type=int, default=None, help="glue 256, mmlu 2048")
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke runs)")
    parser.add_argument("--max-eval", type=int, default=None, help="score the first N examples")
    parser.add_argument("--shots", type=int, default=5, help="mmlu: shots per test question")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("runs/finetune"))
    args = parser.parse_args(argv)
    if args.benchmark == "glue" and args.task is None:
        parser.error("glue needs --task (one of " + ", ".join(GLUE_TASKS) + ")")
    if args.benchmark == "mmlu" and args.task is not None:
        parser.error("--task is glue's; mmlu is one task")
    if args.lr is None and args.benchmark == "mmlu":
        parser.error("mmlu needs --lr (the paper sweeps 1e-5 ... 2e-4)")
    return FinetuneArgs(**vars(args))


def setting_of(args: FinetuneArgs) -> MethodSetting:
    """The method's knobs, with the paper's defaults where not given."""
    lr = args.lr if args.lr is not None else GLUE_TASKS[args.task].foam_lr
    rank = args.rank or DEFAULT_RANK[args.benchmark]
    uses_rank = args.method in ("galore", "apollo", "lora")
    return MethodSetting(
        args.method,
        lr,
        level=args.level if args.method == "foam" else None,
        rank=rank if uses_rank else None,
        alpha=args.alpha,
    )


def check_model_source(model: str) -> None:
    """A hub name needs the hub: without it, one line naming ``--model``'s local form."""
    if not Path(model).exists() and not hub_reachable():
        raise FinetuneError(
            f"--model {model}: not a local folder and the Hugging Face hub is not reachable; "
            "give --model DIR (a transformers checkpoint with its tokenizer)"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setting = setting_of(args)
    try:
        check_model_source(args.model)
        recipe = run_glue if args.benchmark == "glue" else run_mmlu
        result = recipe(args, setting)
    except FinetuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {
        "benchmark": args.benchmark,
        "task": args.task or "mmlu",
        "model": args.model,
        **dataclasses.asdict(setting),
        "seed": args.seed,
        **result,
        "git_sha": git_sha(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    scores = ", ".join(f"{k} {v:.2f}" for k, v in summary["metrics"].items())
    print(f"{summary['task']} {setting.method}: {scores} -> {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
