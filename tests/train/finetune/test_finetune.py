"""The fine-tuning recipes (train/finetune/) offline, on tiny random models and GLUE- and
MMLU-format rows written here: every method trains, evaluates and writes its metrics; the
metrics against hand-worked values; one-line errors without the hub."""

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from train.finetune import cli as finetune
from train.finetune.metrics import (
    accuracy,
    category_accuracy,
    matthews_correlation,
    pearson_correlation,
)
from train.finetune.tasks import MMLU_SUBJECTS

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *(f"w{i}" for i in range(40)), *"ABCD"]
WORDS += ["Answer", ":", ".", "The", "following", "are"]


def test_metrics_on_hand_worked_predictions():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    # TP 2, TN 1, FP 1, FN 1: (2 - 1) / sqrt(3 * 3 * 2 * 2) = 1 / 6
    assert matthews_correlation([1, 1, 0, 1, 0], [1, 1, 1, 0, 0]) == pytest.approx(1 / 6)
    assert matthews_correlation([1, 1, 1], [0, 1, 0]) == 0.0  # a constant prediction
    # x = (1, 2, 3), y = (1, 3, 2): cov 1, var 2 and 2 -> 0.5
    assert pearson_correlation([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    scores = category_accuracy(
        [True, False, True, True],
        ["STEM", "STEM", "other", "humanities"],
        ["STEM", "humanities", "other"],
    )
    assert scores == {"STEM": 0.5, "humanities": 1.0, "other": 1.0, "average": 0.75}


def tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", eos_token="[SEP]"
    )


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def sentence(generator: torch.Generator, n: int = 6) -> list[int]:
    return torch.randint(0, 40, (n,), generator=generator).tolist()


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    """A tiny RoBERTa classifier and RTE-format rows whose label is learnable (first word < 20)."""
    root = tmp_path_factory.mktemp("glue")
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=80,
        pad_token_id=0,
    )
    RobertaForSequenceClassification(config).save_pretrained(root / "model")
    tokenizer().save_pretrained(root / "model")
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 32), ("validation", 12)):
        rows = []
        for _ in range(n):
            ids = sentence(g)
            text = " ".join(f"w{i}" for i in ids)
            rows.append({"sentence1": text, "sentence2": "w1 w2", "label": int(ids[0] < 20)})
        write_rows(root / f"{split}.jsonl", rows)
    return root


@pytest.mark.parametrize("method", ["adamw", "foam", "galore", "apollo", "lora"])
def test_glue_recipe_trains_and_scores_each_method(glue, tmp_path, method):
    argv = ["glue", "--task", "rte", "--model", str(glue / "model"), "--data-dir", str(glue)]
    argv += ["--method", method, "--level", "2", "--max-steps", "3", "--out", str(tmp_path)]
    assert finetune.main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["task"], summary["method"], summary["steps"]) == ("rte", method, 3)
    assert summary["lr"] == 1e-4  # FOAM's paper lr for RTE
    right = summary["metrics"]["rte"] * 12 / 100  # accuracy over the 12 validation rows
    assert right == pytest.approx(round(right))
    assert summary["rank"] == (4 if method in ("galore", "apollo", "lora") else None)
    if method == "lora":  # the adapters and the head train, the model does not
        assert summary["params_trainable"] < summary["params_total"] / 3
    if method == "foam":  # a quarter of Adam's state on the folded matrices at level 2
        assert summary["optimizer_state_numel"] < 2 * summary["params_total"]


@pytest.fixture(scope="module")
def mmlu(tmp_path_factory) -> Path:
    """A tiny LLaMA and MMLU-format rows: auxiliary train, 5 dev shots and test questions."""
    root = tmp_path_factory.mktemp("mmlu")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=3,
        bos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(root / "model")
    tokenizer().save_pretrained(root / "model")
    g = torch.Generator().manual_seed(1)

    def row(subject: str) -> dict:
        choices = [" ".join(f"w{i}" for i in sentence(g, 2)) for _ in range(4)]
        text = " ".join(f"w{i}" for i in sentence(g))
        return {
            "question": text,
            "subject": subject,
            "choices": choices,
            "answer": int(torch.randint(0, 4, (1,), generator=g)),
        }

    subjects = ["anatomy", "astronomy", "philosophy", "sociology"]
    write_rows(root / "auxiliary_train.jsonl", [row("") for _ in range(16)])
    write_rows(root / "dev.jsonl", [row(s) for s in subjects for _ in range(5)])
    write_rows(root / "test.jsonl", [row(s) for s in subjects for _ in range(3)])
    return root


@pytest.mark.parametrize("method", ["foam", "lora"])
def test_mmlu_recipe_scores_each_category(mmlu, tmp_path, method):
    argv = ["mmlu", "--model", str(mmlu / "model"), "--data-dir", str(mmlu), "--lr", "1e-4"]
    argv += ["--method", method, "--level", "2", "--max-steps", "2", "--out", str(tmp_path)]
    assert finetune.main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    metrics = summary["metrics"]
    assert set(metrics) == {"STEM", "social sciences", "humanities", "other", "average"}
    # 3 questions per subject, one subject per category: each category's share is k/3
    assert all(
        round(metrics[c] * 3 / 100, 6) == round(metrics[c] * 3 / 100)
        for c in metrics
        if c != "average"
    )
    assert metrics["average"] == pytest.approx(
        sum(v for c, v in metrics.items() if c != "average") / 4
    )
    assert summary["rank"] == (8 if method == "lora" else None)
    assert MMLU_SUBJECTS["anatomy"] == "other" and MMLU_SUBJECTS["sociology"] == "social sciences"


def test_without_the_hub_a_hub_name_is_one_line_naming_the_flag(
    glue, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["glue", "--task", "cola", "--model", "roberta-large", "--out", str(tmp_path)]
    assert finetune.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--model DIR" in err
    argv = ["glue", "--task", "cola", "--model", str(glue / "model"), "--out", str(tmp_path)]
    assert finetune.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--data-dir DIR" in err and "nyu-mll/glue" in err


def test_the_glue_experiment_lays_out_the_papers_grid_and_its_table(glue, tmp_path, capsys):
    """``sweep.py --experiment glue``: the paper's grid (8 tasks x 5 methods x 8 lrs) with its
    GPU-hours; one of its runs on the tiny model, then the table with the paper's numbers."""
    from repro import sweep
    from repro.points import load_points
    from repro.tables.experiments import experiment_outputs

    assert sweep.main(["--experiment", "glue", "--dry-run", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("# glue: 320 runs") and "GPU-hours on H100" in lines[-1]
    tiny = ["--experiment", "glue", "--model", str(glue / "model"), "--methods", "foam"]
    extra = ["--", "--level", "2", "--max-steps", "2", "--data-dir", str(glue)]
    assert sweep.main([*tiny, "--dry-run", "--root", str(tmp_path), *extra]) == 0
    commands = [
        line.split() for line in capsys.readouterr().out.splitlines() if "finetune.py" in line
    ]
    assert len(commands) == 8 * 8
    rte = next(c for c in commands if "rte" in c and c[c.index("--lr") + 1] == "0.0001")
    assert finetune.main(rte[rte.index("glue") :]) == 0
    table = experiment_outputs(load_points(tmp_path), tmp_path)["glue.md"]
    foam_row = next(line for line in table.splitlines() if line.startswith("| FOAM |"))
    assert "(0.71G)" in foam_row and "(83.03)" in foam_row  # the paper's memory and RTE
    assert "- (64.30)" in foam_row  # CoLA did not run here


def test_the_mmlu_table_takes_each_methods_best_lr_by_the_average(tmp_path):
    from repro.tables.finetune import finetune_outputs

    def summary(method: str, lr: float, stem: float, average: float) -> None:
        run_dir = tmp_path / "finetune" / "mmlu" / "Qwen--Qwen2.5-7B" / "mmlu" / method / f"lr{lr}"
        run_dir.mkdir(parents=True)
        metrics = {"STEM": stem, "social sciences": 80.0, "humanities": 60.0, "other": 70.0}
        record = {"benchmark": "mmlu", "model": "Qwen/Qwen2.5-7B", "task": "mmlu", "method": method}
        record["metrics"] = {**metrics, "average": average}
        (run_dir / "summary.json").write_text(json.dumps(record))

    summary("foam", 1e-5, 70.0, 72.0)
    summary("foam", 2e-4, 75.0, 71.0)  # a better STEM, a worse average: not the best lr
    table = finetune_outputs(tmp_path)["mmlu.md"]
    assert (
        "| FOAM | 70.00 (69.12) | 80.00 (83.49) | 60.00 (66.48) | 70.00 (76.28) | 72.00 (73.04) |"
        in table
    )
    assert "| Full-Adam | - (-) |" in table  # out of memory in the paper, not run here
