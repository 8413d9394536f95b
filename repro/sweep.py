"""Sweep lr (and alpha) over methods: one torchrun per grid point, locally or on SLURM.

The default grids are the paper's (Appendix, Hyperparameters): AdamW, Muon and Adam-mini over
lr only; the low-rank methods and FOAM over lr x alpha. Each point gets its own run directory
``ROOT/MODEL/OPTIM/lr{lr}_alpha{alpha}_seed{seed}``; a point whose ``summary.json`` (or
``diverged.json``) exists is finished and skipped, and an interrupted one resumes from its last
checkpoint (``trainer.resume=auto``). Hydra's ``-m`` is never used inside torchrun: the sweep lives out here.

Results must be traceable to code: the sweep refuses to start from a tree with uncommitted
changes to tracked files unless ``--allow-dirty`` (each summary's ``git_sha`` then ends in
``-dirty``). ``--jobs N`` runs N points at a time locally (e.g. two single-thread CPU runs with
``OMP_NUM_THREADS=1``).

On SLURM each point is a job that asks for SIGUSR2 ``--slurm-signal-seconds`` before its time
limit; on it the trainer checkpoints and stops (``train/preemption.py``) and the job requeues
itself (``SlurmPoint``), so the requeued job resumes from the checkpoint. A preemption's SIGTERM
also checkpoints; SLURM requeues a preempted job itself (the jobs are submitted with
``--requeue``), while one cancelled with ``scancel`` stays cancelled. Any point left unfinished
resumes from its checkpoint when the sweep is run again.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import models
from repro.experiments import GPUS, MFU, Run, experiment_runs, listing, plan
from repro.finetune_grid import FINETUNE_EXPERIMENTS, finetune_plan, finetune_todo
from repro.methods import PAPER_SWEEP, sweeps_alpha
from repro.runs import REPO, Point, collect, train_command
from train.cli_errors import check_choices
from train.config import options
from train.preemption import install_stop_signals, received_signal
from train.schema import PROTOCOL_SEED
from train.summary import DIVERGED_FILE, uncommitted_changes

# The early warnings a SLURM job asks for with --signal; a job stopped by one requeues itself.
# SIGTERM is not among them: it is scancel's (stay stopped) or a preemption's, which SLURM
# requeues by itself under --requeue.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)

LR_ONLY = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)
LR_WITH_ALPHA = (1e-3, 2.5e-3, 5e-3, 1e-2)
ALPHAS = (0.25, 0.5, 1.0)

# What a results directory keeps of a run besides its summary: the resolved config, and the
# metrics, which the update-cosine table reads (repro/tables/experiments.py).
COLLECTED = ("config.yaml", "metrics.jsonl")


def grid(
    model: str,
    methods: list[str],
    lrs: list[float] | None,
    alphas: list[float] | None,  # None: the paper's alphas; []: each config's own alpha
    seeds: list[int],
    name: str | None = None,
) -> list[Point]:
    """The points to run: per method its lr grid, times alphas where the method sweeps alpha."""
    points = []
    for optim in methods:
        with_alpha = sweeps_alpha(optim)
        method_lrs = lrs or (LR_WITH_ALPHA if with_alpha else LR_ONLY)
        method_alphas = (alphas or ALPHAS) if with_alpha and alphas != [] else [None]
        for lr, alpha, seed in itertools.product(method_lrs, method_alphas, seeds):
            points.append(Point(model, optim, lr, alpha, seed, name or optim))
    return points


def run_local(commands: list[list[str]], jobs: int) -> int:
    """Run the points, ``jobs`` at a time; a failed point is reported and the others go on."""

    def run(indexed: tuple[int, list[str]]) -> bool:
        index, cmd = indexed
        print(f"[{index}/{len(commands)}] {shlex.join(cmd)}", flush=True)
        ok = subprocess.run(cmd, cwd=REPO).returncode == 0
        if not ok:
            print(f"point failed (continuing): {shlex.join(cmd)}", file=sys.stderr, flush=True)
        return ok

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(run, enumerate(commands, 1)))
    return 0 if all(results) else 1


class SlurmPoint:
    """One grid point as a SLURM job that requeues itself when the time limit draws near.

    SLURM sends SIGUSR2 to every process of the job ahead of the time limit (the ``--signal`` that
    ``submit_slurm`` asks for), and torchrun forwards it to the trainer, which finishes its step,
    checkpoints and exits. This process only records the signal, replacing submitit's own handler,
    which would requeue and exit at once and so kill torchrun in the middle of the save. Once
    torchrun is gone the job is requeued (``scontrol requeue $SLURM_JOB_ID``) unless the run
    finished; the requeued job calls this object again and ``trainer.resume=auto`` continues from
    the checkpoint. A run that fails without such a signal fails the job.
    """

    def __init__(self, command: list[str], run_dir: Path, grace_s: int) -> None:
        self.command = command
        self.run_dir = run_dir
        self.grace_s = grace_s  # how long torchrun lets the workers save before it SIGKILLs them

    def __call__(self) -> None:
        install_stop_signals(REQUEUE_SIGNALS)
        env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(self.grace_s)}
        returncode = subprocess.run(self.command, cwd=REPO, env=env).returncode
        stopped_by = received_signal()
        if (self.run_dir / "summary.json").exists():
            return
        if stopped_by is None:
            raise subprocess.CalledProcessError(returncode, self.command)
        job_id = os.environ["SLURM_JOB_ID"]
        print(f"{stopped_by.name}: requeueing job {job_id} to resume {self.run_dir}", flush=True)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)


def submit_slurm(points: list[tuple[list[str], Path]], args: argparse.Namespace) -> None:
    """One SLURM job per point through submitit, the library behind Hydra's submitit launcher."""
    try:
        import submitit
    except ImportError as error:
        raise SystemExit("--launcher slurm needs submitit: pip install submitit") from error
    executor = submitit.AutoExecutor(folder=str(args.root / "slurm"), cluster="slurm")
    executor.update_parameters(
        slurm_partition=args.slurm_partition,
        gpus_per_node=args.nproc,
        tasks_per_node=1,
        cpus_per_task=8 * args.nproc,
        timeout_min=args.slurm_minutes,
        slurm_signal_delay_s=args.slurm_signal_seconds,  # sbatch --signal=USR2@seconds
        slurm_additional_parameters={"requeue": True},
    )
    for cmd, run_dir in points:
        job = executor.submit(SlurmPoint(cmd, run_dir, grace_s=args.slurm_signal_seconds))
        print(f"submitted {job.job_id}: {shlex.join(cmd)}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: what to plan (a grid or an experiment), how to launch it, and modes
    that launch nothing (``--list``, ``--collect``, ``--dry-run``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="with --experiment: instead of its sizes")
    parser.add_argument(
        "--experiment",
        default=None,
        help="one of the paper's experiments as its runs (repro/experiments.py; --list)",
    )
    parser.add_argument("--list", action="store_true", help="list the experiments and stop")
    parser.add_argument(
        "--mfu", type=float, default=None, help="--experiment --dry-run: the MFU of its estimates"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="default: the paper's; with --experiment: a subset",
    )
    parser.add_argument("--lrs", nargs="+", type=float, default=None, help="default: paper grid")
    parser.add_argument("--alphas", nargs="+", type=float, default=None)
    parser.add_argument(
        "--config-alpha",
        action="store_true",
        help="keep each optim config's alpha (the paper's per-method value) instead of sweeping it",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, help=f"default: {PROTOCOL_SEED}"
    )
    parser.add_argument(
        "--name", default=None, help="method directory for a variant of one method (ablations)"
    )
    parser.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per point")
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "sweep")
    parser.add_argument("--launcher", choices=["local", "slurm"], default="local")
    parser.add_argument("--slurm-partition", default=None)
    parser.add_argument("--slurm-minutes", type=int, default=24 * 60)
    parser.add_argument(
        "--slurm-signal-seconds",
        type=int,
        default=180,
        help="SIGUSR2 this long before the time limit: time to finish a step, save and requeue",
    )
    parser.add_argument("--jobs", type=int, default=1, help="local points run at a time")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run from a tree with uncommitted changes (summaries record a -dirty sha)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--collect",
        type=Path,
        default=None,
        help="copy the finished runs under --root here (summary, config, metrics), run nothing",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every point (after --)")
    return parser


Planned = list[tuple[Point, Sequence[str]]]
"""Each point with the overrides its run adds to the command line's."""
Todo = list[tuple[list[str], Path]]
"""Each point still to run: its torchrun command and run directory."""


def plan_points(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[Run] | None, Planned]:
    """The points of ``--experiment`` (with its runs, for the dry-run's plan) or of the lr x
    alpha grid of ``--model``; neither given is a usage error."""
    check_choices(parser, "model", [args.model] if args.model else [], models.available_models())
    if args.experiment:
        runs = experiment_runs(parser, args)
        return runs, [(run.point, run.overrides) for run in runs]
    if not args.model:
        parser.error("give --model (the lr x alpha grid) or --experiment NAME (--list names them)")
    alphas = [] if args.config_alpha else args.alphas
    methods = args.methods or list(PAPER_SWEEP)
    check_choices(parser, "optim", methods, options("optim"))
    seeds = args.seeds or [PROTOCOL_SEED]
    points = grid(args.model, methods, args.lrs, alphas, seeds, args.name)
    return None, [(point, ()) for point in points]


def pending(planned: Planned, args: argparse.Namespace) -> Todo:
    """The planned points not finished (no ``summary.json``) and not diverged, as commands; each
    skipped point is printed."""
    todo = []
    for point, extra in planned:
        run_dir = point.run_dir(args.root)
        if (run_dir / "summary.json").exists():
            print(f"done, skipped: {run_dir}")
            continue
        if (run_dir / DIVERGED_FILE).exists():
            print(f"diverged, skipped: {run_dir}")
            continue
        todo.append((train_command(point, run_dir, args.nproc, [*extra, *args.overrides]), run_dir))
    return todo


def dry_run(runs: list[Run] | None, planned: Planned, todo: Todo, args: argparse.Namespace) -> str:
    """``--dry-run``'s report: an experiment's plan (tokens, GPU-hours), else one command a line."""
    if runs is not None:
        return plan(runs, {run_dir: cmd for cmd, run_dir in todo}, args)
    lines = [
        f"# {args.model}: {len(todo)} of {len(planned)} points to run "
        f"({len(planned) - len(todo)} done or diverged), one command per line"
    ]
    return "\n".join([*lines, *(shlex.join(cmd) for cmd, _ in todo)])


def launch(parser: argparse.ArgumentParser, args: argparse.Namespace, todo: Todo) -> int:
    """Run the points locally or submit them to SLURM, from a committed tree only (unless
    ``--allow-dirty``), so that every summary's ``git_sha`` names the code that ran."""
    dirty = uncommitted_changes()
    if dirty and todo and not args.allow_dirty:
        parser.error(
            "the tree has uncommitted changes, so the runs could not be traced to a commit; "
            f"commit them or pass --allow-dirty:\n{dirty}"
        )
    if args.launcher == "slurm":
        submit_slurm(todo, args)
        return 0
    return run_local([cmd for cmd, _ in todo], args.jobs)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.collect:
        copied = collect(args.root, args.collect, files=COLLECTED)
        print(f"copied {copied} finished runs to {args.collect}")
        return 0
    if args.name and len(args.methods or ()) != 1:
        parser.error("--name names a variant of exactly one method")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if (
        args.experiment in FINETUNE_EXPERIMENTS
    ):  # scripts/finetune.py runs; --model: a hub name or DIR
        runs, finetunes = finetune_todo(parser, args)
        if args.dry_run:
            print(finetune_plan(runs, finetunes, args, args.mfu or MFU, GPUS))
            return 0
        return run_local(list(finetunes.values()), args.jobs)
    runs, planned = plan_points(parser, args)
    todo = pending(planned, args)
    if args.dry_run:
        print(dry_run(runs, planned, todo, args))
        return 0
    return launch(parser, args, todo)
