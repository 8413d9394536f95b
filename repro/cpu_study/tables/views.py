"""The CPU study's two views of Table 2 (``results/repro/PROTOCOL.md``, v3), and the order as a whole.

Besides Table 2 as first reported (one lr for three rows, alpha free for the rest), for which tau
was computed after its reading, hence post hoc:

* **Equal freedom**: every method with two lrs (lr for the embeddings, head and norms, lr x alpha
  for the matrices): the module-wise-lr control stands for Full-Adam, ``muon_modulewise`` for
  Muon and ``adam_mini_modulewise`` for Adam-mini; every row at its best point, alpha free.
* **As the paper tunes**: Full-Adam, Muon and Adam-mini with their one lr; every method with an
  alpha at its best point with alpha on the paper's grid (``methods.paper_alpha_range``).

In each view FOAM-2 is paired against every other row (and FOAM-Mini against APOLLO-Mini), Holm
over the view's family; an order is read only where the Holm-adjusted p is below 0.05. The order
as a whole is Kendall's tau between the view's means and the paper's 60M column, with a percentile
bootstrap over each row's seeds. All of it was fixed before the view's finals (the amendment).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from repro.methods import paper_alpha_range, sweeps_alpha
from repro.paired_stats import (
    ORDER_SEEDS,
    REFERENCE,
    TIER_COMPARISONS,
    comparison_cells,
    holm_family,
    order_read,
    paired,
)
from repro.paper_perplexity import paper_ppl
from repro.points import CONTROL, Point, best_points, fmt_ppl, model_order, row_label

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class View:
    name: str
    title: str
    rows: tuple[tuple[str, str | None], ...]
    """(the study's row, the paper's Table 2 row it stands for; None: no paper row)."""
    paper_grid: bool
    """Whether a point's alpha must lie on the paper's grid."""


_SHARED = tuple(
    (name, name)
    for name in ("galore_1_4", "apollo_1_4", "foam2", "foam3", "apollo_mini", "foam_mini")
)
VIEWS = (
    View(
        "as_reported",
        "Table 2 as first reported: one lr for Full-Adam, Muon and Adam-mini, alpha free",
        (
            ("adamw", "adamw"),
            ("muon", "muon"),
            ("adam_mini", "adam_mini"),
            (CONTROL, None),
            *_SHARED,
        ),
        paper_grid=False,
    ),
    View(
        "equal_freedom",
        "Equal freedom: every method with two lrs",
        (
            (CONTROL, "adamw"),
            ("muon_modulewise", "muon"),
            ("adam_mini_modulewise", "adam_mini"),
            *_SHARED,
        ),
        paper_grid=False,
    ),
    View(
        "paper_tuning",
        "As the paper tunes: alpha on the paper's grid, Full-Adam, Muon and Adam-mini at one lr",
        (
            ("adamw", "adamw"),
            ("muon", "muon"),
            ("adam_mini", "adam_mini"),
            (CONTROL, None),
            *_SHARED,
        ),
        paper_grid=True,
    ),
)


def on_paper_grid(point: Point) -> bool:
    """Whether a point's alpha is one the paper's tuning allows its method (no alpha: yes)."""
    alpha = point.key.alpha_or_none
    if alpha is None:
        return True
    low, high = paper_alpha_range(point.key.method)
    return low <= alpha <= high


def view_best(points: list[Point], view: View) -> dict[tuple[str, str], Point]:
    """(model, row) -> the row's point in this view, by Table 2's rule (most seeds, then the
    lowest mean) over the points the view allows."""
    allowed = [p for p in points if on_paper_grid(p)] if view.paper_grid else points
    rows = {row for row, _ in view.rows}
    return {k: p for k, p in best_points(allowed).items() if k[1] in rows}


def fmt_point(point: Point, row: str, view: View) -> str:
    """The point's lr, alpha and gap; in the paper's view, an alpha the row tuned that sits on an
    end of the paper's grid is marked (the protocol reports it as what that tuning allows)."""
    k = point.key
    parts = [f"{k.lr:g}"]
    alpha = k.alpha_or_none
    if alpha is not None:
        tuned = row == CONTROL or sweeps_alpha(k.method)
        edge = view.paper_grid and tuned and alpha in paper_alpha_range(k.method)
        parts.append(f"alpha {alpha:g}" + (" (the grid's edge)" if edge else ""))
    if k.gap:
        parts.append(f"gap {k.gap}")
    return ", ".join(parts)


def kendall_tau(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between each row of ``ours`` (resamples x rows) and ``theirs`` (rows),
    vectorised over the resamples (scipy's ``kendalltau`` takes one pair of orders at a time;
    ``tests/repro/cpu_study/test_table_views.py`` checks the two agree, ties included)."""
    upper = np.triu_indices(theirs.shape[-1], k=1)
    a = np.sign(ours[..., :, None] - ours[..., None, :])[..., upper[0], upper[1]]
    b = np.sign(theirs[:, None] - theirs[None, :])[upper]
    untied = np.sqrt(np.count_nonzero(a, axis=-1) * np.count_nonzero(b))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(axis=-1) / untied


def bootstrap_tau(
    seeds: list[list[float]], theirs: list[float], resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """The 95% percentile interval of tau when each row's seeds are resampled with replacement
    (the rows' means move with their seed noise; the paper's order is held fixed)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = np.stack(
        [rng.choice(values, size=(resamples, len(values))).mean(axis=1) for values in seeds],
        axis=1,
    )
    low, high = np.nanpercentile(kendall_tau(means, np.asarray(theirs)), [2.5, 97.5])
    return float(low), float(high)


def reversed_pairs(ours: list[float], theirs: list[float]) -> tuple[int, int]:
    """Pairs of rows ordered the other way from the paper's, and all pairs."""
    pairs = [(i, j) for i in range(len(ours)) for j in range(i + 1, len(ours))]
    flipped = sum((ours[i] - ours[j]) * (theirs[i] - theirs[j]) < 0 for i, j in pairs)
    return flipped, len(pairs)


def view_section(points: list[Point], view: View) -> str:
    best = view_best(points, view)
    lines = [f"## {view.title}", ""]
    for model in sorted({m for m, _ in best}, key=model_order):
        lines += [
            f"### {model}",
            "",
            "| Row | stands for (paper) | final PPL | seeds | point | paper, 60M |",
            "|---|---|---:|---|---|---:|",
        ]
        present = [(row, theirs) for row, theirs in view.rows if (model, row) in best]
        for row, theirs in present:
            point = best[(model, row)]
            seeds = ", ".join(f"{point.ppl_by_seed[s]:.2f}" for s in sorted(point.ppl_by_seed))
            paper = None if theirs is None else paper_ppl(model, theirs)
            lines.append(
                f"| {row_label(row)} | {'-' if theirs is None else row_label(theirs)} | "
                f"{fmt_ppl(point, latex=False)} | {seeds} | {fmt_point(point, row, view)} | "
                f"{'-' if paper is None else f'{paper:.2f}'} |"
            )
        missing = [row_label(row) for row, _ in view.rows if (model, row) not in best]
        if missing:  # a study in progress: the view's comparisons and tau leave these out
            lines += ["", f"Not in this view yet (no final run it allows): {'; '.join(missing)}."]
        lines += ["", *paired_lines(best, model, [r for r, _ in present]), ""]
        lines += [tau_line(best, model, present), ""]
    return "\n".join(lines)


def comparison_pairs(rows: list[str]) -> list[tuple[str, str]]:
    """The (row, row) pairs a view or question compares: FOAM-2 against every other row, then
    the tier comparisons whose rows are both present."""
    against = [(REFERENCE, r) for r in rows if r != REFERENCE] if REFERENCE in rows else []
    return against + [(a, b) for a, b in TIER_COMPARISONS if a in rows and b in rows]


def paired_lines(
    best: dict[tuple[str, str], Point],
    model: str,
    rows: list[str],
    qualify: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """The comparisons' table; ``qualify``: a comparison's reading in place of the rule's (v4's,
    where the rule's order rests on re-used runs)."""
    pairs = comparison_pairs(rows)
    diffs = [paired(best[(model, a)], best[(model, b)]) for a, b in pairs]
    lines = [
        "| Comparison | difference (paired) | 95% interval | p (Holm, this view) | read |",
        "|---|---:|---:|---:|---|",
    ]
    for (a, b), diff, p in zip(pairs, diffs, holm_family(diffs), strict=True):
        lines.append(
            f"| {row_label(a)} − {row_label(b)} | {comparison_cells(diff, p)} | "
            f"{(qualify or {}).get((a, b)) or order_read(row_label(a), row_label(b), diff, p)} |"
        )
    return lines


def tau_line(
    best: dict[tuple[str, str], Point], model: str, present: list[tuple[str, str | None]]
) -> str:
    shared = [
        (best[(model, row)], paper_ppl(model, theirs))
        for row, theirs in present
        if theirs is not None and paper_ppl(model, theirs) is not None
    ]
    shared = [(p, theirs) for p, theirs in shared if math.isfinite(p.mean_ppl)]
    if len(shared) < 3:
        return "Kendall's tau: fewer than 3 rows shared with the paper."
    ours = [p.mean_ppl for p, _ in shared]
    theirs = [t for _, t in shared]
    tau = float(kendall_tau(np.asarray(ours), np.asarray(theirs)))
    flipped, pairs = reversed_pairs(ours, theirs)
    short = sum(p.n < ORDER_SEEDS for p, _ in shared)
    if short:  # a resampled single seed never moves: the interval would look surer than it is
        interval = (
            f"no bootstrap interval while {short} of them have fewer than {ORDER_SEEDS} seeds"
        )
    else:
        low, high = bootstrap_tau([list(p.ppl_by_seed.values()) for p, _ in shared], theirs)
        interval = (
            f"95% bootstrap over seeds [{low:.2f}, {high:.2f}], {BOOTSTRAP_RESAMPLES} resamples"
        )
    seeds = statistics.median(p.n for p, _ in shared)
    return (
        f"Kendall's tau with the paper's order over the {len(shared)} rows it shares: "
        f"**{tau:.2f}** ({interval}; {flipped} of {pairs} pairs the other way; median "
        f"{seeds:g} seeds a row)."
    )


def views_table(points: list[Point]) -> str:
    """``views.md``: both views, each with its rows, paired comparisons and tau."""
    head = (
        "# Table 2 in two views (PROTOCOL.md, v3; decided before the views' finals)\n\n"
        "Rows: each at the point with the most seeds, then the lowest mean, among the final "
        "runs the view allows. Read: a row better than the other where the paired t-test's p, "
        "Holm-adjusted over the view's comparisons, is below 0.05; 'per comparison only' where "
        "the 95% interval excludes 0 but Holm does not resolve it. Tau: Kendall's tau-b between "
        "the rows' means and the paper's 60M means, the interval a percentile bootstrap that "
        "resamples each row's seeds with replacement. In the paper's view, '(the grid's edge)' "
        "marks a tuned alpha at an end of the paper's grid: the best that tuning allows, not an "
        "optimum bracketed in alpha.\n"
    )
    final = [p for p in points if p.key.stage == "final"]
    if not final:
        return head
    sections = [view_section(final, view) for view in VIEWS]
    return head + "\n" + "\n".join(sections)
