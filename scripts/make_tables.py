"""Tables 2-3, the ablations and validation curves from the ``summary.json`` files of finished runs.

A run's place is read from its path, ``ROOT[/STAGE]/MODEL/METHOD/lr{lr}[_alpha{a}][_gap{g}]_seed{s}``
as ``scripts/sweep.py`` and ``scripts/reproduce_cpu.py`` lay them out (``STAGE`` is ``search`` or
``final`` for the latter). Runs of one point (model, method, lr, alpha, refresh gap) are its seeds:
mean, **sample** standard deviation and n. Table 2 takes, for each method, the final-stage point
with the most seeds and then the lowest mean perplexity (the point whose finals ran; with no
stages, the best point of the sweep), and flags a best point whose lr neighbours (x2, /2) were
not both run at its length, or whose alpha lies on the edge of the alphas run there at its lr.
Also written: Table 3, every point (``sweep.md``), FOAM-2 against each method (and FOAM-Mini
against APOLLO-Mini) paired over the same seeds, with its 95% interval, its Holm-adjusted p and
the paper's difference (``paired.md``), the ablations
(``ablations.md``, FOAM-2's variants in ``ablation_*`` directories), every lr run at full length
at the best points' alpha and gap (``carry_over.md``), each method's perplexity against alpha at
its best lr of each stage (``alpha.md``; with ``--curves`` also ``alpha_MODEL.png``, and the
ablation figures ``ablations_MODEL.png``) and the commits the runs came from (``provenance.md``).
Output is deterministic, so committed tables regenerate byte for byte.

    python scripts/make_tables.py runs/sweep --out results/tables --curves
    python scripts/make_tables.py results/repro/runs --out results/repro/tables --curves
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from experiment_tables import experiment_outputs
from figures import save_figure
from memory_estimator import estimate, table2_gb
from methods import (
    ABLATION_PREFIX,
    ABLATIONS,
    FOLD_LEVEL,
    RESIDUAL,
    TABLE2,
    TABLE2_BLOCKS,
    Ablation,
    label,
)
from paired_stats import (
    ORDER_SEEDS,
    REFERENCE,
    TIER_COMPARISONS,
    confidence_interval,
    fmt_diff,
    fmt_interval,
    fmt_p,
    holm_family,
    paired,
)
from paper_perplexity import STAND_INS, paper_ppl
from study_points import (
    CONTROL,
    EDGE,
    NO_ALPHA,
    Point,
    best_points,
    fmt_gb,
    fmt_ppl,
    load_points,
    model_order,
    row_label,
    row_of,
    stages,
    table_stage,
)
from table_views import views_table


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


def method_rows(rows_seen: set[str]) -> list[str | None]:
    """Table 2's rows present in the data, in the paper's order (None: a block separator)."""
    rows: list[str | None] = []
    for index, block in enumerate(TABLE2_BLOCKS):
        present = [m.name for m in block if m.name in rows_seen]
        if index == 0 and CONTROL in rows_seen:
            present.append(CONTROL)
        if present:
            rows += [None, *present] if rows else present
    return rows


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


def ppl_at(point: Point, step: int) -> float | None:
    """Mean over seeds of the validation perplexity logged at ``step`` (None if not logged)."""
    values = [
        e["val_ppl"] for r in point.runs for e in r.get("eval_history", []) if e["step"] == step
    ]
    return statistics.fmean(values) if values and len(values) == len(point.runs) else None


def table3(best: dict[tuple[str, str], Point], steps: list[int], latex: bool) -> str:
    header = ["Model", "Method", "Memory", *[f"{s}" for s in steps], "Time (h)", "Tokens/s"]
    if latex:
        lines = ["\\begin{tabular}{ll|c|" + "c" * len(steps) + "|cc}", "\\toprule"]
        lines.append(" & ".join(header) + " \\\\")
        lines.append("\\midrule")
    else:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    order = [m for m in method_rows({m for _, m in best}) if m is not None]
    for model, row in sorted(best, key=lambda k: (model_order(k[0]), order.index(k[1]))):
        point = best[(model, row)]
        at = [ppl_at(point, s) for s in steps]
        cells = [
            model,
            row_label(row),
            f"{point.mean('peak_memory_bytes') / 2**30:.2f}G",
            *["-" if v is None else f"{v:.2f}" for v in at],
            f"{point.mean('wall_time_s') / 3600:.3f}",
            f"{point.mean('tokens_per_s') / 1e3:.1f}K",
        ]
        lines.append(" & ".join(cells) + " \\\\" if latex else "| " + " | ".join(cells) + " |")
    if latex:
        lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


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
                f"| {model} | {row_label(a)} − {row_label(b)} | {fmt_diff(diff)} | "
                f"{fmt_interval(interval)} | {fmt_p(p)} | "
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
            # A variant that is itself a Table 2 method (FOAM-3, FOAM-Mini) whose walk ended at
            # FOAM-2's point has no ablation_ runs: its finals are the same runs.
            point = at_reference.get((ABLATION_PREFIX + ablation.name, k.lr, k.alpha))
            point = point or at_reference.get((ablation.name, k.lr, k.alpha))
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
                f"{fmt_diff(diff)} | {fmt_interval(confidence_interval(diff))} | {fmt_p(p)} |"
            )
    return "\n".join(lines) + "\n"


def variant_label(ablation: Ablation | None) -> str:
    """An ablation row's name: the variant's, or FOAM-2's for the reference (``None``)."""
    return label(REFERENCE) if ablation is None else ablation.label


def carry_over_table(best: dict[tuple[str, str], Point], points: list[Point]) -> str:
    """The best points' lr neighbours at the final length: did the search's optimum move?"""
    lines = ["| Model | Method | lr | alpha | final PPL (seed 0) |", "|---|---|---:|---:|---:|"]
    for (model, row), point in sorted(best.items(), key=lambda kv: (model_order(kv[0][0]), kv[0])):
        k = point.key
        line = [
            p
            for p in points
            if (p.key.stage, p.key.model, p.key.method, p.key.alpha, p.key.gap)
            == (k.stage, k.model, k.method, k.alpha, k.gap)
        ]
        if len(line) < 2 or (row == CONTROL and point is best.get((model, "adamw"))):
            continue  # a control whose best is AdamW's own point has AdamW's line
        for p in sorted(line, key=lambda p: p.key.lr):
            ppl = p.ppl_by_seed.get(0)
            chosen = " (chosen)" if p is point else ""
            alpha = p.key.alpha_or_none
            lines.append(
                f"| {model} | {row_label(row)} | {p.key.lr:g}{chosen} | "
                f"{'-' if alpha is None else f'{alpha:g}'} | "
                f"{'-' if ppl is None else f'{ppl:.2f}'} |"
            )
    return "\n".join(lines) + "\n"


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
    return "\n".join(lines) + "\n"


def ordered(keys: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(model, row) keys by model size, then in Table 2's order."""
    keys = set(keys)
    return [
        (model, row)
        for model in sorted({m for m, _ in keys}, key=model_order)
        for row in method_rows({r for m, r in keys if m == model})
        if row is not None
    ]


def sweep_table(points: list[Point]) -> str:
    """Every point, so the choice of the best one can be checked."""
    lines = [
        "| Stage | Model | Method | lr | alpha | gap | projections | steps | final PPL |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(points, key=lambda p: (p.key.stage, model_order(p.key.model), p.key)):
        k = p.key
        alpha = k.alpha_or_none
        projections = {r.get("projections") for r in p.runs} - {None}
        steps = {r["steps"] for r in p.runs}
        ppl = "diverged" if math.isinf(p.mean_ppl) else fmt_ppl(p, latex=False)
        lines.append(
            f"| {k.stage or '-'} | {k.model} | {k.method} | {k.lr:g} | "
            f"{'-' if alpha is None else f'{alpha:g}'} | {k.gap or '-'} | "
            f"{'/'.join(map(str, sorted(projections))) or '-'} | "
            f"{'/'.join(map(str, sorted(steps))) or '-'} | {ppl} |"
        )
    return "\n".join(lines) + "\n"


def provenance(points: list[Point]) -> str:
    """The commits and tokenizers the runs came from (a ``-dirty`` sha means uncommitted changes),
    and the wall-clock hours they took.

    The tokenizer's name carries a hash of its training text, so runs on different corpora show
    as different rows, and a table that mixes them says so: their perplexities do not compare.
    """
    runs: Counter[tuple[str, str]] = Counter()
    hours: Counter[tuple[str, str]] = Counter()
    for run in (r for p in points for r in p.runs):
        origin = (run.get("git_sha", "unknown"), run.get("tokenizer") or "unrecorded")
        runs[origin] += 1
        hours[origin] += (run.get("wall_time_s") or 0.0) / 3600
    lines = ["| git sha | tokenizer | runs | hours |", "|---|---|---:|---:|"]
    lines += [
        f"| {sha} | {tok} | {runs[sha, tok]} | {hours[sha, tok]:.1f} |" for sha, tok in sorted(runs)
    ]
    lines.append(f"| all | | {sum(runs.values())} | {sum(hours.values()):.1f} |")
    tokenizers = sorted({tok for _, tok in runs})
    if len(tokenizers) > 1:
        lines.append(
            f"\n**Warning**: these runs used {len(tokenizers)} tokenizers "
            f"({', '.join(tokenizers)}); perplexities across them are not comparable."
        )
    return "\n".join(lines) + "\n"


def plot_curves(best: dict[tuple[str, str], Point], out: Path) -> list[Path]:
    """Validation perplexity against tokens, one figure per model (the paper's Figure 1).

    Each curve is the mean over the point's seeds at each evaluation.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model in sorted({m for m, _ in best}, key=model_order):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for row in method_rows({r for m, r in best if m == model}):
            if row is None:
                continue
            point = best[(model, row)]
            ax.plot(
                *mean_curve(point),
                label=f"{row_label(row)} (n={point.n})",
                linestyle="--" if row == CONTROL else "-",
            )
        ax.set(title=model)
        perplexity_axes(ax)
        written.append(save_figure(fig, out / f"curves_{model}.png", ax))
    return written


def mean_curve(point: Point) -> tuple[list[float], list[float]]:
    """Training tokens (M) and validation perplexity, each the mean over the point's seeds at
    the evaluations every seed logged."""
    by_step: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for run in point.runs:
        for e in run.get("eval_history", []):
            by_step[e["step"]].append((e["tokens"], e["val_ppl"]))
    steps = sorted(s for s, v in by_step.items() if len(v) == len(point.runs))
    return (
        [statistics.fmean(t for t, _ in by_step[s]) / 1e6 for s in steps],
        [statistics.fmean(v for _, v in by_step[s]) for s in steps],
    )


def perplexity_axes(ax) -> None:
    """Validation perplexity (log scale) against training tokens."""
    import matplotlib.ticker

    ax.set(xlabel="training tokens (M)", ylabel="validation perplexity")
    ax.set_yscale("log")
    # Plain numbers on the log axis: a decade rarely fits, so the minor ticks carry the labels.
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:.0f}"))
    ax.yaxis.set_minor_locator(
        matplotlib.ticker.LogLocator(subs=(1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8))
    )
    ax.yaxis.set_minor_formatter(matplotlib.ticker.StrMethodFormatter("{x:.0f}"))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory searched for summary.json files")
    parser.add_argument("--out", type=Path, default=None, help="write tables (and curves) here")
    parser.add_argument("--table3-steps", nargs="+", type=int, default=None)
    parser.add_argument("--curves", action="store_true", help="also plot validation curves (PNG)")
    args = parser.parse_args(argv)

    points = load_points(args.root)
    if not any(p.runs for p in points):
        raise SystemExit(f"no finished runs (summary.json) under {args.root}")
    table2_rows = {m.name for m in TABLE2} | {CONTROL}
    best = {k: v for k, v in best_points(points).items() if k[1] in table2_rows}
    if not best:
        names = ", ".join(m.name for m in TABLE2)
        raise SystemExit(f"no runs of the paper's methods ({names}) under {args.root}")
    steps = args.table3_steps or sorted(
        {e["step"] for p in best.values() for r in p.runs for e in r.get("eval_history", [])}
    )
    outputs = {
        "table2.md": table2(best, points, latex=False),
        "table2.tex": table2(best, points, latex=True),
        "table3.md": table3(best, steps, latex=False),
        "table3.tex": table3(best, steps, latex=True),
        "paired.md": paired_table(best),
        "views.md": views_table(points),
        "ablations.md": ablation_table(best, points),
        "carry_over.md": carry_over_table(best, points),
        "alpha.md": alpha_table(points),
        "sweep.md": sweep_table(points),
        "provenance.md": provenance(points),
    }

    outputs.update(experiment_outputs(points, args.root, args.out if args.curves else None))
    if args.out is None:
        for name in ("table2.md", "paired.md", "ablations.md", "sweep.md"):
            print(f"## {name}\n\n{outputs[name]}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        (args.out / name).write_text(text)
    if args.curves:
        plot_curves(best, args.out)
        plot_alpha(points, args.out)
        plot_ablations(best, points, args.out)
    print(f"wrote {', '.join(sorted(outputs))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
