"""Tables 2-3, the ablations and validation curves from the ``summary.json`` files of finished runs.

The paper's tables (``repro.make_tables``) with the CPU study's beside them: its two views of
Table 2 (``views.md``) and every lr run at full length at the best points' alpha and gap
(``carry_over.md``). With ``--v4 V3_RUNS``, the v4 study's readings on the test split instead
(``v4.md``, ``repro/cpu_study/tables/v4.py``), where each of its walks stands (``walks.md``,
``repro/cpu_study/tables/walks.py``) and its ``provenance.md`` (with each run's machine and
threads, from its summary and the study's ``machines.json`` beside the runs).
"""

from __future__ import annotations

from pathlib import Path

from repro import make_tables
from repro.cpu_study.tables.carry_over import carry_over_table
from repro.cpu_study.tables.machines import machines
from repro.cpu_study.tables.v4 import question_best, v4_table
from repro.cpu_study.tables.views import views_table
from repro.cpu_study.tables.walks import walks_table
from repro.cpu_study.v4 import Q3
from repro.points import Point, load_points
from repro.tables.curves import plot_curves
from repro.tables.provenance import provenance


def study_tables(best: dict[tuple[str, str], Point], points: list[Point]) -> dict[str, str]:
    """The study's tables of a root (``make_tables.TableWriter``)."""
    return {"views.md": views_table(points), "carry_over.md": carry_over_table(best, points)}


def write_v4(root: Path, v3_root: Path, out: Path | None, curves: bool) -> int:
    """v4's tables; with ``curves``, Q3's validation curves (the mean of each row's 3 seeds at
    each evaluation, every 500 steps), once a row has its seeds."""
    points = load_points(root, metric="final_test_ppl")
    outputs = {
        "v4.md": v4_table(points, load_points(v3_root)),
        "walks.md": walks_table(root, v3_root),
        "provenance.md": provenance(points) + "\n" + machines(root),
    }
    if out is None:
        print(outputs["v4.md"])
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        (out / name).write_text(text)
    if curves and (q3 := question_best(points, Q3)):
        plot_curves(q3, out, stem="curves_q3", what=", 10,000 steps on the long corpus (v4 Q3)")
    print(f"wrote {', '.join(sorted(outputs))} to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = make_tables.parser()
    parser.add_argument(
        "--v4",
        type=Path,
        metavar="V3_RUNS",
        help="read ROOT as the v4 study's runs (on the test split) and write v4.md, walks.md "
        "and provenance.md; V3_RUNS are v3's (walk data, and the check that v4 repeats them)",
    )
    args = parser.parse_args(argv)
    if args.v4:
        return write_v4(args.root, args.v4, args.out, args.curves)
    return make_tables.write_tables(args, writers=(study_tables,))
