"""``paired.md``: FOAM-2 against each method (and the tier comparisons) over the same seeds,
with its interval, Holm-adjusted p and the paper's difference."""

from __future__ import annotations

from repro.paired_stats import (
    ORDER_SEEDS,
    REFERENCE,
    TIER_COMPARISONS,
    comparison_cells,
    confidence_interval,
    holm_family,
    paired,
)
from repro.paper_perplexity import STAND_INS, paper_ppl
from repro.points import Point, method_rows, model_order, row_label


def agreement(interval: tuple[float, float] | None, paper_diff: float | None, n: int) -> str:
    """Whether a difference's sign here is the paper's, where the interval resolves it over the
    finals' seeds (PROTOCOL.md: an order is read over 3 paired seeds, not fewer)."""
    if interval is None or not paper_diff:
        return "-"
    if n < ORDER_SEEDS:
        return f"not read (n < {ORDER_SEEDS})"
    low, high = interval
    if low <= 0 <= high:
        return "not resolved (interval holds 0)"
    return "yes" if (low > 0) == (paper_diff > 0) else "no (the other way)"


def comparisons(rows: set[str]) -> list[tuple[str, str]]:
    """The (row, row) pairs of a model's paired table: FOAM-2 against every other row, in Table
    2's order, then the tier comparisons whose rows both ran."""
    against = (
        [(REFERENCE, r) for r in method_rows(rows) if r not in (None, REFERENCE)]
        if REFERENCE in rows
        else []
    )
    return against + [(a, b) for a, b in TIER_COMPARISONS if {a, b} <= rows]


def paired_table(best: dict[tuple[str, str], Point]) -> str:
    """Each comparison's difference seed by seed (the same initialisation and data order), its
    95% interval, and the paper's difference on the model this one is (or stands in for)."""
    lines = [
        "| Model | Comparison | PPL difference (paired over seeds) | 95% interval "
        "| p (Holm) | paper | same order as the paper |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for model in sorted({m for m, _ in best}, key=model_order):
        pairs = comparisons({r for m, r in best if m == model})
        diffs = [paired(best[(model, a)], best[(model, b)]) for a, b in pairs]
        for (a, b), diff, p in zip(pairs, diffs, holm_family(diffs), strict=True):
            interval = confidence_interval(diff)
            theirs = paper_ppl(model, a), paper_ppl(model, b)
            paper_diff = None if None in theirs else theirs[0] - theirs[1]
            lines.append(
                f"| {model} | {row_label(a)} − {row_label(b)} | {comparison_cells(diff, p)} | "
                f"{'-' if paper_diff is None else f'{paper_diff:+.2f}'} | "
                f"{agreement(interval, paper_diff, 0 if diff is None else diff[2])} |"
            )
    stand_ins = sorted({STAND_INS[m] + f" for {m}" for m, _ in best if m in STAND_INS})
    lines += [
        "",
        f"paper: the same difference in the paper's Table 2 (its mean perplexities), on the "
        f"same model{''.join(f'; {s}' for s in stand_ins)}. The interval is Student's t over "
        "the seeds. p (Holm): the paired t-test's two-sided p, Holm-adjusted over the model's "
        f"comparisons with {ORDER_SEEDS} or more paired seeds, the family-wise check on the order "
        "column (which reads each comparison on its own, as PROTOCOL.md decided before the "
        "finals).",
    ]
    return "\n".join(lines) + "\n"
