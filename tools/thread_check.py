"""Repeat a run's command at several intra-op thread counts and compare its numbers bit for bit.

A CPU run at two threads steps about 1.7 times faster than at one, but a parallel reduction may
add in another order and round differently, so a study that fixed single-thread runs may use two
only where that is shown to move nothing. This repeats the command (its Hydra overrides, as a
run's ``.hydra/overrides.yaml`` records them, or as a command line gives them: a run not started
yet) for a few steps at each thread count, in a scratch directory, and compares every logged
training loss and the final validation loss bit for bit.

    python scripts/thread_check.py --like runs/foo --steps 120                 # 1 vs 2 threads
    ../study/.venv/bin/python -m tools.thread_check --trainer ../study/train/pretrain.py \\
        --command "$(python scripts/reproduce_cpu.py --v4 ... --plan --commands | grep muon | head -1)"

Exit status 0 when the numbers agree, 1 when they do not (the first difference is printed, and
how far apart the repeats end up, for the study to weigh), 2 for a command line it cannot use.
It runs ``--trainer`` with this Python, so run it with the environment the checked runs use.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = Path(".hydra") / "overrides.yaml"
TRAINER = "pretrain.py"
DIFFERENT_STEPS = "they logged different steps"


@dataclass(frozen=True)
class Numbers:
    """What one repeat computed, and how fast."""

    losses: list[tuple[int, float]]
    val_loss: float | None
    median_step_s: float


def check_overrides(recorded: list[str], steps: int, run_dir: Path) -> list[str]:
    """The recorded overrides with the check's own length and directory in place of the run's,
    and no evaluation, save or resume on the way."""
    own = {
        "hydra.run.dir": run_dir,
        "trainer.max_steps": steps,
        "trainer.save_every": 0,
        "trainer.save_every_minutes": 0,
        "trainer.eval_every": 0,
        "trainer.test_tokens": 0,
        "logger": "none",
    }
    replaced = {*own, "trainer.resume"}
    kept = [o for o in recorded if o.lstrip("+~").split("=", 1)[0] not in replaced]
    return [*kept, *(f"{key}={value}" for key, value in own.items())]


def command_overrides(command: str) -> list[str] | None:
    """The Hydra overrides of a trainer command line (what follows ``train/pretrain.py``, however
    it is launched), or None when the trainer is not in it."""
    words = shlex.split(command)
    at = next((i for i, word in enumerate(words) if word.endswith(TRAINER)), None)
    return None if at is None else words[at + 1 :]


def read_numbers(run_dir: Path) -> Numbers:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    times = [r["step_time_s"] for r in steps[1:]] or [r["step_time_s"] for r in steps]
    return Numbers(
        losses=[(r["step"], r["loss"]) for r in steps],
        val_loss=vals[-1] if vals else None,
        median_step_s=statistics.median(times),
    )


def first_difference(a: Numbers, b: Numbers) -> str | None:
    """Where two repeats part, in words; None when every number is the same."""
    if [s for s, _ in a.losses] != [s for s, _ in b.losses]:
        return DIFFERENT_STEPS
    for (step, x), (_, y) in zip(a.losses, b.losses, strict=True):
        if x != y:
            return f"training loss at step {step}: {x!r} against {y!r}"
    if a.val_loss != b.val_loss:
        return f"final validation loss: {a.val_loss!r} against {b.val_loss!r}"
    return None


def how_far(a: Numbers, b: Numbers) -> str:
    """The size of a difference, for a study to weigh it: the largest gap between the logged
    training losses (at the same steps) and the final validation loss of each repeat."""
    gaps = [(abs(x - y), s) for (s, x), (_, y) in zip(a.losses, b.losses, strict=True)]
    validation = f"final validation loss {a.val_loss!r} against {b.val_loss!r}"
    if not gaps:  # a check shorter than the run's log interval logs no training loss
        return validation
    gap, step = max(gaps)
    return f"largest training-loss gap {gap:.3g} (step {step}); {validation}"


def repeat(trainer: Path, recorded: list[str], steps: int, run_dir: Path, threads: int) -> Numbers:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    overrides = check_overrides(recorded, steps, run_dir)
    result = subprocess.run(
        [sys.executable, str(trainer), *overrides], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"the run at {threads} threads exited {result.returncode}: {tail[0]}")
    return read_numbers(run_dir)


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--like", type=Path, help="a run directory whose command is repeated")
    which.add_argument(
        "--command",
        help="a trainer command line to repeat, e.g. one that scripts/reproduce_cpu.py --plan "
        "--commands prints (a run not started yet)",
    )
    parser.add_argument("--trainer", type=Path, default=REPO / "train" / "pretrain.py")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, help="where the repeats run (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.like is not None:
        if not (args.like / OVERRIDES).is_file():
            parser.error(
                f"--like {args.like}: no {OVERRIDES} (not a run directory of this trainer)"
            )
        args.recorded = yaml.safe_load((args.like / OVERRIDES).read_text())
    else:
        args.recorded = command_overrides(args.command)
        if args.recorded is None:
            parser.error(f"--command: no {TRAINER} in it (not a command of this trainer)")
    if not args.trainer.is_file():
        parser.error(f"--trainer {args.trainer}: no such file")
    if len(args.threads) < 2 or min(args.threads) < 1:
        parser.error("--threads: at least two counts, each at least 1")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: needs at least 1")
    return parser, args


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        numbers = {}
        for threads in args.threads:
            run_dir = root / f"threads{threads}"
            try:
                numbers[threads] = repeat(args.trainer, args.recorded, args.steps, run_dir, threads)
            except RuntimeError as error:
                parser.exit(2, f"{parser.prog}: error: {error}\n")
            print(f"{threads} threads: {numbers[threads].median_step_s:.3f} s a step (median)")
    base, *others = args.threads
    for threads in others:
        difference = first_difference(numbers[base], numbers[threads])
        if difference is not None:
            print(f"{base} and {threads} threads differ: {difference}")
            if difference != DIFFERENT_STEPS:
                print(f"  {how_far(numbers[base], numbers[threads])}")
            return 1
    steps = len(numbers[base].losses)
    print(
        f"the same numbers at {', '.join(map(str, args.threads))} threads: the training loss at "
        f"{steps} logged steps and the final validation loss {numbers[base].val_loss!r}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
