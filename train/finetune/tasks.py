"""The fine-tuning benchmarks' data: GLUE's eight tasks of the paper's table and MMLU (train on
its auxiliary set, score 5-shot on its test set per super-category), from the hub or from a local
folder of ``SPLIT.jsonl`` files (``--data-dir``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.data.corpus import hub_reachable


class FinetuneError(ValueError):
    """A recipe that cannot run as asked: one line for the user (exit status 2)."""


@dataclass(frozen=True)
class GlueTask:
    name: str
    """The hub config (``nyu-mll/glue``) and the table's column."""
    text_keys: tuple[str, ...]
    num_labels: int
    """1: a regression (STS-B's similarity)."""
    metric: str
    """``accuracy``, ``matthews`` or ``pearson``: as the paper's table reports the task."""
    batch_size: int
    """The paper's (Appendix, "Hyperparameters of fine-tuning ... on GLUE")."""
    foam_lr: float
    """FOAM's lr in that table."""
    eval_splits: tuple[str, ...] = ("validation",)


GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence",), 2, "matthews", 32, 2e-4),
        GlueTask("stsb", ("sentence1", "sentence2"), 1, "pearson", 16, 1.5e-4),
        GlueTask("mrpc", ("sentence1", "sentence2"), 2, "accuracy", 16, 1.5e-4),
        GlueTask("rte", ("sentence1", "sentence2"), 2, "accuracy", 16, 1e-4),
        GlueTask("sst2", ("sentence",), 2, "accuracy", 16, 5e-5),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            3,
            "accuracy",
            16,
            2.5e-5,
            ("validation_matched", "validation_mismatched"),
        ),
        GlueTask("qnli", ("question", "sentence"), 2, "accuracy", 16, 2.5e-5),
        GlueTask("qqp", ("question1", "question2"), 2, "accuracy", 16, 2.5e-5),
    )
}
"""In the paper's column order. MNLI is scored over matched and mismatched together."""

GLUE_HUB = "nyu-mll/glue"
MMLU_HUB = "cais/mmlu"
MMLU_CATEGORIES = ("STEM", "social sciences", "humanities", "other")
"""The paper's columns (STEM, Soc., Hum., Other), then the average over all questions."""
MMLU_TRAIN, MMLU_SHOTS, MMLU_TEST = "auxiliary_train", "dev", "test"
CHOICES = "ABCD"

_STEM = (
    "abstract_algebra astronomy college_biology college_chemistry college_computer_science "
    "college_mathematics college_physics computer_security conceptual_physics "
    "electrical_engineering elementary_mathematics high_school_biology high_school_chemistry "
    "high_school_computer_science high_school_mathematics high_school_physics "
    "high_school_statistics machine_learning"
)
_SOCIAL = (
    "econometrics high_school_geography high_school_government_and_politics "
    "high_school_macroeconomics high_school_microeconomics high_school_psychology human_sexuality "
    "professional_psychology public_relations security_studies sociology us_foreign_policy"
)
_HUMANITIES = (
    "formal_logic high_school_european_history high_school_us_history high_school_world_history "
    "international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy "
    "prehistory professional_law world_religions"
)
_OTHER = (
    "anatomy business_ethics clinical_knowledge college_medicine global_facts human_aging management "
    "marketing medical_genetics miscellaneous nutrition professional_accounting "
    "professional_medicine virology"
)
MMLU_SUBJECTS: dict[str, str] = {
    subject: category
    for category, names in zip(MMLU_CATEGORIES, (_STEM, _SOCIAL, _HUMANITIES, _OTHER), strict=True)
    for subject in names.split()
}
"""MMLU's 57 subjects by super-category (Hendrycks et al.'s grouping)."""


def load_split(hub: str, config: str, split: str, data_dir: Path | None) -> Any:
    """One split as a ``datasets.Dataset``: ``data_dir/SPLIT.jsonl``, else from the hub; offline
    or missing, a one-line ``FinetuneError`` naming ``--data-dir``."""
    import datasets

    if data_dir is not None:
        path = Path(data_dir) / f"{split}.jsonl"
        if not path.is_file():
            raise FinetuneError(f"--data-dir {data_dir}: no {path.name} (one JSON row a line)")
        return datasets.load_dataset("json", data_files=str(path), split="train")
    if not hub_reachable():
        raise FinetuneError(
            f"{hub} ({config}, {split}) needs the Hugging Face hub, which is not reachable; "
            f"give --data-dir DIR with {split}.jsonl"
        )
    return datasets.load_dataset(hub, config, split=split)


def mmlu_subject(row: dict[str, Any]) -> str:
    """The subject of an MMLU test row, which every row of the hub's ``all`` config names."""
    if row["subject"] not in MMLU_SUBJECTS:
        raise FinetuneError(f"MMLU row of unknown subject {row['subject']!r}")
    return row["subject"]


def mmlu_question(row: dict[str, Any], with_answer: bool) -> str:
    """A question as MMLU's reference prompt writes it: the question, the lettered choices, then
    ``Answer:`` (and the letter, for a shot or a training example)."""
    row = row.get("train", row)  # older copies of the auxiliary set nest each row
    lines = [row["question"].strip()]
    lines += [f"{letter}. {choice}" for letter, choice in zip(CHOICES, row["choices"], strict=True)]
    answer = f" {CHOICES[int(row['answer'])]}\n\n" if with_answer else ""
    return "\n".join(lines) + "\nAnswer:" + answer


def mmlu_prompt(row: dict[str, Any], shots: list[dict[str, Any]]) -> str:
    """The 5-shot prompt: the header of the subject, its dev questions answered, the question."""
    subject = mmlu_subject(row).replace("_", " ")
    header = f"The following are multiple choice questions (with answers) about {subject}.\n\n"
    return header + "".join(mmlu_question(s, True) for s in shots) + mmlu_question(row, False)
