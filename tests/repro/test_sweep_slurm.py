"""scripts/sweep.py on SLURM without a cluster: fake ``sbatch`` / ``srun`` / ``scontrol`` on PATH and
a fake job environment, then the job run the way SLURM runs it (``python -m submitit.core._submit``)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro import sweep
from tests.helpers.cli import TINY

ROOT = Path(__file__).resolve().parents[2]

submitit = pytest.importorskip("submitit", reason="the SLURM launcher needs submitit (dev extra)")

JOB_ID = "4242"


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``sbatch`` keeps the script and answers with JOB_ID, ``scontrol`` logs its arguments,
    ``srun`` only has to exist (submitit looks for it); the job's environment says JOB_ID."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sbatch": f'cp "$1" {tmp_path}/job.sbatch\necho "Submitted batch job {JOB_ID}"',
        "scontrol": f'echo "$@" >> {tmp_path}/scontrol.log',
        "srun": "exit 1",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", JOB_ID)
    return tmp_path


@pytest.fixture
def restore_signal_handlers():
    previous = {sig: signal.getsignal(sig) for sig in sweep.REQUEUE_SIGNALS}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def scontrol_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


def child(run_dir: Path, *, signal_parent: bool, finish: bool, status: int) -> list[str]:
    """A stand-in for torchrun: maybe SLURM's early signal (sent to the job, i.e. its parent),
    maybe a finished run's summary.json, then an exit status."""
    code = [
        "import os, signal, sys, pathlib",
        f"run_dir = pathlib.Path({str(run_dir)!r})",
        "run_dir.mkdir(parents=True, exist_ok=True)",
    ]
    if signal_parent:
        code.append("os.kill(os.getppid(), signal.SIGUSR2)")
    if finish:
        code.append("(run_dir / 'summary.json').write_text('{}')")
    code.append(f"sys.exit({status})")
    return [sys.executable, "-c", "\n".join(code)]


@pytest.mark.parametrize(
    ("signal_parent", "finish", "status", "requeued"),
    [
        (True, False, 1, True),  # stopped by the early signal: requeue
        (True, True, 0, False),  # the signal came, but the run had finished
        (False, True, 0, False),  # finished
    ],
)
def test_a_job_requeues_itself_only_when_the_signal_stopped_an_unfinished_run(
    fake_slurm, restore_signal_handlers, signal_parent, finish, status, requeued
):
    run_dir = fake_slurm / "run"
    job = sweep.SlurmPoint(
        child(run_dir, signal_parent=signal_parent, finish=finish, status=status), run_dir, 60
    )
    job()
    assert scontrol_calls(fake_slurm) == ([f"requeue {JOB_ID}"] if requeued else [])


def test_a_job_that_fails_without_a_signal_fails(fake_slurm, restore_signal_handlers):
    run_dir = fake_slurm / "run"
    job = sweep.SlurmPoint(child(run_dir, signal_parent=False, finish=False, status=1), run_dir, 60)
    with pytest.raises(subprocess.CalledProcessError):
        job()
    assert scontrol_calls(fake_slurm) == []


def submit(tmp_path: Path, *overrides: str) -> Path:
    """Submit one tiny point with the fake sbatch; returns its run directory."""
    root = tmp_path / "sweep"
    args = ["--model", "llama_tiny", "--methods", "adamw", "--lrs", "1e-3", "--seeds", "0"]
    launcher = ["--launcher", "slurm", "--slurm-signal-seconds", "120", "--allow-dirty"]
    assert sweep.main([*args, "--root", str(root), *launcher, "--", *overrides]) == 0
    return sweep.grid("llama_tiny", ["adamw"], [1e-3], None, [0])[0].run_dir(root)


def test_jobs_ask_for_an_early_signal_and_may_be_requeued(fake_slurm):
    run_dir = submit(fake_slurm, "trainer=cpu_debug")
    script = (fake_slurm / "job.sbatch").read_text()
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --requeue" in script
    pickle = fake_slurm / "sweep" / "slurm" / f"{JOB_ID}_submitted.pkl"
    job = submitit.helpers.DelayedSubmission.load(pickle).function
    assert isinstance(job, sweep.SlurmPoint) and job.run_dir == run_dir and job.grace_s == 120
    forwarded = next(a for a in job.command if a.startswith("--signals-to-handle="))
    assert {"SIGTERM", "SIGUSR1", "SIGUSR2"} <= set(forwarded.split("=")[1].split(","))


@pytest.mark.slow
@pytest.mark.distributed
def test_a_preempted_sweep_point_requeues_and_resumes_to_the_end(fake_slurm):
    """The whole chain: SIGUSR2 to the job's processes (as SLURM sends it) reaches the trainer
    through torchrun, the trainer checkpoints, the job requeues; the requeued job finishes."""
    tiny = [o for o in TINY if not o.startswith("+model=")]  # the sweep names the model
    run_dir = submit(
        fake_slurm, *tiny, "trainer.max_steps=12", "trainer.save_every=0", "trainer.eval_every=0"
    )
    env = {
        **os.environ,
        "SUBMITIT_EXECUTOR": "slurm",
        "PYTHONPATH": str(ROOT),  # the job unpickles repro.sweep.SlurmPoint
        "OMP_NUM_THREADS": "1",
    }
    job = [sys.executable, "-u", "-m", "submitit.core._submit", str(fake_slurm / "sweep" / "slurm")]
    first = subprocess.Popen(job, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and '"step": 3,' in metrics.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, "no step 3"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGUSR2)  # SLURM signals every process of the job step
    assert first.wait(timeout=300) == 0
    assert scontrol_calls(fake_slurm) == [f"requeue {JOB_ID}"]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert len(saved) == 1 and not (run_dir / "summary.json").exists()

    second = subprocess.run(job, env=env, stdout=subprocess.DEVNULL, timeout=600)  # requeued
    assert second.returncode == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 12
    assert scontrol_calls(fake_slurm) == [f"requeue {JOB_ID}"]
