"""Paired differences over seeds and how they are read: Student's t intervals, paired t-test p
values and Holm's family-wise adjustment (``results/repro/PROTOCOL.md``, "Finals, seeds,
statistics")."""

from __future__ import annotations

import math
import statistics

from repro.points import Point

REFERENCE = "foam2"  # the method the paired and ablation tables compare against
# Paired comparisons besides FOAM-2 against each row: Table 2's Mini tier, whose memory FOAM-Mini
# matches APOLLO-Mini's.
TIER_COMPARISONS = (("foam_mini", "apollo_mini"),)
ORDER_SEEDS = 3  # paired seeds an order is read over (PROTOCOL.md, "Finals, seeds, statistics")
FAMILY_WISE = 0.05  # an order is read where the Holm-adjusted p is below this (PROTOCOL.md, v3)
Diff = tuple[float, float | None, int]
"""Mean, sample std (None for one seed) and n of a paired difference."""


def paired(a: Point, b: Point) -> Diff | None:
    """Mean, sample std and n of ppl(a) - ppl(b) over the seeds both ran (None: none shared)."""
    seeds = sorted(set(a.ppl_by_seed) & set(b.ppl_by_seed))
    return spread([a.ppl_by_seed[s] - b.ppl_by_seed[s] for s in seeds])


def spread(values: list[float]) -> Diff | None:
    """Mean, sample std and n of per-seed values (None: none, or one not finite)."""
    if not values or not all(math.isfinite(v) for v in values):
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return statistics.fmean(values), std, len(values)


def fmt_diff(diff: Diff | None, digits: int = 2) -> str:
    if diff is None:
        return "-"
    mean, std, n = diff
    return f"{mean:+.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}") + f" (n={n})"


def confidence_interval(diff: Diff | None) -> tuple[float, float] | None:
    """The 95% interval of a paired mean difference (Student's t over its n seeds; None below 2)."""
    if diff is None or diff[1] is None or diff[2] < 2:
        return None
    from scipy.stats import t

    mean, std, n = diff
    half = float(t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return mean - half, mean + half


def fmt_interval(interval: tuple[float, float] | None, digits: int = 2) -> str:
    if interval is None:
        return "-"
    return f"[{interval[0]:+.{digits}f}, {interval[1]:+.{digits}f}]"


def fmt_p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


def comparison_cells(diff: Diff | None, p: float | None) -> str:
    """The cells every paired table gives a comparison: the difference (mean ± std, n), its 95%
    interval and its Holm-adjusted p."""
    return f"{fmt_diff(diff)} | {fmt_interval(confidence_interval(diff))} | {fmt_p(p)}"


def holm_family(diffs: list[Diff | None]) -> list[float | None]:
    """Holm-adjusted paired p of each difference, over those with the seeds an order needs."""
    return holm([paired_p(d) if d is not None and d[2] >= ORDER_SEEDS else None for d in diffs])


def paired_p(diff: Diff | None) -> float | None:
    """The two-sided p of a paired t-test on a difference's seeds (None below 2 seeds)."""
    if diff is None or diff[1] is None or diff[2] < 2:
        return None
    mean, std, n = diff
    if std == 0:
        return 1.0 if mean == 0 else 0.0
    from scipy.stats import t

    return float(2 * t.sf(abs(mean) / (std / math.sqrt(n)), n - 1))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p values that are not None, over those only: the
    family-wise check on one table's comparisons for a model (scipy has no Holm)."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def order_read(a: str, b: str, diff: Diff | None, p: float | None) -> str:
    """How a paired difference ``a - b`` (``a`` and ``b`` labels) is read, by the v3 rule: an
    order where Holm resolves it; one resolved per comparison only is said to be so."""
    interval = confidence_interval(diff)
    if diff is None or interval is None or p is None:
        return f"not read (n < {ORDER_SEEDS})"
    better = f"{a} better" if diff[0] < 0 else f"{b} better"
    if p < FAMILY_WISE:
        return better
    if not interval[0] <= 0 <= interval[1]:
        return f"{better} per comparison only (not family-wise)"
    return "unresolved"
