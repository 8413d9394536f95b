"""``v4.md``: the CPU study's v4 readings (``results/repro/PROTOCOL.md``, amendment "v4"), every
number on the test split that no choice was made on, the validation number beside it.

* Q1: FOAM-2 against Muon (module-wise), APOLLO-1/4 and the control at n = 8, Holm over the 3.
* Q2: every row with the shared non-matrix lr, seeds 0-2, FOAM-2 against each row and FOAM-Mini
  against APOLLO-Mini, Holm over the family; Kendall's tau with the paper's 60M order.
* Q3: the 10,000-step rows with 3 seeds, FOAM-2 against each, Holm; tau between the Q1 order and
  the Q3 order, with its exact permutation p.

Added after the questions were read (PROTOCOL.md v4, "Correction note", 2026-12-06), each said to
be post hoc in the table: Q1's comparisons over the seeds at which no row repeats a v3 run beside
every seed (``new_seeds_lines``), Q1's rows whose walk moved read at their v3 point too
(``v3_point_lines``), and Q2's rows that re-score v3's runs (``rescored_lines``).

A row's point is the one its walk ended at: the most seeds, then the lowest **validation** mean
(never the test mean, which chose nothing); a row enters its question once that point has all
the question's seeds. Before the tables, the check the amendment rests on:
every v4 run that repeats a v3 run (same point and seed) with its validation perplexity.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from repro.cpu_study.study import Setting
from repro.cpu_study.tables.views import (
    comparison_pairs,
    kendall_tau,
    paired_lines,
    reversed_pairs,
    tau_line,
)
from repro.cpu_study.v4 import FULL, Q1, Q2, Q3, SEEDS, SHARED_LR, Question, Row
from repro.paired_stats import (
    FAMILY_WISE,
    ORDER_SEEDS,
    REFERENCE,
    Diff,
    comparison_cells,
    confidence_interval,
    fmt_diff,
    fmt_interval,
    holm_family,
    paired,
)
from repro.paper_perplexity import paper_ppl
from repro.points import CONTROL, Key, Point, fmt_ppl, row_label, row_of

MODEL = "llama_2m"
Best = dict[tuple[str, str], Point]
PAPER_ROW = {CONTROL: None, "muon_modulewise": "muon"}  # the paper's row a v4 row stands for
CUT = "cut when the study stopped"  # a row of a question stopped before it (``Question.cut``)


def paper_row(name: str) -> str | None:
    return PAPER_ROW.get(name, name)


def table_row(row: Row) -> str:
    """The row's name in the tables: the control is AdamW's directory below alpha 1."""
    if row.method.name == "adamw" and row.method.searches_alpha:
        return CONTROL
    return row.method.name


def validation(point: Point) -> float:
    return statistics.fmean(r.get("final_val_ppl") or math.inf for r in point.runs)


def walked(
    points: list[Point], stage: str, row: str, keep: Callable[[Point], bool]
) -> Point | None:
    """The row's point at ``stage``: the most seeds, then the lowest validation mean."""
    mine = [p for p in points if p.key.stage == stage and row_of(p) == row and keep(p)]
    return min(mine, key=lambda p: (-p.n, validation(p), p.key), default=None)


def restricted(point: Point, seeds: tuple[int, ...]) -> Point:
    """The point read over ``seeds`` only (Q2 reads 3 seeds where Q1 ran 8 at the same point)."""
    runs = [r for r in point.runs if r.get("seed") in seeds]
    return replace(
        point, ppl_by_seed={s: v for s, v in point.ppl_by_seed.items() if s in seeds}, runs=runs
    )


def setting(point: Point) -> Setting:
    k = point.key
    return Setting(k.lr, k.alpha_or_none, k.gap or None)


def question_best(points: list[Point], question: Question) -> Best:
    """Each row's walked point read over the question's seeds, once it has all of them: a row
    still walking (its seed-0 runs) or still running its seeds is not in the question yet."""
    best: Best = {}
    keep = lambda p: question.keep(setting(p))  # noqa: E731
    for row in question.rows:
        point = walked(points, question.stage, table_row(row), keep)
        if point is not None and set(question.seeds) <= set(point.ppl_by_seed):
            best[(MODEL, table_row(row))] = restricted(point, question.seeds)
    return best


def rows_table(best: Best, q: Question) -> list[str]:
    lines = [
        "| Row | point | test PPL | seeds (test) | validation PPL | paper, 60M |",
        "|---|---|---:|---|---:|---:|",
    ]
    for row in q.rows:
        name = table_row(row)
        point = best.get((MODEL, name))
        if point is None:
            state = CUT if q.cut(row) else "not complete yet"
            lines.append(f"| {row_label(name)} | {state} | - | - | - | - |")
            continue
        theirs = paper_row(name)
        k, paper = point.key, None if theirs is None else paper_ppl(MODEL, theirs)
        where = f"{k.lr:g}" + (f", alpha {k.alpha:g}" if k.alpha_or_none is not None else "")
        where += f", gap {k.gap}" if k.gap else ""
        seeds = ", ".join(f"{point.ppl_by_seed[s]:.2f}" for s in sorted(point.ppl_by_seed))
        lines.append(
            f"| {row_label(name)} | {where} | {fmt_ppl(point, latex=False)} | {seeds} | "
            f"{validation(point):.2f} | {'-' if paper is None else f'{paper:.2f}'} |"
        )
    return lines


def question(
    title: str, best: Best, q: Question, tau: bool, qualify: dict | None = None
) -> list[str]:
    names = [table_row(r) for r in q.rows if (MODEL, table_row(r)) in best]
    comparisons = paired_lines(best, MODEL, names, qualify or {})
    lines = [f"## {title}", "", *rows_table(best, q), "", *comparisons]
    if tau:
        present = [(n, paper_row(n)) for n in names]
        lines += ["", tau_line(best, MODEL, present)]
    return [*lines, ""]


def order_carries_over(q1: Best, q3: Best) -> str:
    """Kendall's tau between the Q1 order (1,000 steps) and the Q3 order (10,000 steps), with its
    exact permutation p: over a handful of rows tau takes few values (over 3: -1, -1/3, 1/3, 1),
    and a seed bootstrap of rows that do not overlap only repeats the point estimate."""
    from scipy.stats import kendalltau  # statistics only where a table needs them

    shared = [k for k in q3 if k in q1 and q3[k].n >= ORDER_SEEDS and math.isfinite(q3[k].mean_ppl)]
    if len(shared) < 3:
        return "Order at 1,000 against 10,000 steps: fewer than 3 rows with 3 seeds in both."
    short, long = [q1[k].mean_ppl for k in shared], [q3[k].mean_ppl for k in shared]
    tau = float(kendall_tau(np.asarray(long), np.asarray(short)))
    exact = float(kendalltau(long, short, method="exact").pvalue)
    flipped, pairs = reversed_pairs(long, short)
    smallest = 2 / math.factorial(len(shared))
    return (
        f"Order at 1,000 (Q1) against 10,000 steps (Q3), test split, {len(shared)} rows: Kendall's "
        f"tau **{tau:.2f}** ({flipped} of {pairs} pairs the other way; exact two-sided p "
        f"{exact:.3f} over the orders of the {len(shared)} rows, the smallest p {len(shared)} rows "
        f"allow being {smallest:.3f}; {'' if exact < FAMILY_WISE else 'not '}below "
        f"{FAMILY_WISE:g}). The two corpora differ."
    )


V3Runs = set[tuple[Key, int]]
"""(point, seed) of every v3 run: a v4 run at one of them repeats it."""


def v3_runs(v3: list[Point]) -> V3Runs:
    return {(p.key, r.get("seed")) for p in v3 for r in p.runs}


def repeated(point: Point, v3: V3Runs) -> list[int]:
    """The seeds of ``point`` whose run repeats a v3 run (the same point and seed)."""
    return sorted(s for s in point.ppl_by_seed if (point.key, s) in v3)


def seed_text(seeds: list[int] | tuple[int, ...]) -> str:
    ordered = sorted(seeds)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def strength(diff: Diff | None, p: float | None) -> str:
    """How far a paired difference resolves: family-wise, per comparison only, or not."""
    interval = confidence_interval(diff)
    if interval is None or p is None:
        return "not read"
    if p < FAMILY_WISE:
        return "family-wise"
    return "unresolved" if interval[0] <= 0 <= interval[1] else "per comparison only"


def on_new_seeds(every: Diff, every_p: float, new: Diff, new_p: float, old: str) -> str:
    """What the new seeds alone say of the reading over every seed."""
    was, now = strength(every, every_p), strength(new, new_p)
    if was == "unresolved":
        return f"unresolved over every seed; {now} on the new seeds"
    if now == "unresolved":
        return f"resolves only with the re-used seeds {old}"
    if (every[0] > 0) != (new[0] > 0):
        return "the other way on the new seeds"
    return f"{now} on the new seeds" + (" too" if now == was else f" ({was} over every seed)")


@dataclass(frozen=True)
class NewSeeds:
    """A question's comparisons over every seed and over the seeds at which no row repeats a v3
    run: the runs v3 made chose v4's points and suggested its questions, so they re-score old
    evidence on a new split; the other seeds are new evidence."""

    reused: dict[str, list[int]]  # row -> its seeds that repeat a v3 run
    old: list[int]
    new: tuple[int, ...]
    reads: dict[tuple[str, str], tuple[Diff | None, float | None, Diff | None, float | None]]
    """(a, b) -> difference and Holm p over every seed, then over the new seeds alone."""

    def says(self, pair: tuple[str, str]) -> str:
        return on_new_seeds(*self.reads[pair], seed_text(self.old))


def new_seeds(best: Best, q: Question, v3: V3Runs) -> NewSeeds | None:
    """None where no row repeats a v3 run, or too few seeds are new to read an order over."""
    names = [table_row(r) for r in q.rows if (MODEL, table_row(r)) in best]
    reused = {name: repeated(best[(MODEL, name)], v3) for name in names}
    old = sorted(set().union(*reused.values()))
    new = tuple(s for s in q.seeds if s not in old)
    if not old or len(new) < ORDER_SEEDS:
        return None
    pairs = comparison_pairs(names)
    fresh = {k: restricted(point, new) for k, point in best.items()}
    every = [paired(best[(MODEL, a)], best[(MODEL, b)]) for a, b in pairs]
    only_new = [paired(fresh[(MODEL, a)], fresh[(MODEL, b)]) for a, b in pairs]
    reads = dict(
        zip(
            pairs,
            zip(every, holm_family(every), only_new, holm_family(only_new), strict=True),
            strict=True,
        )
    )
    return NewSeeds(reused, old, new, reads)


def only_with_reused(seeds: NewSeeds | None) -> dict[tuple[str, str], str]:
    """The main table's reading of a comparison that resolves only with the seeds v3 ran, in
    place of the rule's: never read as one row beating the other."""
    if seeds is None:
        return {}
    return {
        pair: f"resolved only with the re-used seeds {seed_text(seeds.old)}; unresolved on seeds "
        f"{seed_text(seeds.new)} (below)"
        for pair in seeds.reads
        if seeds.says(pair).startswith("resolves only")
    }


def new_seeds_lines(seeds: NewSeeds | None, q: Question) -> list[str]:
    if seeds is None:
        return []
    new, rows = (
        seed_text(seeds.new),
        "; ".join(f"{row_label(n)} {seed_text(s)}" for n, s in seeds.reused.items() if s),
    )
    lines = [
        f"Seeds {new} alone beside seeds {seed_text(q.seeds)} (added on 2026-12-06, after the "
        'question was read: post hoc; PROTOCOL.md v4, "Correction note"). The seeds whose runs '
        f"repeat a v3 run at the same point and seed (the check above): {rows}. Those runs' "
        "validation numbers chose the rows' points and suggested the question, so only seeds "
        f"{new} are runs v3 never made. Holm over the question's {len(seeds.reads)} comparisons "
        "on those seeds.",
        "",
        f"| Comparison | seeds {seed_text(q.seeds)}: difference | 95% interval | p (Holm) | "
        f"seeds {new} alone | 95% interval | p (Holm) | what the new seeds say |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (a, b), (d, p, d_new, p_new) in seeds.reads.items():
        lines.append(
            f"| {row_label(a)} − {row_label(b)} | {comparison_cells(d, p)} | "
            f"{comparison_cells(d_new, p_new)} | {seeds.says((a, b))} |"
        )
    return lines


def rescored_lines(best: Best, q: Question, v3: V3Runs, q1: Best) -> list[str]:
    """Which of the question's rows re-score v3's runs (every seed repeats one), which share
    Q1's runs, and which comparisons set two re-scored rows against each other."""
    names = [table_row(r) for r in q.rows if (MODEL, table_row(r)) in best]
    reused = {name: repeated(best[(MODEL, name)], v3) for name in names}
    whole = [n for n in names if len(reused[n]) == len(q.seeds)]
    if not whole:
        return []
    parts = [
        f"Re-scored, not new: {len(whole)} of these {len(names)} rows repeat v3's runs at every "
        f"seed ({'; '.join(row_label(n) for n in whole)}: the same point and seed as a v3 run), "
        "so for them this question re-scores v3's runs on the test split."
    ]
    for name in (n for n in names if n not in whole):
        point, theirs = best[(MODEL, name)], q1.get((MODEL, name))
        if reused[name]:
            parts.append(
                f"{row_label(name)}: seed {seed_text(reused[name])} of {seed_text(q.seeds)} "
                "repeats a v3 run."
            )
        elif theirs is not None and theirs.key == point.key and q is not Q1:
            parts.append(
                f"{row_label(name)}: Q1's runs (its Q1 point is this one), none of them v3's."
            )
        else:
            parts.append(f"{row_label(name)}: new runs.")
    both = [(a, b) for a, b in comparison_pairs(names) if a in whole and b in whole]
    if both:
        listed = "; ".join(f"{row_label(a)} − {row_label(b)}" for a, b in both)
        parts.append(f"Comparisons between two re-scored rows: {listed}.")
    return [" ".join(parts)]


def start_point(points: list[Point], row: Row) -> Point | None:
    """The row's full-length point at its walk's start (its v3 point), if ``points`` have it."""
    name = table_row(row)
    return next(
        (
            p
            for p in points
            if p.key.stage == FULL and row_of(p) == name and setting(p) == row.start
        ),
        None,
    )


def val_point(point: Point) -> Point:
    """The point read on validation (``final_val_ppl``) instead of the test split."""
    by_seed = {r.get("seed"): r.get("final_val_ppl") or math.inf for r in point.runs}
    return replace(point, ppl_by_seed=by_seed)


def v3_point_lines(points: list[Point], v3: list[Point], q1: Best) -> list[str]:
    """Q1's rows whose walk left its start (the v3 point) read at both points over seeds 0-2,
    the seeds both have: a walk step smaller than the seeds' spread may have chosen on noise, so
    the comparisons with the row at its v3 point are its sensitivity."""
    foam2 = q1.get((MODEL, REFERENCE))
    lines: list[str] = []
    for row in Q1.rows:
        name = table_row(row)
        walked_point = q1.get((MODEL, name))
        if walked_point is None or foam2 is None or setting(walked_point) == row.start:
            continue
        ran_here, ran_in_v3 = start_point(points, row), start_point(v3, row)
        if ran_in_v3 is None:
            continue
        seeds = SEEDS
        sides = [("walked", restricted(walked_point, seeds), "")]
        if ran_here is not None and set(seeds) <= set(ran_here.ppl_by_seed):
            sides.append(("v3 point", restricted(ran_here, seeds), ""))
        else:
            sides.append(("v3 point", restricted(ran_in_v3, seeds), " (v3's runs)"))
        spread = statistics.stdev(val_point(walked_point).ppl_by_seed.values())
        for where, point, whose in sides:
            on_test = whose == ""
            val = val_point(point) if on_test else point
            diff = paired(restricted(foam2, seeds), point) if on_test else None
            seed0 = val.ppl_by_seed.get(0, math.inf)
            test = f"{point.mean_ppl:.2f}" if on_test else "not run in v4"
            sd = f"{spread:.2f}" if point.key == walked_point.key else "-"
            lines.append(
                f"| {row_label(name)} | {where}: {setting_text(point)} | {seed0:.2f}{whose} | "
                f"{val.mean_ppl:.2f}{whose} | {sd} | {test} | {fmt_diff(diff)} | "
                f"{fmt_interval(confidence_interval(diff))} |"
            )
    if not lines:
        return []
    return [
        f"The rows whose Q1 walk moved, at their walked point and at their v3 point (where the walk "
        f"started), seeds {seed_text(SEEDS)} (added on 2026-12-06, post hoc: a sensitivity, not a "
        "reading). A walk step is taken on seed 0's validation number alone; the validation SD "
        "over the walked point's seeds is beside it.",
        "",
        f"| Row | point | validation, seed 0 | validation, seeds {seed_text(SEEDS)} | validation "
        f"SD, seeds {seed_text(Q1.seeds)} (walked) | test, seeds {seed_text(SEEDS)} | "
        f"{row_label(REFERENCE)} − row, test (paired) | 95% interval |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *lines,
    ]


def setting_text(point: Point) -> str:
    k = point.key
    return f"{k.lr:g}" + (f", alpha {k.alpha:g}" if k.alpha_or_none is not None else "")


REPEAT_TOLERANCE = 1e-5  # relative: v4's trainer reproduced v3's losses to ~1e-6 (PROTOCOL.md, v4)


def reproduced(v4: list[Point], v3: list[Point]) -> str:
    """Every v4 run that repeats a v3 run, with both validation perplexities: the same within
    ``REPEAT_TOLERANCE`` or listed."""
    v3_val = {(p.key, r.get("seed")): r.get("final_val_ppl") for p in v3 for r in p.runs}
    pairs = [
        (p.key, r.get("seed"), v3_val[(p.key, r.get("seed"))], r.get("final_val_ppl"))
        for p in v4
        for r in p.runs
        if (p.key, r.get("seed")) in v3_val
    ]
    differ = [(k, seed, a, b) for k, seed, a, b in pairs if abs(b - a) > REPEAT_TOLERANCE * a]
    worst = max((abs(b - a) / a for *_, a, b in pairs), default=0.0)
    lines = [
        f"v4 runs that repeat a v3 run (same point and seed): {len(pairs)}; the same validation "
        f"perplexity within a relative {REPEAT_TOLERANCE:g}: {len(pairs) - len(differ)} (largest "
        f"relative difference {worst:.1e}).",
    ]
    lines += [
        f"* differs: {k.method} lr {k.lr:g} alpha {k.alpha:g} seed {seed}: v3 {a}, v4 {b}"
        for k, seed, a, b in differ
    ]
    return "\n".join(lines)


def v4_table(v4: list[Point], v3: list[Point]) -> str:
    """``v4.md``: ``v4`` read on the test split (``load_points(..., "final_test_ppl")``), ``v3``
    the v3 runs (validation) for the reproduction check."""
    q1, q2, q3 = (question_best(v4, q) for q in (Q1, Q2, Q3))
    head = [
        "# v4 (PROTOCOL.md, amendment of 2026-11-28): every number on the test split",
        "",
        "Rows at the point their walk ended (most seeds, then the lowest validation mean). "
        "Read: better where the paired t-test's p, Holm-adjusted over the question's "
        "comparisons, is below 0.05; 'per comparison only' where the 95% interval excludes 0 "
        "but Holm does not resolve it. Validation perplexities chose the points; the test "
        "split chose nothing.",
        "",
        reproduced(v4, v3),
        "",
    ]
    ran_in_v3 = v3_runs(v3)
    fresh = new_seeds(q1, Q1, ran_in_v3)
    body = question(
        "Q1: confirmation at n = 8 (1,000 steps)",
        q1,
        Q1,
        tau=False,
        qualify=only_with_reused(fresh),
    )
    body += [*new_seeds_lines(fresh, Q1), ""]
    body += [*v3_point_lines(v4, v3, q1), ""]
    body += question(
        f"Q2: one non-matrix lr ({SHARED_LR:g}) for every row, seeds 0-2", q2, Q2, tau=True
    )
    body += [*rescored_lines(q2, Q2, ran_in_v3, q1), ""]
    body += question("Q3: twenty tokens per parameter (10,000 steps)", q3, Q3, tau=False)
    body += [order_carries_over(q1, q3), ""]
    return "\n".join(head + body)
