"""The command line of the CPU study (results/repro/PROTOCOL.md): v3's driver
(``repro.cpu_study.study``) by default, v4's (``repro.cpu_study.v4``) with ``--v4``.

Every run starts only from a committed tree, in the study's exact packages, on the study's pinned
corpus (and, for v4, its pinned test split and Q3 corpus); ``--plan`` lists what can start now,
``--collect`` copies finished summaries into the results directory.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from repro.cpu_study.environment import data_mismatch, environment_mismatch
from repro.cpu_study.study import Study
from repro.cpu_study.v4 import V4_RUNS, StudyV4, long_corpus_mismatch, test_split_mismatch
from repro.runs import REPO, collect
from train.summary import uncommitted_changes

V3_ROOT, V4_ROOT = REPO / "runs" / "repro", REPO / "runs" / "repro-v4"
V3_RUNS = REPO / "results" / "repro" / "runs"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="the scripts/make_corpus.py mirror")
    p.add_argument("--v4", action="store_true", help="v4's questions (PROTOCOL.md, v4)")
    p.add_argument("--long-data", type=Path, help="v4's Q3 corpus (runs Q3 too, once pinned)")
    p.add_argument("--root", type=Path, help=f"run directories (default {V3_ROOT}, v4 {V4_ROOT})")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--plan", action="store_true", help="list the runs that can start now")
    p.add_argument(
        "--commands",
        action="store_true",
        help="with --plan: each run's command instead of its directory (what "
        "scripts/thread_check.py --command repeats)",
    )
    p.add_argument("--collect", type=Path, help="copy finished summaries here, run nothing")
    p.add_argument(
        "--finished",
        type=Path,
        help="finished runs committed by earlier sessions (skipped); default: the committed "
        f"ones ({V3_RUNS}, v4 {V4_RUNS})",
    )
    p.add_argument("--allow-dirty", action="store_true")
    return p


def refusal(args: argparse.Namespace) -> str | None:
    """Why the study cannot run as asked (one line), or None."""
    if args.commands and not args.plan:
        return "--commands lists the plan's commands: it needs --plan"
    if not (args.data / "en").is_dir():
        return f"--data {args.data}: no en/ directory; build it with scripts/make_corpus.py"
    mismatch = environment_mismatch() or data_mismatch(args.data)
    if not mismatch and args.v4:
        mismatch = test_split_mismatch(args.data)
    if not mismatch and args.long_data is not None:
        mismatch = long_corpus_mismatch(args.long_data) if args.v4 else "--long-data needs --v4"
    if mismatch:
        return mismatch
    dirty = uncommitted_changes()
    if dirty and not (args.plan or args.allow_dirty):
        return f"uncommitted changes; commit them or pass --allow-dirty:\n{dirty}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    root = (args.root or (V4_ROOT if args.v4 else V3_ROOT)).resolve()
    finished = (args.finished or (V4_RUNS if args.v4 else V3_RUNS)).resolve()
    if args.collect:
        print(f"copied {collect(root, args.collect)} finished runs to {args.collect}")
        return 0
    why = refusal(args)
    if why:
        p.error(why)
    common = {"dry_run": args.plan, "finished": finished}
    if args.v4:
        long_data = args.long_data.resolve() if args.long_data else None
        study = StudyV4(args.data.resolve(), root, args.jobs, long_data=long_data, **common)
    else:
        study = Study(args.data.resolve(), root, args.jobs, **common)
    study.all()
    if args.plan:
        for run_dir, cmd in study.planned.items():
            print(shlex.join(cmd) if args.commands else run_dir)
        print(f"{len(study.planned)} runs can start now")
    return 0
