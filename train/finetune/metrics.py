"""The fine-tuning tables' metrics, as the paper reports them: GLUE's accuracy (MNLI over matched
and mismatched together), CoLA's Matthews correlation and STS-B's Pearson correlation, in percent;
MMLU's accuracy per super-category and over all questions.

Written as the formulas (``evaluate`` needs the hub for its metric scripts, and the machines
that run these recipes may have none); ``tests/train/finetune/test_finetune.py`` checks them
on hand-worked predictions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """The share of predictions equal to their label."""
    if len(predictions) != len(labels) or not labels:
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    return sum(int(p == y) for p, y in zip(predictions, labels, strict=True)) / len(labels)


def matthews_correlation(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """(TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) for binary labels; 0 where a
    factor of the denominator is 0 (a constant prediction or label), as scikit-learn."""
    pairs = list(zip(predictions, labels, strict=True))
    tp = sum(p == 1 and y == 1 for p, y in pairs)
    tn = sum(p == 0 and y == 0 for p, y in pairs)
    fp = sum(p == 1 and y == 0 for p, y in pairs)
    fn = sum(p == 0 and y == 1 for p, y in pairs)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denominator == 0 else (tp * tn - fp * fn) / denominator


def pearson_correlation(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """cov(x, y) / (std(x) std(y)); 0 for a constant prediction."""
    n = len(labels)
    if len(predictions) != n or n < 2:
        raise ValueError(f"{len(predictions)} predictions for {n} labels (2 at least)")
    mean_x, mean_y = sum(predictions) / n, sum(labels) / n
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(predictions, labels, strict=True))
    var_x = sum((x - mean_x) ** 2 for x in predictions)
    var_y = sum((y - mean_y) ** 2 for y in labels)
    return 0.0 if var_x == 0 or var_y == 0 else cov / math.sqrt(var_x * var_y)


def category_accuracy(
    correct: Sequence[bool], categories: Sequence[str], order: Sequence[str]
) -> dict[str, float]:
    """Accuracy over each category's questions (in ``order``, those with questions) and over all
    questions (``"average"``), as MMLU's reference evaluation counts them."""
    totals: dict[str, list[int]] = {}
    for right, category in zip(correct, categories, strict=True):
        totals.setdefault(category, [0, 0])
        totals[category][0] += int(right)
        totals[category][1] += 1
    out = {c: totals[c][0] / totals[c][1] for c in order if c in totals}
    out["average"] = sum(map(int, correct)) / len(correct)
    return out


def percent(scores: Mapping[str, float]) -> dict[str, float]:
    """Scores in percent, as the paper's tables print them."""
    return {key: 100.0 * value for key, value in scores.items()}
