"""Stop a run cleanly when the cluster asks, and checkpoint by wall clock.

Clusters stop jobs with a signal: SLURM sends SIGTERM on preemption and at the time limit (and
SIGUSR1/SIGUSR2 ahead of it when the job asked with ``--signal``), then SIGKILL some 30-120 s
later; torchrun forwards SIGTERM (and whatever its ``--signals-to-handle`` lists) to every worker
and SIGKILLs them after its shutdown timeout. Here those signals are only recorded
(``install_stop_signals``). The training loop calls ``StopAndSave.poll`` on every rank at the
steps where it reads its step statistics anyway (every ``trainer.log_every`` steps, and before
every evaluation and save: ``train/pretrain.py``), since polling is a host sync the other steps
avoid; so a stop lands at most ``log_every`` steps after the signal, which SLURM's ``--signal``
lead time must cover. One small all-reduce agrees on the answer (a signal on any rank stops all
of them; a wall-clock save is due when any rank's clock says so), so all ranks finish the same
step, save together and exit with ``PREEMPTED_EXIT_STATUS``. A second signal during that save is recorded
and changes nothing; the save is atomic anyway (``train/checkpoint.py``): complete or absent.

Ctrl-C (SIGINT) is how a person stops a run, so it is a stop signal too, with one line on stderr at
each press: the first stops the run like SIGTERM, the second is told the save is being waited for,
and the third aborts (``StopAborted``, exit ``ABORTED_EXIT_STATUS``) without a checkpoint: a save
it interrupts leaves only a ``.tmp_*`` directory, which is never resumed from and is removed by the
next save. Only presses count: torchrun answers Ctrl-C by sending its workers SIGTERM, which must
not count as a second press.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import torch

from train.distributed import all_reduce_max

# sysexits.h EX_TEMPFAIL ("temporary failure, retry later"): the run stopped on a signal after
# writing a checkpoint; rerunning the same command resumes it. Distinct from 0 (finished),
# 1 (crash), 2 (config error) and 3 (divergence). torchrun turns any failed worker into its own
# status 1 (listing the workers' statuses), so scripts/sweep.py goes by the signal its job got.
PREEMPTED_EXIT_STATUS = 75
# 128 + SIGINT, what a shell reports for a process Ctrl-C killed: the run was stopped, not saved.
ABORTED_EXIT_STATUS = 128 + signal.SIGINT
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
CTRL_C_ANSWERS = (
    f"Ctrl-C: the run stops after this step (at most trainer.log_every steps), saves a checkpoint "
    f"and exits with status {PREEMPTED_EXIT_STATUS}; Ctrl-C twice more aborts without it",
    "Ctrl-C: waiting for the checkpoint to finish; Ctrl-C once more aborts without it",
)
"""The line printed at the first and at the second press; the third aborts."""

_received: list[int] = []  # signal numbers recorded since install_stop_signals()


class RunPreempted(Exception):
    """Raised once the checkpoint is written and the logs are flushed; the entry point exits with
    ``PREEMPTED_EXIT_STATUS``."""


class StopAborted(BaseException):
    """The third Ctrl-C: raised wherever the main thread is, like ``KeyboardInterrupt`` (whose
    place it takes, so that ``except Exception`` on the way out cannot swallow it); the entry
    point exits with ``ABORTED_EXIT_STATUS``."""

    def __str__(self) -> str:
        return (
            "aborted by a third Ctrl-C: no checkpoint of this stop was kept (a save it "
            "interrupted is incomplete and is discarded); rerunning resumes from the last one"
        )


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if signum != signal.SIGINT:
        return
    presses = _received.count(signal.SIGINT)
    if presses > len(CTRL_C_ANSWERS) + 1:
        return  # already aborting: let it finish
    if presses > len(CTRL_C_ANSWERS):
        raise StopAborted
    # os.write, not print: the handler may run in the middle of another write to stderr (the
    # progress bar's), which a buffered stream refuses as a reentrant call.
    os.write(2, f"\n{CTRL_C_ANSWERS[presses - 1]}\n".encode())


def install_stop_signals(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Record ``signals`` instead of dying of them, for the rest of the process.

    Never uninstalled: a second signal while the checkpoint is written or the logs are flushed
    must not turn the documented exit status into a death by signal (``ignore_stop_signals``
    covers what comes after).
    Signal handlers are per process, so the record is too (``received_signal``). Call from the
    main thread (Python's rule for ``signal.signal``).
    """
    _received.clear()
    for sig in signals:
        signal.signal(sig, _record)


def ignore_stop_signals(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Ignore ``signals`` from here to the end of the process: call once its exit status is
    decided (the checkpoint written, the process group shut down).

    Recording them is not enough that late: interpreter shutdown resets every Python-level
    handler to the default action, so a second Ctrl-C landing there would still kill the process
    with SIGINT and hide the saved checkpoint's exit status. A handler set to ``SIG_IGN`` is the
    one kind shutdown leaves in place.
    """
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def shut_down_keeping_exit_status(shutdown: Callable[[], None]) -> None:
    """Run ``shutdown`` (the process group's teardown) once the exit status is decided, then
    ignore the stop signals to the end of the process (``ignore_stop_signals``).

    A third Ctrl-C during the teardown raises ``StopAborted``, which would replace the decided
    status (a kept checkpoint's ``PREEMPTED_EXIT_STATUS``, a finished run's 0) with a traceback
    and a message that no checkpoint was kept; here it only cuts the teardown short, which the
    process's exit completes anyway.
    """
    with contextlib.suppress(StopAborted):
        shutdown()
    ignore_stop_signals()


def received_signal() -> signal.Signals | None:
    """The first stop signal this process received since ``install_stop_signals``, if any."""
    return signal.Signals(_received[0]) if _received else None


@dataclass(frozen=True)
class Verdict:
    """What every rank does after the step it just finished."""

    stop_signal: signal.Signals | None = None
    """Set when the run must stop: the signal (the highest-numbered one if ranks got several)."""
    save: bool = False
    """A checkpoint is due: the wall-clock interval passed, or the run stops."""


class StopAndSave:
    """The per-step question "save now? stop now?", answered the same way on every rank.

    ``save_every_minutes`` <= 0 turns wall-clock checkpoints off (signals still stop the run).
    ``checkpoint_saved`` restarts the interval after any save, step-based ones included.
    """

    def __init__(
        self,
        save_every_minutes: float,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = save_every_minutes * 60.0
        self._device = device
        self._clock = clock
        self._last_save = clock()

    def checkpoint_saved(self) -> None:
        self._last_save = self._clock()

    def poll(self) -> Verdict:
        """Collective: every rank calls it after the same optimizer steps (one all-reduce of two
        integers, on the device so that NCCL can carry it)."""
        due = self._interval_s > 0 and self._clock() - self._last_save >= self._interval_s
        sig = received_signal()
        flags = torch.tensor([int(sig or 0), int(due)], dtype=torch.int64, device=self._device)
        signum, save = all_reduce_max(flags).tolist()
        stop = signal.Signals(signum) if signum else None
        return Verdict(stop_signal=stop, save=bool(save) or stop is not None)
