"""Running the trainer's CLI (``python train/pretrain.py``, ``torchrun``) on a tiny LLaMA from a
test, and reading what the run left: the end-to-end tests of the trainer, the fault, FSDP and
export tests and the sweep's tests all launch it this way (tests/e2e/test_train_cli.py is the
CLI's own tests)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
TINY = [  # a run of a few seconds a step on one CPU core
    "+model=llama_tiny",
    "trainer=cpu_debug",
    "logger=none",
    "data.seq_len=64",
    "trainer.global_batch_size=4",
    "trainer.micro_batch_size=2",
    "trainer.eval_tokens=2000",
    "data.num_workers=0",
    "data.allow_small_tokenizer=true",  # the project's SentencePiece for llama_tiny's 32000 ids
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
"""One thread a process (the tests share 2 cores) and no W&B network traffic."""


def command(
    run_dir: Path, *overrides: str, optim: str | None = "foam2", tiny: bool = True
) -> list[str]:
    """``train/pretrain.py`` writing to ``run_dir``: ``optim=None`` leaves ``+optim=`` out and
    ``tiny=False`` the tiny run's overrides, for the tests of what a missing one does."""
    return [
        sys.executable,
        "train/pretrain.py",
        *([f"+optim={optim}"] if optim else []),
        *(TINY if tiny else []),
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def torchrun(cmd: list[str], ranks: int = 2) -> list[str]:
    """``cmd`` (from ``command``) as ``ranks`` processes under ``torchrun --standalone``."""
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), *cmd[1:]]


def run(cmd: list[str], expect_rc: int = 0) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the repository to its end; its exit status must be ``expect_rc``."""
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == expect_rc, proc.stderr[-4000:]
    return proc


def records(run_dir: Path) -> list[dict]:
    """Every line of the run's ``metrics.jsonl``: training steps and evaluations."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir: Path) -> dict[int, float]:
    """Step -> training loss: what runs that must agree (resumed, sharded, ...) compare."""
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The run's error line: the last line of stderr, and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc.stderr.strip().splitlines()[-1]


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the run's published checkpoints (``checkpoints/step_*``), ascending."""
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen, what: str, timeout_s: float = 300
) -> None:
    """Poll ``condition`` until it holds; fail if the run ends or the time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def logged_steps(run_dir: Path) -> int:
    """The last step with a logged loss (0 before the first), for waiting on a running run."""
    path = run_dir / "metrics.jsonl"
    return max(train_losses(run_dir), default=0) if path.exists() else 0


def stop_with(
    cmd: list[str],
    run_dir: Path,
    sig: signal.Signals,
    at_step: int,
    **extra_wait: tuple[Callable[[], bool], str],
) -> subprocess.CompletedProcess:
    """Start ``cmd``, send ``sig`` twice (the second while the first is being handled) once
    metrics.jsonl shows ``at_step`` and each ``(condition, what)`` of ``extra_wait`` holds, and
    return the finished process."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: logged_steps(run_dir) >= at_step, proc, f"step {at_step}")
        for condition, what in extra_wait.values():
            wait_for(condition, proc, what)
        proc.send_signal(sig)
        time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout.decode(), stderr.decode())
