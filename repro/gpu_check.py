"""``make gpu-check``: the one prepared run for a lent GPU, offline, with the machine's own torch.

``wheels`` (run where a package index is reachable, with the project's environment) puts the
pure-Python packages a GPU image with torch, triton and transformers may lack into a git-ignored
folder of at most 64 MiB: the trainer's (hydra-core, omegaconf, antlr4-python3-runtime, whose
4.9.3 exists only as a source distribution and is built into a wheel here, datasets, dill,
multiprocess, xxhash) and the tests' (pytest and its own), at the versions of this environment,
for each Python of ``--pythons`` where a wheel is version-specific.

``install`` (stdlib only, no network) installs, with ``pip --no-index --no-deps --target``, the
wheels of the folder whose distributions the machine's Python lacks: it never installs or
replaces torch, triton or transformers, and shadows nothing the machine has.

``run`` (at most ``--budget-s`` seconds, 8 minutes by default) runs the ``gpu`` tests, the
optimizer-step benchmark (FOAM-2, FOAM-3, FOAM-Mini and FOAM-2's eager step against fused AdamW,
fp32 and bf16, LLaMA-60M and 350M shapes) and short LLaMA-60M bf16 training runs of six methods,
each with steady tokens/s, MFU and peak memory beside the memory estimator's prediction, and
writes ``results/bench/gpu_<device>.md``, section by section as each step ends (a step that runs
out of time is reported so and the next one starts). Without a GPU it runs the same steps on the
CPU at tiny sizes, and the report says so: none of its figures is a GPU figure.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS_LIMIT_BYTES = 64 * 2**20
SOURCE_ONLY = {"antlr4-python3-runtime"}
"""Distributions published as a source distribution only (at the version hydra pins)."""
TRAINER_PACKAGES = (
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "datasets",
    "dill",
    "multiprocess",
    "xxhash",
    "pandas",  # datasets imports it; compiled, so only where the image lacks it
    "python-dateutil",
)
TEST_PACKAGES = ("pytest", "pluggy", "iniconfig", "pygments", "exceptiongroup", "tomli")
PER_PYTHON = {"multiprocess", "xxhash", "pandas", "exceptiongroup", "tomli"}
"""Wheels tagged per Python version (or needed by some versions only): fetched for each that
has one (pandas 3 has none for 3.10; exceptiongroup and tomli serve Pythons before 3.11)."""
NEVER = {"torch", "triton", "transformers"}
"""The machine's own: never installed by the check, whatever the folder holds."""
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
PLATFORMS = tuple(
    arg
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
)
"""x86-64 Linux wheels (pip then takes the newest that fits one of these) or pure ones."""

GPU_TESTS = "tests/test_gpu.py"
"""The ``gpu`` tests' module: collecting the others would need the dev-only packages (reference
implementations, psutil, submitit) that a GPU image lacks."""
TRAIN_METHODS = ("adamw", "foam2", "foam_mini", "galore_1_4", "apollo_mini", "muon")
BENCH_METHODS = ("adamw_fused", "foam2", "foam3", "foam_mini", "foam2_eager")


# -- wheels and the offline install ---------------------------------------------------------


def pinned(name: str) -> str | None:
    """``name==version`` as installed here, or None when it is not installed."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return None


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def make_wheels(dest: Path, pythons: tuple[str, ...]) -> None:
    """Fill ``dest`` with the wheels (needs a package index); fails beyond the size limit."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*TRAINER_PACKAGES, *TEST_PACKAGES):
        spec = pinned(name) or name  # exceptiongroup, tomli: newest (this Python needs neither)
        if name in SOURCE_ONLY:
            pip(
                sys.executable,
                "wheel",
                "-q",
                "--no-deps",
                "--no-binary",
                name,
                "-w",
                str(dest),
                spec,
            )
            continue
        targets = pythons if name in PER_PYTHON else (None,)
        for version in targets:
            where = ["--python-version", version] if version else []
            try:
                pip(
                    sys.executable, "download", "-q", "--no-deps", "--only-binary", ":all:",
                    *PLATFORMS,
                    *where, "-d", str(dest), spec,
                )  # fmt: skip
            except subprocess.CalledProcessError:
                if version is None:
                    raise
                print(f"{spec}: no wheel for Python {version}", file=sys.stderr)
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {dest}")
    if size > WHEELS_LIMIT_BYTES:
        sys.exit(
            f"error: {dest} holds {size / 2**20:.1f} MiB, over the 64 MiB a device run carries"
        )


def distribution_of(wheel: Path) -> str:
    """The normalised distribution name of a wheel file (``hydra_core-1.3.2-...`` -> hydra-core)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def missing(names: set[str], python: str) -> set[str]:
    """Those of ``names`` that ``python`` (the machine's, not this one) has no distribution of."""
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "names = json.loads(sys.argv[1])\n"
        "found = set()\n"
        "for n in names:\n"
        "    try:\n"
        "        m.version(n); found.add(n)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(sorted(set(names) - found)))\n"
    )
    out = subprocess.run(
        [python, "-c", probe, json.dumps(sorted(names))], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


REQUIRED = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "pytest"}
"""What the check cannot run without."""


def install(wheels: Path, target: Path, python: str) -> None:
    """Install offline what ``python`` lacks among the folder's distributions into ``target``."""
    available = {distribution_of(w) for w in wheels.glob("*.whl")} if wheels.is_dir() else set()
    available -= NEVER
    unobtainable = missing(REQUIRED - available, python)
    if unobtainable:
        sys.exit(
            f"error: {python} lacks {', '.join(sorted(unobtainable))} and {wheels} has no wheel "
            "of them: run `make gpu-wheels` where a package index is reachable and bring that "
            "folder along"
        )
    needed = missing(available, python)
    if not needed:
        print(f"gpu-check: nothing to install (folder {wheels}: {len(available)} distributions)")
        return
    print(f"gpu-check: installing {', '.join(sorted(needed))} into {target} (offline)")
    pip(
        python, "install", "-q", "--no-index", "--no-deps", "--find-links", str(wheels),
        "--target", str(target), "--upgrade", *sorted(needed),
    )  # fmt: skip


# -- the check ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """The sizes of the check: a GPU's, or the CPU's tiny stand-ins."""

    device: str
    bench_models: tuple[str, ...]
    train_model: str
    precision: str
    """bf16 on a GPU (the paper's); fp32 on the CPU, whose bf16 matmuls crawl."""
    train_args: tuple[str, ...]
    run_limit_s: float
    """Each training run's share of the budget at most."""
    slack: float
    """Factor on the tests' and the benchmark's time limits (a shared CPU is slow to start)."""

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


GPU = Mode(
    "cuda",
    ("llama_60m", "llama_350m"),
    "llama_60m",
    "bf16",
    (
        "trainer.max_steps=100",
        "trainer.global_batch_size=64",
        "trainer.micro_batch_size=64",
        "trainer.log_every=20",
        "trainer.eval_tokens=20000",
    ),
    90.0,  # the first compiled run (trainer.compile's GPU default) took 29 s on an H100
    1.0,
)
CPU = Mode(
    "cpu",
    ("llama_tiny",),
    "llama_tiny",
    "fp32",
    (
        "trainer=cpu_debug",
        "trainer.max_steps=4",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
        "trainer.log_every=2",
        "trainer.eval_tokens=500",
        "data.seq_len=64",
    ),
    400.0,
    5.0,
)


class Budget:
    """The check's wall-clock allowance, shared out to its steps."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.deadline - time.monotonic()))


def run_step(cmd: list[str], timeout: float, cwd: Path = REPO) -> tuple[str, str]:
    """(status, output tail) of one step: ``ok``, ``failed (rc N)`` or ``timed out``."""
    if timeout <= 0:
        return "not run (no time left)", ""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return f"timed out after {timeout:.0f} s", out[-3000:]
    status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    return status, (proc.stdout + proc.stderr)[-3000:]


def gpu_tests(mode: Mode, budget: Budget) -> str:
    status, tail = run_step(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", GPU_TESTS],
        budget.left(120 * mode.slack),
    )
    summary = next(
        (line for line in reversed(tail.splitlines()) if re.search(r"passed|failed|skipped", line)),
        "",
    )
    body = f"Command: `python -m pytest -q -m gpu {GPU_TESTS}`: **{status}**, "
    body += f"{summary.strip('= ')}\n"
    if status != "ok":
        body += f"\n```\n{tail}\n```\n"
    return "## GPU tests\n\n" + body


def bench(mode: Mode, budget: Budget, scratch: Path) -> str:
    out = scratch / "bench_optim.md"
    args = ["--models", *mode.bench_models, "--dtypes", "fp32", "bf16"]
    args += ["--methods", *BENCH_METHODS, "--device", mode.device]
    args += ["--rounds", "3", "--steps", "5"] if mode.on_gpu else ["--rounds", "1", "--steps", "1"]
    status, tail = run_step(
        [sys.executable, "scripts/bench_optim.py", *args, "--out", str(out)],
        budget.left(150 * mode.slack),
    )
    body = f"Command: `python scripts/bench_optim.py {' '.join(args)}`: **{status}**\n\n"
    if out.is_file():  # its report without its title and command, said above
        lines = out.read_text().splitlines()[1:]
        body += "\n".join(line for line in lines if not line.startswith("Command:")).lstrip()
        body += "\n"
    else:
        body += f"```\n{tail}\n```\n"
    return "## Optimizer step (scripts/bench_optim.py)\n\n" + body


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


def training_runs(mode: Mode, budget: Budget, scratch: Path) -> str:
    rows = []
    for method in TRAIN_METHODS:
        run_dir = scratch / f"train_{method}"
        cmd = [
            sys.executable, "train/pretrain.py", f"+model={mode.train_model}", f"+optim={method}",
            "data=embedded", "logger=none", f"trainer.precision={mode.precision}",
            "trainer.eval_every=0",
            "trainer.save_every=0", "trainer.save_final=false", "data.num_workers=1",
            *mode.train_args, f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        status, tail = run_step(cmd, budget.left(mode.run_limit_s))
        summary_file = run_dir / "summary.json"
        s = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        rows.append(
            row(method, status, s, predicted_bytes(mode.train_model, method, mode.precision))
        )
        if status != "ok":
            rows.append(f"|  | `{tail.strip().splitlines()[-1] if tail.strip() else ''}` |")
    head = (
        f"Each: `python train/pretrain.py +model={mode.train_model} +optim=METHOD data=embedded "
        f"logger=none trainer.precision={mode.precision} trainer.eval_every=0 trainer.save_every=0 "
        f"trainer.save_final=false data.num_workers=1 {' '.join(mode.train_args)}`. Steady = "
        "without the first logged interval (kernel builds, compilation: `trainer.compile` is at "
        "its default, on for a GPU); peak = the train phase's (CUDA max allocated; process RSS "
        "on CPU); predicted = the memory estimator's "
        f"weights + optimizer state in {mode.precision} (no gradients or activations); step s = "
        "the time per step the run estimated at start-up (`train/estimate.py`) and the one it "
        "measured over its first logged interval past step 1.\n\n"
        "| method | status | tokens/s steady | tokens/s overall | MFU steady | MFU overall | "
        "peak MiB | predicted MiB | state MiB | final val loss | step s estimated / measured |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    return "## Training runs (train/pretrain.py)\n\n" + head + "\n".join(rows) + "\n"


def row(method: str, status: str, s: dict, predicted: int | None) -> str:
    def num(value: float | None, fmt: str, scale: float = 1.0) -> str:
        return "-" if value is None else format(value / scale, fmt)

    return (
        f"| {method} | {status} | {num(s.get('tokens_per_s_steady'), '.0f')} | "
        f"{num(s.get('tokens_per_s'), '.0f')} | {num(s.get('mfu_steady'), '.1%')} | "
        f"{num(s.get('mfu'), '.1%')} | {num(s.get('peak_memory_bytes'), '.0f', 2**20)} | "
        f"{num(predicted, '.0f', 2**20)} | {num(s.get('optimizer_state_bytes'), '.1f', 2**20)} | "
        f"{num(s.get('final_val_loss'), '.3f')} | "
        f"{num(s.get('step_s_estimated'), '.3g')} / {num(s.get('step_s_measured'), '.3g')} |"
    )


def header(mode: Mode, device_name: str) -> str:
    import torch

    from train.summary import git_sha  # with "-dirty": a device may hold an older .git

    versions = {n: pinned(n) or f"{n} absent" for n in ("transformers", "triton")}
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
        f"{', '.join(versions.values())}.\n\n"
    )


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def check(args: argparse.Namespace) -> Path:
    import torch

    mode = GPU if torch.cuda.is_available() and not args.cpu else CPU
    name = torch.cuda.get_device_name(0) if mode.on_gpu else "cpu"
    out = args.out or REPO / "results" / "bench" / f"gpu_{device_slug(name)}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    report = header(mode, name)
    out.write_text(report)
    print(report, flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        for step in (
            lambda: gpu_tests(mode, budget),
            lambda: bench(mode, budget, Path(scratch)),
            lambda: training_runs(mode, budget, Path(scratch)),
        ):
            section = step()
            print(section, flush=True)
            report += section + "\n"
            out.write_text(report)  # what is done survives a step that runs out of time
    print(f"gpu-check: wrote {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wheels = sub.add_parser("wheels", help="download / build the wheels (needs a package index)")
    wheels.add_argument("--dest", type=Path, default=REPO / "gpu-wheels")
    wheels.add_argument("--pythons", nargs="+", default=list(PYTHONS))
    inst = sub.add_parser("install", help="offline install of what the machine lacks")
    inst.add_argument("--wheels", type=Path, default=REPO / "gpu-wheels")
    inst.add_argument("--target", type=Path, default=REPO / ".gpu-site")
    inst.add_argument("--python", default=sys.executable, help="the machine's Python")
    run = sub.add_parser("run", help="the check; writes results/bench/gpu_<device>.md")
    run.add_argument("--budget-s", type=float, default=470.0, help="the whole check's limit")
    run.add_argument("--out", type=Path, default=None)
    run.add_argument("--cpu", action="store_true", help="the CPU's tiny sizes even with a GPU")
    args = parser.parse_args()
    if args.command == "wheels":
        make_wheels(args.dest, tuple(args.pythons))
    elif args.command == "install":
        install(args.wheels, args.target, args.python)
    else:
        check(args)
