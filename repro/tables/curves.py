"""Validation curves (the paper's Figure 1): each best point's mean perplexity against tokens."""

from __future__ import annotations

import statistics
from pathlib import Path

from repro.points import CONTROL, Point, ordered, row_label
from repro.tables.figures import save_figure


def plot_curves(
    best: dict[tuple[str, str], Point], out: Path, stem: str = "curves", what: str = ""
) -> list[Path]:
    """Validation perplexity against tokens, one figure per model (the paper's Figure 1), in
    ``out/STEM_MODEL.png``, titled with the model and ``what`` the runs are.

    Each curve is the mean over the point's seeds at each evaluation.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    keys = ordered(best)  # every row the tables read, the module-wise ones beside the control
    for model in dict.fromkeys(m for m, _ in keys):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for row in [r for m, r in keys if m == model]:
            point = best[(model, row)]
            ax.plot(
                *mean_curve(point),
                label=f"{row_label(row)} (n={point.n})",
                linestyle="--" if row == CONTROL else "-",
            )
        ax.set(title=f"{model}{what}")
        perplexity_axes(ax)
        written.append(save_figure(fig, out / f"{stem}_{model}.png", ax))
    return written


def mean_curve(point: Point) -> tuple[list[float], list[float]]:
    """Training tokens (M) and validation perplexity, each the mean over the point's seeds at
    the evaluations every seed logged."""
    records = point.evaluations().values()
    return (
        [statistics.fmean(e["tokens"] for e in at) / 1e6 for at in records],
        [statistics.fmean(e["val_ppl"] for e in at) for at in records],
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
