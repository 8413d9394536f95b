"""The ablations (``ablations.md`` and ``ablations_MODEL.png``): FOAM-2's variants at FOAM-2's
best point, each paired with FOAM-2 over the same seeds."""

from __future__ import annotations

from pathlib import Path

from repro.methods import ABLATIONS, FOLD_LEVEL, RESIDUAL, Ablation, label
from repro.paired_stats import REFERENCE, comparison_cells, holm_family, paired
from repro.points import Point, fmt_ppl, model_order, table_stage
from repro.tables.curves import mean_curve, perplexity_axes
from repro.tables.figures import save_figure


def ablation_rows(
    best: dict[tuple[str, str], Point], points: list[Point]
) -> dict[str, list[tuple[Ablation | None, Point]]]:
    """model -> FOAM-2's best point (``None``) and each variant run at that point, in ABLATIONS'
    order."""
    stage = table_stage(points)
    rows: dict[str, list[tuple[Ablation | None, Point]]] = {}
    for model in sorted({p.key.model for p in points}, key=model_order):
        reference = best.get((model, REFERENCE))
        if reference is None:
            continue
        rows[model] = [(None, reference)]
        at_reference = {
            (p.key.method, p.key.lr, p.key.alpha): p
            for p in points
            if (p.key.stage, p.key.model) == (stage, model)
        }
        k = reference.key
        for ablation in ABLATIONS:
            # A variant that is itself a Table 2 method (FOAM-3, FOAM-Mini: its optim config as it
            # is) whose walk ended at FOAM-2's point has no ablation_ runs: its finals are the same.
            point = at_reference.get((ablation.name, k.lr, k.alpha))
            if point is None and not ablation.overrides:
                point = at_reference.get((ablation.optim, k.lr, k.alpha))
            if point is not None:
                rows[model].append((ablation, point))
    return rows


def ablation_table(best: dict[tuple[str, str], Point], points: list[Point]) -> str:
    """FOAM-2's variants at FOAM-2's best point, each against FOAM-2 over the same seeds, read
    as ``paired.md`` reads Table 2's comparisons (95% interval, Holm over the model's variants)."""
    lines = [
        "| Model | Variant | lr | alpha | final PPL | variant − FOAM-2 (paired) | 95% interval "
        "| p (Holm) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, rows in ablation_rows(best, points).items():
        reference = rows[0][1]
        diffs = [None if point is reference else paired(point, reference) for _, point in rows]
        for (ablation, point), diff, p in zip(rows, diffs, holm_family(diffs), strict=True):
            alpha = point.key.alpha_or_none
            lines.append(
                f"| {model} | {variant_label(ablation)} | {point.key.lr:g} | "
                f"{'-' if alpha is None else f'{alpha:g}'} | {fmt_ppl(point, latex=False)} | "
                f"{comparison_cells(diff, p)} |"
            )
    return "\n".join(lines) + "\n"


def variant_label(ablation: Ablation | None) -> str:
    """An ablation row's name: the variant's, or FOAM-2's for the reference (``None``)."""
    return label(REFERENCE) if ablation is None else ablation.label


def plot_ablations(
    best: dict[tuple[str, str], Point], points: list[Point], out: Path
) -> list[Path]:
    """The paper's two ablation figures, one PNG per model: final perplexity against the fold
    level (mean ± sample std over seeds) and FOAM-2's validation curves with and without the
    residual."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model, rows in ablation_rows(best, points).items():
        levels = sorted(
            ((variant_label(a), p) for a, p in rows if a is None or a.figure == FOLD_LEVEL),
            key=lambda row: row[0],  # FOAM-1 ... FOAM-5, FOAM-Mini
        )
        residual = [(a, p) for a, p in rows if a is None or a.figure == RESIDUAL]
        if len(levels) < 2 and len(residual) < 2:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        left.errorbar(
            [name for name, _ in levels],
            [p.mean_ppl for _, p in levels],
            yerr=[p.std_ppl or 0.0 for _, p in levels],
            marker="o",
            capsize=4,
            label="mean ± sample std",
        )
        for name, p in levels:
            left.annotate(f"n={p.n}", (name, p.mean_ppl), textcoords="offset points", xytext=(4, 4))
        left.margins(y=0.12)  # room for the n= labels above the highest point
        left.set_ylabel("final validation perplexity")
        left.set_title(f"{model}: fold level", fontsize=10)
        for ablation, p in residual:
            right.plot(*mean_curve(p), label=f"{variant_label(ablation)} (n={p.n})")
        perplexity_axes(right)
        right.set_title(f"{model}: residual", fontsize=10)
        written.append(save_figure(fig, out / f"ablations_{model}.png", left, right))
    return written
