"""Table 2: each method's best point (final perplexity, flagged where the point may not be the
optimum at its length) beside the estimator's memory, in markdown and LaTeX."""

from __future__ import annotations

import math

from repro.memory_estimator import estimate, table2_gb
from repro.paired_stats import fmt_diff, paired
from repro.points import (
    CONTROL,
    EDGE,
    NO_ALPHA,
    Point,
    fmt_gb,
    fmt_ppl,
    method_rows,
    model_order,
    row_label,
    row_of,
    table_stage,
)


def edge_notes(point: Point, points: list[Point], row: str) -> list[str]:
    """Why ``point`` may not be the optimum at its own length: an lr or alpha neighbour (x2, /2)
    not run there, or one that did better over the seeds both ran (a point kept for its seeds,
    which a walk has since left)."""
    k = point.key
    same = [
        p
        for p in points
        if (p.key.stage, p.key.model, p.key.method, p.key.gap)
        == (k.stage, k.model, k.method, k.gap)
        and (row == CONTROL or row_of(p) == row)
    ]

    def at(lr: float, alpha: float) -> Point | None:
        return next(
            (p for p in same if math.isclose(p.key.lr, lr) and math.isclose(p.key.alpha, alpha)),
            None,
        )

    axes = {"lr": [(k.lr * f, k.alpha) for f in (0.5, 2.0)]}
    if k.alpha != NO_ALPHA and row != "adamw":  # Full-Adam's alpha is 1 by definition
        axes["alpha"] = [(k.lr, k.alpha * f) for f in (0.5, 2.0)]
    notes = []
    for axis, around in axes.items():
        neighbours = [at(lr, alpha) for lr, alpha in around]
        if None in neighbours:
            notes.append(f"{axis} on the grid's edge")
        for neighbour in filter(None, neighbours):
            diff = paired(neighbour, point)
            if diff is not None and diff[0] < 0:
                value = neighbour.key.lr if axis == "lr" else neighbour.key.alpha
                notes.append(f"{axis} {value:g} did better: {fmt_diff(diff)}")
    return notes


def estimated_gb(model: str, method: str) -> float | None:
    """Table 2's memory convention, from the estimator (None where it has no such size/method)."""
    try:
        return table2_gb(estimate(model, "adamw" if method == CONTROL else method))
    except (LookupError, ValueError, FileNotFoundError):
        return None


def table2(best: dict[tuple[str, str], Point], points: list[Point], latex: bool) -> str:
    models = sorted({m for m, _ in best}, key=model_order)
    rows = method_rows({row for _, row in best})
    if latex:
        lines = [
            "\\begin{tabular}{l|" + "|".join("cc" for _ in models) + "}",
            "\\toprule",
            "Methods & " + " & ".join(f"\\multicolumn{{2}}{{c}}{{{m}}}" for m in models) + " \\\\",
            " & " + " & ".join("Perplexity & Memory" for _ in models) + " \\\\",
            "\\midrule",
        ]
    else:
        lines = [
            "| Method | " + " | ".join(f"{m} PPL | {m} memory" for m in models) + " |",
            "|---|" + "---:|---:|" * len(models),
        ]
    notes = []
    for row in rows:
        if row is None:
            lines.append("\\midrule" if latex else "|" + " |" * (2 * len(models) + 1))
            continue
        cells = []
        for model in models:
            point = best.get((model, row))
            why = edge_notes(point, points, row) if point else []
            notes += [f"{model} {row_label(row)}: {note}" for note in why]
            cells += [fmt_ppl(point, latex, flag=bool(why)), fmt_gb(estimated_gb(model, row))]
        sep = " & " if latex else " | "
        line = row_label(row) + sep + sep.join(cells)
        lines.append(line + " \\\\" if latex else f"| {line} |")
    if latex:
        lines += ["\\bottomrule", "\\end{tabular}"]
        return "\n".join(lines) + "\n"
    lines.append("")
    lines.append("Final validation perplexity: mean ± sample std over n seeds.")
    lines += [f"{EDGE} {note}" for note in notes]
    stage = table_stage(points)
    for model in models:
        seen = {row_of(p) for p in points if p.key.model == model and p.key.stage != stage}
        pending = [r for r in method_rows(seen) if r is not None and (model, r) not in best]
        if pending:
            names = ", ".join(row_label(r) for r in pending)
            lines.append(
                f"Not yet run in {stage}/ on {model} (their runs are in sweep.md): {names}."
            )
    return "\n".join(lines) + "\n"
