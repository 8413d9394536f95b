"""The two fine-tuning recipes (``train/finetune/cli.py``): GLUE on a sequence classifier, MMLU on a
causal LM, each trained by ``transformers.Trainer`` with the method's optimizer and scored as the
paper's tables score it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from train.finetune.args import FinetuneArgs
from train.finetune.methods import MethodSetting, memory_counts, prepare
from train.finetune.metrics import (
    accuracy,
    category_accuracy,
    matthews_correlation,
    pearson_correlation,
    percent,
)
from train.finetune.tasks import (
    CHOICES,
    GLUE_HUB,
    GLUE_TASKS,
    MMLU_CATEGORIES,
    MMLU_HUB,
    MMLU_SHOTS,
    MMLU_SUBJECTS,
    MMLU_TEST,
    MMLU_TRAIN,
    GlueTask,
    load_split,
    mmlu_prompt,
    mmlu_question,
    mmlu_subject,
)
from train.objective import IGNORE_INDEX

GLUE_MAX_LENGTH, MMLU_MAX_LENGTH, MMLU_BATCH = 256, 2048, 16
METRICS = {"accuracy": accuracy, "matthews": matthews_correlation, "pearson": pearson_correlation}


def steps_for(examples: int, batch_size: int, epochs: float, cap: int | None) -> int:
    """Optimizer steps of ``epochs`` epochs (the Trainer's count on one device), at most ``cap``."""
    steps = max(1, math.ceil(epochs * math.ceil(examples / batch_size)))
    return min(steps, cap) if cap else steps


def default_dtype() -> torch.dtype:
    """bf16 weights on a GPU that has it (the paper's pure bf16), fp32 elsewhere."""
    cuda = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if cuda else torch.float32


def train(
    model: nn.Module,
    setting: MethodSetting,
    args: FinetuneArgs,
    data: Any,
    *,
    batch_size: int,
    task_type: str,
    collator: Any = None,
) -> tuple[nn.Module, dict[str, int]]:
    """Train ``model`` on ``data`` with the method; returns the trained model (LoRA-wrapped
    for LoRA) and the steps and memory counts."""
    from transformers import Trainer, TrainingArguments

    max_steps = steps_for(len(data), batch_size, args.epochs, args.max_steps)
    model, optimizers = prepare(model, setting, max_steps=max_steps, task_type=task_type)
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"),
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        logging_steps=max(1, max_steps // 20),
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=data,
        data_collator=collator,
        optimizers=optimizers,
    )
    trainer.train()
    return model, {"steps": max_steps, **memory_counts(model, optimizers[0])}


def glue_features(data: Any, task: GlueTask, tokenizer: Any, max_length: int) -> Any:
    """Tokenized pairs (or sentences) padded to ``max_length``, with their labels."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = [batch[key] for key in task.text_keys]
        out = tokenizer(*texts, truncation=True, max_length=max_length, padding="max_length")
        cast = float if task.num_labels == 1 else int
        out["labels"] = [cast(y) for y in batch["label"]]
        return out

    return data.map(encode, batched=True, remove_columns=data.column_names)


@torch.no_grad()
def glue_predictions(model: nn.Module, features: Any, task: GlueTask) -> list[float]:
    """The model's class (or, for STS-B, its score) of each example."""
    model.eval()
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(features), 64):
        rows = features[start : start + 64]
        inputs = {k: torch.tensor(rows[k], device=device) for k in ("input_ids", "attention_mask")}
        logits = model(**inputs).logits.float()
        out += logits[:, 0].tolist() if task.num_labels == 1 else logits.argmax(-1).tolist()
    return out


def run_glue(args: FinetuneArgs, setting: MethodSetting) -> dict[str, Any]:
    """Fine-tune on the task's train split; the task's metric over its validation split(s)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    task = GLUE_TASKS[args.task]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    max_length = args.max_length or GLUE_MAX_LENGTH
    train_set = load_split(GLUE_HUB, task.name, "train", args.data_dir)
    features = glue_features(train_set, task, tokenizer, max_length)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=task.num_labels, dtype=default_dtype()
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model, counts = train(
        model,
        setting,
        args,
        features,
        batch_size=args.batch_size or task.batch_size,
        task_type="SEQ_CLS",
    )
    predictions, labels = [], []
    for split in task.eval_splits:  # MNLI: matched and mismatched, scored together
        evaluation = load_split(GLUE_HUB, task.name, split, args.data_dir)
        if args.max_eval:
            evaluation = evaluation.select(range(min(args.max_eval, len(evaluation))))
        scored = glue_features(evaluation, task, tokenizer, max_length)
        predictions += glue_predictions(model, scored, task)
        labels += scored["labels"]
    score = METRICS[task.metric](predictions, labels)
    return {"metrics": percent({task.name: score}), "metric": task.metric, **counts}


def mmlu_features(data: Any, tokenizer: Any, max_length: int) -> Any:
    """Each auxiliary question as context and its answer letter as the only target, cut from
    the left at ``max_length`` tokens so the answer stays."""

    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        text = mmlu_question(row, with_answer=True).rstrip()
        context = mmlu_question(row, with_answer=False)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"][-max_length:]
        answer = len(ids) - len(
            tokenizer(text[len(context) :], add_special_tokens=False)["input_ids"]
        )
        labels = [IGNORE_INDEX] * answer + ids[answer:]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}

    return data.map(encode, remove_columns=data.column_names)


@torch.no_grad()
def mmlu_answers(
    model: nn.Module, tokenizer: Any, prompts: list[str], max_length: int
) -> list[int]:
    """The likeliest answer letter after each prompt (left-padded batches, positions counted
    from each prompt's first token, prompts cut from the left so the question stays)."""
    letters = [tokenizer(f" {c}", add_special_tokens=False)["input_ids"][-1] for c in CHOICES]
    tokenizer.padding_side, tokenizer.truncation_side = "left", "left"
    model.eval()
    device = next(model.parameters()).device
    out: list[int] = []
    for start in range(0, len(prompts), 8):
        batch = tokenizer(
            prompts[start : start + 8],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
        ).to(device)
        positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = model(**batch, position_ids=positions).logits[:, -1, letters]
        out += logits.argmax(-1).tolist()
    return out


def run_mmlu(args: FinetuneArgs, setting: MethodSetting) -> dict[str, Any]:
    """Fine-tune on the auxiliary training set; 5-shot accuracy on the test set by category."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    max_length = args.max_length or MMLU_MAX_LENGTH
    features = mmlu_features(
        load_split(MMLU_HUB, "all", MMLU_TRAIN, args.data_dir), tokenizer, max_length
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=default_dtype())
    collator = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=IGNORE_INDEX)
    model, counts = train(
        model,
        setting,
        args,
        features,
        batch_size=args.batch_size or MMLU_BATCH,
        task_type="CAUSAL_LM",
        collator=collator,
    )
    shots: dict[str, list[dict[str, Any]]] = {}
    for row in load_split(MMLU_HUB, "all", MMLU_SHOTS, args.data_dir):
        shots.setdefault(mmlu_subject(row), []).append(row)
    test = load_split(MMLU_HUB, "all", MMLU_TEST, args.data_dir)
    rows = list(test)[: args.max_eval] if args.max_eval else list(test)
    prompts = [mmlu_prompt(row, shots.get(row["subject"], [])[: args.shots]) for row in rows]
    answers = mmlu_answers(model, tokenizer, prompts, max_length)
    correct = [a == int(row["answer"]) for a, row in zip(answers, rows, strict=True)]
    categories = [MMLU_SUBJECTS[mmlu_subject(row)] for row in rows]
    scores = category_accuracy(correct, categories, MMLU_CATEGORIES)
    return {"metrics": percent(scores), "metric": "accuracy", **counts}
