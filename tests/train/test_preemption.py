"""train/preemption.py: stop signals are recorded, not fatal; the per-step verdict agrees on all ranks."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from train.distributed import shutdown
from train.preemption import (
    ABORTED_EXIT_STATUS,
    CTRL_C_ANSWERS,
    PREEMPTED_EXIT_STATUS,
    STOP_SIGNALS,
    StopAborted,
    StopAndSave,
    Verdict,
    ignore_stop_signals,
    install_stop_signals,
    received_signal,
    shut_down_keeping_exit_status,
)

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stop_signals_installed():
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    install_stop_signals()
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_exit_status_is_none_of_the_others():
    assert PREEMPTED_EXIT_STATUS not in (0, 1, 2, 3) and 0 < PREEMPTED_EXIT_STATUS < 128


def test_stop_signals_are_recorded_and_the_first_one_wins(stop_signals_installed):
    assert received_signal() is None
    os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs before os.kill returns to Python
    assert received_signal() is signal.SIGUSR1
    os.kill(os.getpid(), signal.SIGTERM)  # a second signal: still alive, the first one stands
    assert received_signal() is signal.SIGUSR1


def test_ctrl_c_stops_like_sigterm_then_waits_then_aborts(stop_signals_installed, capfd):
    """One line per press: stop with a checkpoint, wait for it, abort without it; torchrun's
    SIGTERM in between (its answer to Ctrl-C) is no press."""
    os.kill(os.getpid(), signal.SIGINT)
    assert received_signal() is signal.SIGINT
    assert capfd.readouterr().err.strip() == CTRL_C_ANSWERS[0]
    os.kill(os.getpid(), signal.SIGTERM)
    assert capfd.readouterr().err == ""
    os.kill(os.getpid(), signal.SIGINT)
    assert capfd.readouterr().err.strip() == CTRL_C_ANSWERS[1]
    with pytest.raises(StopAborted, match="no checkpoint of this stop was kept"):
        os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)  # a fourth, while aborting: ignored
    assert received_signal() is signal.SIGINT
    assert str(PREEMPTED_EXIT_STATUS) in CTRL_C_ANSWERS[0]
    assert ABORTED_EXIT_STATUS == 130


def test_install_forgets_earlier_signals(stop_signals_installed):
    os.kill(os.getpid(), signal.SIGUSR2)
    install_stop_signals()
    assert received_signal() is None


def test_without_signal_or_interval_the_run_goes_on(stop_signals_installed):
    clock = FakeClock()
    stopper = StopAndSave(0, CPU, clock=clock)
    clock.now += 1e6
    assert stopper.poll() == Verdict(stop_signal=None, save=False)


def test_wall_clock_save_is_due_once_per_interval(stop_signals_installed):
    clock = FakeClock()
    stopper = StopAndSave(2, CPU, clock=clock)  # minutes
    clock.now += 119.9
    assert not stopper.poll().save
    clock.now += 0.1
    assert stopper.poll() == Verdict(stop_signal=None, save=True)
    stopper.checkpoint_saved()
    clock.now += 60
    assert not stopper.poll().save  # a save (wall-clock or step-based) restarts the interval
    clock.now += 60
    assert stopper.poll().save


def test_a_signal_stops_with_a_save(stop_signals_installed):
    stopper = StopAndSave(60, CPU, clock=FakeClock())
    os.kill(os.getpid(), signal.SIGTERM)
    assert stopper.poll() == Verdict(stop_signal=signal.SIGTERM, save=True)


def _two_ranks(rank: int, init_file: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    install_stop_signals()
    clock = FakeClock()
    stopper = StopAndSave(1, CPU, clock=clock)
    verdicts = [stopper.poll()]  # step 1: nothing anywhere
    if rank == 0:
        clock.now += 60  # only rank 0's clock says a save is due
    verdicts.append(stopper.poll())
    stopper.checkpoint_saved()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGUSR2)  # only rank 1 is signalled
    verdicts.append(stopper.poll())
    results[rank] = verdicts
    shutdown()


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_agree_on_a_signal_or_a_due_save_seen_by_one(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_two_ranks, args=(str(tmp_path / "init"), results), nprocs=2)
    expected = [
        Verdict(stop_signal=None, save=False),
        Verdict(stop_signal=None, save=True),
        Verdict(stop_signal=signal.SIGUSR2, save=True),
    ]
    assert results[0] == results[1] == expected


EXIT_DECIDED = """
import sys
from train.preemption import ignore_stop_signals, install_stop_signals
install_stop_signals()
{ignore}
print("exiting", flush=True)
sys.exit(75)
"""


def exit_status_under_ctrl_c(ignore: str) -> int:
    """A process that exits with 75 while Ctrl-C keeps arriving until it is gone, so that some
    presses land in interpreter shutdown, after Python has reset its handlers."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EXIT_DECIDED.format(ignore=ignore)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout.readline() == b"exiting\n"
    while proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            break
    return proc.wait()


def test_signals_after_the_exit_status_is_decided_leave_it_as_it_is():
    assert {exit_status_under_ctrl_c("ignore_stop_signals()") for _ in range(5)} == {75}


def test_ignoring_the_stop_signals_ignores_them_in_this_process(stop_signals_installed):
    ignore_stop_signals()
    os.kill(os.getpid(), signal.SIGINT)
    assert received_signal() is None
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in STOP_SIGNALS)


def test_a_third_ctrl_c_during_the_shutdown_only_cuts_it_short(stop_signals_installed, capfd):
    pressed = []

    def shutdown() -> None:
        for press in range(1, len(CTRL_C_ANSWERS) + 2):
            os.kill(os.getpid(), signal.SIGINT)  # the third press raises StopAborted here
            pressed.append(press)
        pytest.fail("the third Ctrl-C did not interrupt the shutdown")

    shut_down_keeping_exit_status(shutdown)
    assert pressed == list(range(1, len(CTRL_C_ANSWERS) + 1))
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in STOP_SIGNALS)
