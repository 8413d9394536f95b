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
(``ablations.md``, FOAM-2's variants in ``ablation_*`` directories), each method's perplexity
against alpha at its best lr of each stage, and FOAM-2's alpha at the paper's lr paired over seeds
(``alpha.md``; with ``--curves`` also ``alpha_MODEL.png``, and the ablation figures
``ablations_MODEL.png``) and the commits the runs came from (``provenance.md``). A study adds
tables of its own through ``writers`` (``repro/cpu_study/make_tables.py``: the CPU study's).
Output is deterministic, so committed tables regenerate byte for byte.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from repro.methods import TABLE2
from repro.points import CONTROL, Point, best_points, load_points
from repro.tables.ablations import ablation_table, plot_ablations
from repro.tables.alpha import alpha_table, plot_alpha
from repro.tables.curves import plot_curves
from repro.tables.experiments import experiment_outputs
from repro.tables.paired import paired_table
from repro.tables.provenance import provenance
from repro.tables.sweep_points import sweep_table
from repro.tables.table2 import table2
from repro.tables.table3 import table3

TableWriter = Callable[[dict[tuple[str, str], Point], list[Point]], dict[str, str]]
"""More tables from a root's best points (Table 2's) and all its points: file name -> text."""


def parser() -> argparse.ArgumentParser:
    """The command line, which a study's entry point extends with its own options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory searched for summary.json files")
    parser.add_argument("--out", type=Path, default=None, help="write tables (and curves) here")
    parser.add_argument("--table3-steps", nargs="+", type=int, default=None)
    parser.add_argument("--curves", action="store_true", help="also plot validation curves (PNG)")
    return parser


def write_tables(args: argparse.Namespace, writers: Sequence[TableWriter] = ()) -> int:
    """The tables of ``args.root``, the paper's and each of ``writers``', written under ``--out``
    (without it, four of the paper's are printed)."""
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
        "ablations.md": ablation_table(best, points),
        "alpha.md": alpha_table(points),
        "sweep.md": sweep_table(points),
        "provenance.md": provenance(points),
    }

    for writer in writers:
        outputs.update(writer(best, points))
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


def main(argv: list[str] | None = None) -> int:
    return write_tables(parser().parse_args(argv))
