"""``make gpu-check OUT=DIR``: the one prepared run for a lent GPU, offline, with the machine's
own torch; everything it makes lands in DIR as each section finishes.

``make gpu-deps`` (``tools/gpu_deps.py``) first installs offline what the machine lacks and proves
it imports. ``run`` (at most ``--budget-s`` seconds, 8 minutes by default, of which each training
run's ``--run-budget-s`` is reserved for it before anything starts: no benchmark or compile
before the runs starves them) then runs, in this order, each section written to DIR as soon as
it ends (``--sections`` picks some, to split the check across commands):

1. the ``gpu`` tests;
2. the optimizer-step benchmark (FOAM-2, FOAM-3, FOAM-Mini and FOAM-2's eager step against
   fused AdamW, bf16, LLaMA-60M, 350M and 1B shapes), with the step each FOAM group took,
   then LLaMA-1B's matrices shape by shape (``--by-shape``: which tile kind a ratio comes from);
3. the end-to-end comparison, FOAM-2 against AdamW at LLaMA-60M, 350M and 1B with compiled decoder
   layers (``scripts/bench_train.py --compiled-only``: 3 interleaved rounds, each starting with
   the next optimizer, after every optimizer's warm-up and compilation);
4. throughput at a memory cap at LLaMA-350M (``scripts/bench_train.py --memory-cap``);
5. short LLaMA-60M bf16 training runs of six methods, their run directories (``summary.json``,
   ``metrics.jsonl``) under DIR/runs, each with steady tokens/s, MFU, peak memory beside the memory
   estimator's prediction and the FOAM step it took (section 3 has filled inductor's cache with
   the same layer at the same shapes, so the first run does not pay the cold compile alone);

and last the targets of issue 50 read off those sections (FOAM-2's step <= 0.8x fused AdamW's at
350M and 1B, FOAM-Mini's <= 0.7x; FOAM-2's end-to-end tokens/s >= 0.99x AdamW's). DIR holds
``report.md``, each step's full output under ``logs/`` (kept, stderr included, when a step runs
out of time), the benchmarks' own reports and the runs. Without ``--out`` DIR is
``results/bench/gpu_<device>/``. With ``--bundle`` DIR holds two files only, ``report.md`` and
``check.tar.gz`` (all the rest, the runs' exported models left out), both rewritten as each
section ends: for a machine that hands back only a few files of a folder. Without a GPU it runs
the same steps on the CPU at tiny sizes (the memory cap needs a GPU and is skipped), and the
report says so: none of its figures is a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tools import gpu_deps

REPO = Path(__file__).resolve().parents[1]

GPU_TESTS = "tests/test_gpu.py"
"""The ``gpu`` tests' module: collecting the others would need the dev-only packages (reference
implementations, psutil, submitit) that a GPU image lacks."""
TRAIN_METHODS = ("adamw", "foam2", "foam_mini", "galore_1_4", "apollo_mini", "muon")
SHAPE_METHODS = ("adamw_fused", "foam2", "foam3", "foam_mini")
BENCH_METHODS = (*SHAPE_METHODS, "foam2_eager")
STEP_TARGETS = {"foam2": 0.8, "foam_mini": 0.7}
"""Issue 50: step time over fused AdamW's at LLaMA-350M and 1B shapes in bf16, at most."""
STEP_TARGET_MODELS = ("llama_350m", "llama_1b")
END_TO_END_TARGET = 0.99
"""Issue 50: FOAM-2's end-to-end steady tokens/s over AdamW's, compiled, at least."""


@dataclass(frozen=True)
class Mode:
    """The sizes of the check: a GPU's, or the CPU's tiny stand-ins."""

    device: str
    bench_models: tuple[str, ...]
    end_to_end_models: tuple[str, ...]
    train_model: str
    precision: str
    """bf16 on a GPU (the paper's); fp32 on the CPU, whose bf16 matmuls crawl."""
    end_to_end_args: tuple[str, ...]
    train_args: tuple[str, ...]
    run_limit_s: float
    """Each training run's own allowance (``--run-budget-s`` by default), reserved out of the
    check's budget before any section starts."""
    slack: float
    """Factor on the tests' and the benchmarks' time limits (a shared CPU is slow to start)."""

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


GPU = Mode(
    "cuda",
    ("llama_60m", "llama_350m", "llama_1b"),
    ("llama_60m", "llama_350m", "llama_1b"),
    "llama_60m",
    "bf16",
    # The training runs' micro-batch and sequence, so their compiled layer is the one built here.
    ("--compiled-only", "--batch-size", "64", "--seq-len", "256", "--rounds", "3", "--steps", "4"),
    (
        "trainer.max_steps=100",
        "trainer.global_batch_size=64",
        "trainer.micro_batch_size=64",
        "trainer.log_every=20",
        "trainer.eval_tokens=20000",
    ),
    60.0,
    1.0,
)
CPU = Mode(
    "cpu",
    ("llama_tiny",),
    ("llama_tiny",),
    "llama_tiny",
    "fp32",
    ("--batch-size", "2", "--seq-len", "32", "--rounds", "1", "--steps", "1", "--warmup", "1"),
    (
        "trainer=cpu_debug",
        "trainer.max_steps=4",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
        "trainer.log_every=2",
        "trainer.eval_tokens=500",
        "data.seq_len=64",
    ),
    200.0,
    5.0,
)
MEMORY_CAP_ARGS = (
    "--model", "llama_350m", "--precision", "bf16", "--memory-cap", "16", "--optimizers", "adamw",
    "foam2", "--steps", "2", "--max-micro-batch", "512",
)  # fmt: skip
"""Section 4: LLaMA-350M within 16 GiB (a 16 GB card's memory), eager."""


class Budget:
    """The check's wall-clock allowance, shared out to its steps. Its last ``reserved`` seconds
    are the training runs' alone: no section before them (a benchmark's compile, a slow test)
    eats into them, and each run gets an equal part of what is left when it starts, so a run
    that takes all of its part leaves every later run as much."""

    def __init__(self, seconds: float, reserved: float = 0.0) -> None:
        self.deadline = time.monotonic() + seconds
        self.reserved = reserved

    def left(self, cap: float) -> float:
        """A section's allowance: at most ``cap``, never out of the runs' reserve."""
        return max(0.0, min(cap, self.deadline - self.reserved - time.monotonic()))

    def run_share(self, runs_left: int) -> float:
        """A training run's allowance: what is left of the whole budget over the runs to go."""
        return max(0.0, (self.deadline - time.monotonic()) / runs_left)


class Report:
    """``report.md`` in the output folder, rewritten whole after each section: what is done is
    on disk whatever stops the check later."""

    def __init__(self, path: Path, header: str) -> None:
        self.path, self.text = path, header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text)
        print(header, flush=True)

    def add(self, section: str) -> None:
        self.text += section + "\n"
        self.path.write_text(self.text)
        print(section, flush=True)


@dataclass(frozen=True)
class Step:
    """How one step ended, with the tail of its output (its whole output is in its log)."""

    status: str
    tail: str
    log: Path
    seconds: float = 0.0
    """Its wall time: what the next check's budget is shared out by."""


def run_step(name: str, cmd: list[str], timeout: float, logs: Path, cwd: Path = REPO) -> Step:
    """Run ``cmd`` with stdout and stderr into ``logs/NAME.log``, so that a step that runs out
    of time keeps all it printed; at the limit its whole process group is ended (pytest's and
    inductor's workers included). Status: ``ok``, ``failed (rc N)``, ``timed out after N s``."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    if timeout <= 0:
        log.write_text("not run: no time left\n")
        return Step("not run (no time left)", "", log)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"timed out after {timeout:.0f} s"
    tail = log.read_text(errors="replace")[-3000:]
    return Step(status, tail, log, time.monotonic() - started)


def step_body(command: str, step: Step, out_dir: Path) -> str:
    """The command and how it ended; the output's tail when it did not end well."""
    output = step.log.relative_to(out_dir)
    body = f"Command: `{command}`: **{step.status}**, {step.seconds:.0f} s (output: `{output}`)\n"
    if step.status != "ok":
        body += f"\n```\n{step.tail.strip()}\n```\n"
    return body


def gpu_tests(mode: Mode, budget: Budget, out_dir: Path) -> str:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", GPU_TESTS]
    step = run_step("gpu_tests", cmd, budget.left(120 * mode.slack), out_dir / "logs")
    summary = next(
        (
            line
            for line in reversed(step.tail.splitlines())
            if re.search(r"passed|failed|skipped", line)
        ),
        "",
    )
    body = step_body(f"python -m pytest -q -m gpu {GPU_TESTS}", step, out_dir)
    return f"## GPU tests\n\n{summary.strip('= ')}\n\n{body}"


def benchmark(name: str, script: str, args: list[str], limit: float, out_dir: Path) -> str:
    """Run a benchmark script writing its report to DIR/NAME.md; that report without its title
    and command (said here), or the output's tail."""
    out = out_dir / f"{name}.md"
    cmd = [sys.executable, f"scripts/{script}", *args, "--out", str(out)]
    step = run_step(name, cmd, limit, out_dir / "logs")
    body = step_body(f"python scripts/{script} {' '.join(args)}", step, out_dir)
    if out.is_file():
        lines = out.read_text().splitlines()[1:]
        body += "\n" + "\n".join(x for x in lines if not x.startswith("Command:")).lstrip() + "\n"
    return body


def step_timing(mode: Mode) -> list[str]:
    """``scripts/bench_optim.py``'s rounds and steps: a GPU's medians, or one of each on a CPU."""
    return ["--rounds", "3", "--steps", "5"] if mode.on_gpu else ["--rounds", "1", "--steps", "1"]


def optimizer_step(mode: Mode, budget: Budget, out_dir: Path) -> str:
    args = ["--models", *mode.bench_models, "--dtypes", "bf16"]
    args += ["--methods", *BENCH_METHODS, "--device", mode.device]
    args += step_timing(mode)
    body = benchmark("bench_optim", "bench_optim.py", args, budget.left(150 * mode.slack), out_dir)
    return "## Optimizer step (scripts/bench_optim.py)\n\n" + body


def step_by_shape(mode: Mode, budget: Budget, out_dir: Path) -> str:
    """The largest model's step per matrix shape (``--by-shape``): which tile kind a missed
    target comes from (on an H200, LLaMA-1B's 5461-wide rows: results/bench/gpu_nvidia_h200.md)."""
    model = mode.bench_models[-1]
    args = ["--models", model, "--dtypes", "bf16", "--by-shape", "--device", mode.device]
    args += ["--methods", *SHAPE_METHODS]
    args += step_timing(mode)
    limit = budget.left(90 * mode.slack)  # a kernel build per shape and method
    body = benchmark("bench_optim_shapes", "bench_optim.py", args, limit, out_dir)
    return (
        f"## Optimizer step by matrix shape, {model} (scripts/bench_optim.py --by-shape)\n\n" + body
    )


def end_to_end(mode: Mode, budget: Budget, out_dir: Path) -> str:
    bodies = []
    for model in mode.end_to_end_models:
        args = ["--model", model, "--precision", mode.precision, "--device", mode.device]
        args += ["--optimizers", "adamw", "foam2", *mode.end_to_end_args]
        limit = budget.left(90 * mode.slack)
        bodies.append(benchmark(f"end_to_end_{model}", "bench_train.py", args, limit, out_dir))
    return "## End to end: FOAM-2 against AdamW (scripts/bench_train.py)\n\n" + "\n".join(bodies)


def memory_cap(mode: Mode, budget: Budget, out_dir: Path) -> str:
    title = "## Throughput at a memory cap (scripts/bench_train.py --memory-cap)\n\n"
    if not mode.on_gpu:
        return title + "Not run: it needs a CUDA device.\n"
    args = [*MEMORY_CAP_ARGS, "--device", mode.device]
    return title + benchmark("memory_cap", "bench_train.py", args, budget.left(120), out_dir)


def predicted_bytes(model: str, method: str, precision: str) -> int | None:
    """The memory estimator's weights + optimizer state (repro/memory_estimator.py) at the width
    ``precision`` holds them in, so a CPU run in fp32 is set against fp32 bytes."""
    from repro.memory_estimator import estimate
    from train.config import PARAM_DTYPES

    width = PARAM_DTYPES[precision].itemsize
    try:
        return estimate(model, method, width).total_bytes
    except (ValueError, KeyError):
        return None


def training_runs(mode: Mode, budget: Budget, out_dir: Path) -> str:
    fixed = [
        f"+model={mode.train_model}", "data=embedded", "logger=none",
        f"trainer.precision={mode.precision}", "trainer.eval_every=0", "trainer.save_every=0",
        "trainer.save_final=false", "data.num_workers=1", *mode.train_args,
    ]  # fmt: skip
    rows = []
    for index, method in enumerate(TRAIN_METHODS):
        run_dir = out_dir / "runs" / method
        cmd = [sys.executable, "train/pretrain.py", f"+optim={method}", *fixed]
        step = run_step(
            f"train_{method}",
            [*cmd, f"hydra.run.dir={run_dir}"],
            budget.run_share(len(TRAIN_METHODS) - index),
            out_dir / "logs",
        )
        summary_file = run_dir / "summary.json"
        s = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        predicted = predicted_bytes(mode.train_model, method, mode.precision)
        took = f"ok, {step.seconds:.0f} s" if step.status == "ok" else step.status
        rows.append(row(method, took, s, predicted))
        if step.status != "ok":
            last = step.tail.strip().splitlines()[-1] if step.tail.strip() else ""
            rows.append(f"|  | `{last}` |")
    head = (
        f"Each: `python train/pretrain.py +optim=METHOD {' '.join(fixed)}`, its run directory "
        "`runs/METHOD`. Steady = without the first logged interval (kernel builds, compilation: "
        "`trainer.compile` is at its default, on for a GPU); peak = the train phase's (CUDA max "
        "allocated; process RSS on CPU); predicted = the memory estimator's "
        f"weights + optimizer state in {mode.precision} (no gradients or activations); step s = "
        "the time per step the run estimated at start-up (`train/estimate.py`) and the one it "
        "measured over its first logged interval past step 1; FOAM step = the kernel each FOAM "
        "group's step took (`summary.json`'s `foam_steps`).\n\n"
        "| method | status | tokens/s steady | tokens/s overall | MFU steady | MFU overall | "
        "peak MiB | predicted MiB | state MiB | final val loss | step s estimated / measured | "
        "FOAM step |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    return "## Training runs (train/pretrain.py)\n\n" + head + "\n".join(rows) + "\n"


def row(method: str, status: str, s: dict, predicted: int | None) -> str:
    def num(value: float | None, fmt: str, scale: float = 1.0) -> str:
        return "-" if value is None else format(value / scale, fmt)

    steps = ", ".join(sorted(set((s.get("foam_steps") or {}).values()))) or "-"
    return (
        f"| {method} | {status} | {num(s.get('tokens_per_s_steady'), '.0f')} | "
        f"{num(s.get('tokens_per_s'), '.0f')} | {num(s.get('mfu_steady'), '.1%')} | "
        f"{num(s.get('mfu'), '.1%')} | {num(s.get('peak_memory_bytes'), '.0f', 2**20)} | "
        f"{num(predicted, '.0f', 2**20)} | {num(s.get('optimizer_state_bytes'), '.1f', 2**20)} | "
        f"{num(s.get('final_val_loss'), '.3f')} | "
        f"{num(s.get('step_s_estimated'), '.3g')} / {num(s.get('step_s_measured'), '.3g')} | "
        f"{steps} |"
    )


def targets(report: str) -> str:
    """Issue 50's targets read off the report's sections: each measured ratio beside its bound
    (a ratio the report lacks, because its section failed or ran out of time, is said so)."""
    lines = []
    for method, bound in STEP_TARGETS.items():
        for model in STEP_TARGET_MODELS:
            found = re.search(rf"\* {model} bf16: {method} / fused AdamW = ([\d.]+)", report)
            lines.append(verdict(f"{method} step / fused AdamW, {model} bf16", found, "<=", bound))
    for model in GPU.end_to_end_models:
        section = report.split(f"### {model}, bf16, compiled model")[1:]
        found = re.search(r"\n\| foam2 \| [\d.]+ \| ([\d.]+) \|", section[0]) if section else None
        lines.append(
            verdict(f"foam2 tokens/s / AdamW, {model} compiled", found, ">=", END_TO_END_TARGET)
        )
    capped = re.search(r"\* foam2 / adamw, tokens/s at the cap[^=]*= ([\d.]+)", report)
    lines.append(
        f"* foam2 tokens/s / AdamW at the memory cap: {capped[1] if capped else 'not measured'}"
    )
    return "## Targets (issue 50)\n\n" + "\n".join(lines) + "\n"


def verdict(what: str, found: re.Match | None, relation: str, bound: float) -> str:
    if found is None:
        return f"* {what}: not measured (target {relation} {bound})"
    value = float(found[1])
    met = value <= bound if relation == "<=" else value >= bound
    return f"* {what} = {value:.2f} (target {relation} {bound}): {'met' if met else 'missed'}"


def header(mode: Mode, device_name: str, python: str) -> str:
    import torch

    from train.summary import git_sha  # with "-dirty": a device may hold an older .git

    names = {n: gpu_deps.pinned(n) or f"{n} absent" for n in ("transformers", "triton")}
    where = (
        f"**GPU**: {device_name}, CUDA {torch.version.cuda}"
        if mode.on_gpu
        else "**No GPU: the same steps on the CPU at tiny sizes.** No figure below is a GPU figure"
    )
    return (
        f"# GPU check: {device_name}\n\n"
        f"Command: `make gpu-check` (`python scripts/gpu_check.py {' '.join(sys.argv[1:])}`), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, git {git_sha()}.\n\n"
        f"{where}. Python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"{', '.join([*names.values(), *gpu_deps.versions().values()])}; "
        f"pip check: {gpu_deps.pip_check(python)}.\n\n"
    )


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


SECTIONS: tuple[Callable[[Mode, Budget, Path], str], ...] = (
    gpu_tests,
    optimizer_step,
    step_by_shape,
    end_to_end,
    memory_cap,
    training_runs,
)


BUNDLE = "check.tar.gz"
BUNDLE_SKIPS = ("hf",)
"""Folders a bundle leaves out: the runs' exported models (``hf/``, 100+ MiB at LLaMA-60M)."""


def bundle(work_dir: Path, archive: Path) -> None:
    """``work_dir``'s files but ``BUNDLE_SKIPS``' into ``archive``, written whole beside it and
    renamed, so a check stopped mid-write still leaves the last complete one."""
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(work_dir.rglob("*")):
            inside = path.relative_to(work_dir)
            if path.is_file() and not set(inside.parts) & set(BUNDLE_SKIPS):
                tar.add(path, arcname=str(inside))
    partial.replace(archive)


def check(args: argparse.Namespace) -> Path:
    import torch

    mode = GPU if torch.cuda.is_available() and not args.cpu else CPU
    if args.run_budget_s is not None:
        mode = replace(mode, run_limit_s=args.run_budget_s)
    name = torch.cuda.get_device_name(0) if mode.on_gpu else "cpu"
    out_dir = (args.out or REPO / "results" / "bench" / f"gpu_{device_slug(name)}").resolve()
    work_dir = Path(tempfile.mkdtemp(prefix="gpu-check-")) if args.bundle else out_dir
    chosen = [s for s in SECTIONS if args.sections is None or s.__name__ in args.sections]
    runs = len(TRAIN_METHODS) if training_runs in chosen else 0
    budget = Budget(args.budget_s, reserved=runs * mode.run_limit_s)
    report = Report(out_dir / "report.md", header(mode, name, sys.executable))
    for section in chosen:
        report.add(section(mode, budget, work_dir))
        if args.bundle:
            bundle(work_dir, out_dir / BUNDLE)
    report.add(targets(report.text))
    print(f"gpu-check: wrote {out_dir}")
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True)
    wheels = sub.add_parser("wheels", help="download / build the wheels (needs a package index)")
    wheels.add_argument("--dest", type=Path, default=REPO / "gpu-wheels")
    wheels.add_argument("--box-python", default=gpu_deps.BOX_PYTHON, help="the GPU box's X.Y")
    inst = sub.add_parser("install", help="offline install of what the machine lacks")
    inst.add_argument("--wheels", type=Path, default=REPO / "gpu-wheels")
    inst.add_argument("--target", type=Path, default=REPO / ".gpu-site")
    inst.add_argument("--python", default=sys.executable, help="the machine's Python")
    run = sub.add_parser("run", help="the check; writes into --out as each section ends")
    run.add_argument("--budget-s", type=float, default=470.0, help="the whole check's limit")
    run.add_argument("--out", type=Path, default=None, help="default results/bench/gpu_<device>")
    run.add_argument("--cpu", action="store_true", help="the CPU's tiny sizes even with a GPU")
    run.add_argument(
        "--run-budget-s",
        type=float,
        default=None,
        help="each training run's own seconds, reserved out of --budget-s before the sections "
        f"start (default {GPU.run_limit_s:.0f} on a GPU, {CPU.run_limit_s:.0f} on the CPU)",
    )
    run.add_argument(
        "--sections",
        nargs="+",
        default=None,
        choices=[s.__name__ for s in SECTIONS],
        help="run these sections only (default all), e.g. to split the check across two "
        "commands that each fit a device's limit",
    )
    run.add_argument(
        "--bundle",
        action="store_true",
        help=f"--out holds report.md and {BUNDLE} (everything else) alone",
    )
    args = parser.parse_args()
    if args.command == "wheels":
        gpu_deps.make_wheels(args.dest, args.box_python)
    elif args.command == "install":
        gpu_deps.install(args.wheels, args.target, args.python)
    else:
        check(args)
