"""Ctrl-C on a running trainer: the stop is a preemption (a checkpoint and exit 75), and the same
command resumes."""

import signal

from tests.helpers.cli import checkpoint_steps, command, logged_steps, run, stop_with
from train.preemption import CTRL_C_ANSWERS, PREEMPTED_EXIT_STATUS


def test_ctrl_c_on_a_run_saves_exits_75_and_the_rerun_resumes(tmp_path):
    """Ctrl-C twice on a running llama_tiny: the step finishes, its checkpoint is written, exit
    75; the same command resumes from it.

    The second press lands 0.2 s after the first: while the stop is handled (it prints the second
    answer) or, when llama_tiny's checkpoint is quicker than that, after the exit status is
    decided (ignored). Either way it must not change the status; the second answer's wording is
    checked in tests/train/test_preemption.py."""
    run_dir = tmp_path / "run"
    overrides = ("trainer.max_steps=40", "trainer.save_every=0", "trainer.eval_every=0")
    cmd = command(run_dir, *overrides, optim="adamw")
    stopped = stop_with(cmd, run_dir, signal.SIGINT, at_step=2)
    assert stopped.returncode == PREEMPTED_EXIT_STATUS, stopped.stderr[-4000:]
    last = logged_steps(run_dir)
    assert checkpoint_steps(run_dir) == [last] and last < 40
    assert CTRL_C_ANSWERS[0] in stopped.stderr
    assert f"stopped: SIGINT at step {last}" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert "data=embedded: the embedded corpus" in stopped.stdout.splitlines()[0]
    resumed = run(cmd)
    assert f"resumed from {run_dir / 'checkpoints'}" in resumed.stdout + resumed.stderr
    assert (run_dir / "summary.json").exists()
