"""``walks.md``: where each v4 walk stands (``results/repro/PROTOCOL.md``, amendment "v4").

The amendment asks every row to be bracketed at full length before its seeds count; this table is
the evidence, row by row: the best seed-0 point so far (validation, the split that chooses), each
of its neighbours with its validation perplexity or "to run", and how many of the question's
seeds have run there. It reads the committed runs exactly as the driver does
(``StudyV4.walk_data``, ``walk_front``), v3's full-length seed-0 runs included for Q1 and Q2, so
a walk the table calls bracketed is one the driver will not extend.
"""

from __future__ import annotations

import math
from pathlib import Path

from repro.cpu_study.study import Setting, walk_front
from repro.cpu_study.tables.v4 import CUT, table_row
from repro.cpu_study.v4 import Q1, Q2, Q3, Question, Row, StudyV4
from repro.points import row_label


def where(s: Setting) -> str:
    return f"{s.lr:g}" + ("" if s.alpha is None else f", {s.alpha:g}")


def ppl(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "diverged"


def row_line(study: StudyV4, question: Question, row: Row) -> str:
    seen = study.walk_data(question.stage, row, question.keep)
    v4 = study.seed0_runs(question.stage, row.method)
    best, todo = walk_front(seen, row.start, question.neighbours, row.method)
    label = row_label(table_row(row))
    cut = CUT if question.cut(row) else ""
    if not seen:
        return f"| {label} | {where(row.start)} (start) | - | {cut or 'not started'} | - |"

    def point(s: Setting) -> str:
        if s not in seen:
            return f"{where(s)}: to run"
        return f"{where(s)}: {ppl(seen[s])}" + ("" if s in v4 else " (v3)")

    around = "; ".join(point(s) for s in question.neighbours(best, row.method))
    state = cut or ("bracketed" if not todo else f"waits on {len(todo)} run{'s' * (len(todo) > 1)}")
    run_dirs = [study.run_dir(question.stage, row.method.name, best, s) for s in question.seeds]
    seeds = sum(study.result(d) is not None for d in run_dirs)
    gap = "" if best.gap is None else f", gap {best.gap}"
    return f"| {label} | {point(best)}{gap} | {around} | {state} | {seeds} of {len(run_dirs)} |"


TITLES = {
    Q1.name: "Q1: every factor-2 direction of (lr, alpha), 1,000 steps",
    Q2.name: "Q2: the matrices' lr (alpha) at the shared non-matrix lr, 1,000 steps",
    Q3.name: "Q3: each lr one at a time, 10,000 steps",
}


def walks_table(v4_root: Path, v3_root: Path) -> str:
    """``walks.md`` from the v4 runs under ``v4_root`` and v3's under ``v3_root``."""
    study = StudyV4(v4_root, v4_root, 1, dry_run=True, v3_runs=v3_root)
    lines = [
        "# v4's walks: where each row's seed-0 walk stands (validation perplexity)",
        "",
        "A row's point is its best seed-0 run so far; it is bracketed when every neighbour has "
        "run and none is better, and only then are its seeds run. (v3): a v3 full-length run, "
        "which counts as walk data (PROTOCOL.md, v4). Seeds: the question's seeds run at the "
        "point in v4 (with their test numbers).",
        "",
    ]
    for question in (Q1, Q2, Q3):
        lines += [
            f"## {TITLES[question.name]}",
            "",
            "| Row | point (seed 0) | its neighbours | walk | seeds at the point |",
            "|---|---|---|---|---:|",
            *(row_line(study, question, row) for row in question.rows),
            "",
        ]
    return "\n".join(lines)
