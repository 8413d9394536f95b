"""Perplexity against alpha at each method's best lr of each stage (``alpha.md`` and
``alpha_MODEL.png``): the paper's alpha figure and its module-wise-lr figure; and FOAM-2's alpha
at the paper's own lr, over 3 seeds, read as ``results/repro/PROTOCOL.md`` says (amendment of
2026-11-28)."""

from __future__ import annotations

import math
from pathlib import Path

from repro.experiments import config_alpha, paper_lr
from repro.methods import PAPER_ALPHA_GRID
from repro.paired_stats import REFERENCE, comparison_cells, holm_family, order_read, paired
from repro.paper_perplexity import STAND_INS
from repro.points import (
    CONTROL,
    Point,
    best_points,
    fmt_ppl,
    model_order,
    ordered,
    row_label,
    row_of,
    stages,
)
from repro.tables.figures import save_figure


def alpha_lines(points: list[Point], stage: str) -> dict[tuple[str, str], list[Point]]:
    """(model, row) -> the points of ``stage`` at the row's best lr and gap there, one per alpha
    run at seed 0, where there are at least two.

    This is the paper's alpha figure (is FOAM sensitive to alpha?) and its module-wise-lr figure
    (AdamW with the matrices at lr x alpha against FOAM): at the search's length, where alpha was
    searched, and at the finals' length, where the walk brackets it around the finals' point.
    """
    lines = {}
    for (model, row), best in best_points(points, stage).items():
        k = best.key
        if k.alpha_or_none is None or row == "adamw":  # AdamW's alpha is 1 by definition
            continue
        line = [
            p
            for p in points
            if (p.key.stage, p.key.model, p.key.method, p.key.lr, p.key.gap)
            == (stage, model, k.method, k.lr, k.gap)
            and (row == CONTROL or row_of(p) == row)
            and 0 in p.ppl_by_seed
        ]
        if len(line) > 1:  # a line, not a dot
            lines[(model, row)] = sorted(line, key=lambda p: p.key.alpha)
    return lines


def alpha_table(points: list[Point]) -> str:
    """Each stage's lines at seed 0, then FOAM-2's alpha at the paper's lr over its seeds."""
    lines = [
        "| Stage | Model | Method | lr | gap | alpha | final PPL (seed 0) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for stage in stages(points):
        by_row = alpha_lines(points, stage)
        for model, row in ordered(by_row):
            line = by_row[(model, row)]
            best = min(line, key=lambda p: (p.ppl_by_seed[0], p.key))
            for p in line:
                ppl = p.ppl_by_seed[0]
                lines.append(
                    f"| {stage or '-'} | {model} | {row_label(row)} | {p.key.lr:g} | "
                    f"{p.key.gap or '-'} | {p.key.alpha:g}{' (best)' if p is best else ''} | "
                    f"{'diverged' if math.isinf(ppl) else f'{ppl:.2f}'} |"
                )
    return "\n".join([*lines, *paper_lr_alpha_lines(points)]) + "\n"


def paper_lr_alpha_lines(points: list[Point]) -> list[str]:
    """FOAM-2's finals at the paper's lr for the model it stands in for and each alpha of the
    paper's grid, each alpha paired by seed with the paper's own (Holm over these comparisons):
    FOAM-2 is sensitive to alpha there where one of them resolves family-wise."""
    paper_alpha = config_alpha(REFERENCE)
    lines = []
    for model in sorted({p.key.model for p in points}, key=model_order):
        lr = paper_lr(REFERENCE, STAND_INS.get(model, model))
        by_alpha = {
            p.key.alpha: p
            for p in points
            if (p.key.stage, p.key.model, p.key.method) == ("final", model, REFERENCE)
            and math.isclose(p.key.lr, lr)
            and p.key.alpha in PAPER_ALPHA_GRID
        }
        if paper_alpha not in by_alpha or len(by_alpha) < 2:
            continue
        lines += [
            "",
            f"## FOAM-2's alpha at the paper's lr: {model}, lr {lr:g}",
            "",
            f"PROTOCOL.md, amendment of 2026-11-28: each alpha paired by seed with the paper's "
            f"{paper_alpha:g}, Holm over these comparisons; sensitive where one resolves.",
            "",
            "| alpha | final PPL | seeds |",
            "|---:|---:|---|",
        ]
        for alpha, point in sorted(by_alpha.items()):
            seeds = ", ".join(f"{point.ppl_by_seed[s]:.2f}" for s in sorted(point.ppl_by_seed))
            mark = " (the paper's)" if alpha == paper_alpha else ""
            lines.append(f"| {alpha:g}{mark} | {fmt_ppl(point, latex=False)} | {seeds} |")
        others = [a for a in sorted(by_alpha) if a != paper_alpha]
        diffs = [paired(by_alpha[a], by_alpha[paper_alpha]) for a in others]
        lines += [
            "",
            "| Comparison | difference (paired) | 95% interval | p (Holm, these) | read |",
            "|---|---:|---:|---:|---|",
        ]
        for alpha, diff, p in zip(others, diffs, holm_family(diffs), strict=True):
            a, b = f"alpha {alpha:g}", f"alpha {paper_alpha:g}"
            lines.append(
                f"| {a} − {b} | {comparison_cells(diff, p)} | {order_read(a, b, diff, p)} |"
            )
    return lines


def plot_alpha(points: list[Point], out: Path) -> list[Path]:
    """Final perplexity against alpha at each method's best lr (seed 0), one figure per model and
    one panel per stage (the search, the full-length walk): the paper's alpha figure and its
    module-wise-lr figure in one. APOLLO-Mini's alphas (around 128) are a different scale and stay
    in ``alpha.md`` only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    by_stage = {stage: alpha_lines(points, stage) for stage in stages(points)}
    written = []
    for model in sorted({m for lines in by_stage.values() for m, _ in lines}, key=model_order):
        panels = {
            stage: {
                row: by_row[(m, row)]
                for m, row in ordered(by_row)
                if m == model and row != "apollo_mini"
            }
            for stage, by_row in by_stage.items()
        }
        panels = {stage: lines for stage, lines in panels.items() if lines}
        if not panels:
            continue
        rows = list(dict.fromkeys(row for lines in panels.values() for row in lines))
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
        for ax, (stage, lines) in zip(axes[0], panels.items(), strict=True):
            for row, line in lines.items():
                ax.plot(
                    [p.key.alpha for p in line],
                    [p.ppl_by_seed[0] for p in line],
                    marker="o",
                    label=f"{row_label(row)} (lr {line[0].key.lr:g})",
                    linestyle="--" if row == CONTROL else "-",
                    color=f"C{rows.index(row)}",  # a method's colour in every panel
                )
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.set(xlabel="alpha (matrices at lr x alpha)", ylabel="validation perplexity (seed 0)")
            steps = sorted({p.runs[0]["steps"] for line in lines.values() for p in line if p.runs})
            where = f"{stage}, " if stage else ""
            length = "/".join(map(str, steps))
            ax.set_title(f"{model}, {where}{length} steps: alpha at the best lr", fontsize=10)
        written.append(save_figure(fig, out / f"alpha_{model}.png", *axes[0]))
    return written
