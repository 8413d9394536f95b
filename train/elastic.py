"""What a run needs to survive ``torchrun --max-restarts N``: process groups that form again in the
restarted workers, and a run directory that stays the same across restarts.

**A fresh store per attempt.** torchrun's agents share one TCPStore with their workers for the
whole job (``TORCHELASTIC_USE_AGENT_STORE=True``, torch's default since 2.4), and torch's ``env://``
rendezvous uses it without a per-attempt prefix. Gloo and NCCL publish each rank's address under
fixed keys, so the restarted workers read the *dead* workers' addresses from the first attempt
and fail (gloo: ``connectFullMesh failed ... Connection refused``; pytorch/pytorch#135712, still
open). ``TORCHELASTIC_RESTART_COUNT`` is no fix on several nodes: each agent counts its own
restarts, and an agent whose workers were healthy restarts them without counting. So here global
rank 0 hosts a new TCPStore of its own in every attempt and publishes its address and a random
nonce under one key of the agent's store; the other ranks read that key until it names a store
that answers with that nonce (a stale address is dead, or answers with another nonce).

**One run directory per job.** The default ``hydra.run.dir`` is time-stamped, so a restarted
worker would start a new run beside the old one. Under torchrun it is keyed on the job's
rendezvous id instead (``--standalone`` draws one per launch; SLURM jobs pass
``--rdzv-id=$SLURM_JOB_ID``), which every restart of the job shares (:func:`run_stamp`).
torchrun's own default id, ``none``, is shared by every job that does not name one, so with
restarts on and no ``hydra.run.dir`` that combination is refused before any step
(:func:`check_restartable`).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import datetime, timedelta

import torch.distributed as dist
from omegaconf import OmegaConf

from train.errors import ConfigError

BOOTSTRAP_KEY = "foam/attempt_store"
"""The agent-store key under which rank 0 publishes ``host:port:nonce`` of its fresh store."""
_NONCE_KEY = "foam/nonce"
_PROBE = timedelta(seconds=5)
"""How long a rank tries one published address before it reads the key again."""
TORCHRUN_DEFAULT_RUN_ID = "none"


def uses_agent_store() -> bool:
    """Whether this worker was started by torchrun with the agent's shared store."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def attempt_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """A store no earlier attempt of this job has written to, the same on every rank: rank 0's
    own, found through the agent's store (module docstring)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = dist.TCPStore(host, port, world_size=None, is_master=False, timeout=timeout)
    if rank == 0:
        nonce = uuid.uuid4().hex
        own = dist.TCPStore(
            host, 0, world_size=world_size, is_master=True, wait_for_workers=False, timeout=timeout
        )
        own.set(_NONCE_KEY, nonce)
        agent.set(BOOTSTRAP_KEY, f"{host}:{own.port}:{nonce}")
        return own
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        address, port_text, nonce = agent.get(BOOTSTRAP_KEY).decode().rsplit(":", 2)
        if _listening(address, int(port_text)):  # a dead attempt's store: read the key again
            try:
                own = dist.TCPStore(address, int(port_text), is_master=False, timeout=_PROBE)
                if own.get(_NONCE_KEY).decode() == nonce:
                    own.set_timeout(timeout)
                    return own
            except (RuntimeError, dist.DistStoreError):
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0's store of this attempt was not found within {timeout}")
        time.sleep(0.5)


def _listening(host: str, port: int) -> bool:
    """Whether something accepts connections at ``host:port`` (checked with a plain socket: a
    TCPStore client retries a dead address for its whole timeout, logging each try)."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE.total_seconds()):
            return True
    except OSError:
        return False


def run_stamp() -> str:
    """The default run directory's distinguishing part: the torchrun job's rendezvous id (the
    same in every restart of the job), else the launch time."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != TORCHRUN_DEFAULT_RUN_ID:
        return run_id
    return datetime.now().strftime("%Y%m%d-%H%M%S")


RUN_STAMP_RESOLVER = "run_stamp"


def register_run_stamp() -> None:
    """``${run_stamp:}`` for ``configs/config.yaml``'s default run directory."""
    OmegaConf.register_new_resolver(RUN_STAMP_RESOLVER, run_stamp, replace=True)


def check_restartable(run_dir_given: bool) -> None:
    """Refuse a torchrun job with restarts whose restarted workers could not find their run: the
    default run directory and torchrun's shared default rendezvous id."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts > 0 and not run_dir_given and run_stamp() != os.environ.get("TORCHELASTIC_RUN_ID"):
        raise ConfigError(
            f"torchrun --max-restarts {restarts} without hydra.run.dir: a restart could not find "
            "this run's directory; pass hydra.run.dir=<dir>, or give torchrun --rdzv-id=<job id> "
            "(or --standalone)"
        )
