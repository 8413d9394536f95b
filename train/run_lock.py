"""One writer per run directory: ``<run_dir>/run.lock`` names the process (pid, host) that trains
in it, so a second launch on a live run refuses in one line instead of writing the same
checkpoints and metrics.

A lock whose holder is gone is stale and taken over with a warning: on the same host, its pid
(with its start time) no longer runs; on another host (where a pid says nothing), it is this
very job's earlier attempt (a SLURM job requeued after a lost node keeps its id, a restarted
torchrun its run id), or its holder stopped refreshing the file's time: a live holder touches
it every ``HEARTBEAT_S`` from a background thread, so a lock untouched for ``STALE_AFTER_S`` is a
dead node's. A process killed by SIGKILL or a lost node leaves its lock behind; the next launch
sees that it is stale.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from train.errors import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 15 * 60.0
"""Fifteen heartbeats missed: a holder that slow is gone (a GIL held for minutes is not a live
run's pattern), and a requeued job waits at most this long for a lost node's lock."""


def _job_id() -> str | None:
    """The scheduler's job this process belongs to: a requeued SLURM job keeps its id, a torchrun
    restart its run id, so a lock of the same job is an earlier attempt's, whatever its host."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started (Linux's ``/proc``; None elsewhere or when it is gone): a pid reused
    by another process after a restart has another start time."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _holder_runs(holder: dict) -> bool:
    pid = int(holder["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    started = holder.get("start")
    return started is None or _start_ticks(pid) in (None, started)


class RunLock:
    """The held lock; :meth:`release` (``release_held`` at interpreter exit) removes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-lock", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the run directory's lock, or raise ``ConfigError`` naming its live holder."""
        path = Path(run_dir) / LOCK_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "start": _start_ticks(os.getpid()),
            "job": _job_id(),
        }
        for _ in range(3):  # a lost race with another launch is decided by O_EXCL
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read(path)
                if not _is_stale(path, holder):
                    who = (
                        "another launch"
                        if holder is None
                        else (f"pid {holder['pid']} on {holder['host']}")
                    )
                    raise ConfigError(
                        f"run dir {path.parent} is in use by {who} (its {LOCK_FILE}); wait for "
                        "that run to end or use another hydra.run.dir"
                    ) from None
                log.warning("taking over a stale %s (%s)", path, holder or "unreadable")
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            global _held
            _held = cls(path)
            return _held
        raise ConfigError(
            f"run dir {path.parent}: could not take {LOCK_FILE}; another launch races"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        holder = _read(self.path)
        if holder is not None and holder["pid"] == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


_held: RunLock | None = None


@atexit.register
def release_held() -> None:
    """Release this process's lock, if it holds one: at exit, or before a refused run takes
    back the directory it made (``train/cli_errors.py``)."""
    if _held is not None:
        _held.release()


def _read(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) and {"pid", "host"} <= holder.keys() else None
    except (OSError, ValueError):
        return None


def _is_stale(path: Path, holder: dict | None) -> bool:
    """Whether the lock's holder is gone. An unreadable lock is another launch's that has not
    written it yet, unless it is older than a few seconds."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    if holder is None:
        return age > 10.0
    if holder["host"] == socket.gethostname():
        return not _holder_runs(holder)
    if holder.get("job") is not None and holder.get("job") == _job_id():
        return True  # this job's earlier attempt on another node (a requeue after a lost node)
    return age > STALE_AFTER_S
