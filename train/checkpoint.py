"""Atomic, last-k, resharding checkpoints of the full training state in
``<run_dir>/checkpoints/step_XXXXXXXX``.

What a checkpoint holds is defined once, by ``contents``: one ``Stateful`` object per part, all
saved and loaded by ``torch.distributed.checkpoint`` (DCP) in one call (as torchtitan does), into
``.metadata`` plus ``__<rank>_0.distcp`` files:

* ``model`` and ``optimizer``: every rank writes its own shards in parallel (under DDP, DCP writes
  each replicated tensor once); the state dicts come from ``get_model_state_dict`` /
  ``get_optimizer_state_dict``, keyed by parameter name with global shapes, so a checkpoint saved
  on N ranks loads on M ranks, with ``ddp`` or ``fsdp`` (DCP reshards on load);
* ``scheduler`` and ``train_state`` (``TrainState``), the same on every rank;
* ``data`` and ``rng``: every rank's train-loader position and RNG states, gathered, so that a
  run on another world size can re-derive its own.

The last four are stored as one value each (``Whole``): their structure (the evaluation history,
one entry per saved rank) is not known to the run that loads them. Beside the shards,
``meta.json`` (step, tokens, world size, git sha) is for humans and tools.

DCP's collectives run on the slow-I/O group (``train.distributed.slow_io_group``: gloo, a timeout
of hours), so a save or load on slow shared storage is not ended by NCCL's 10-minute watchdog.

Atomic: every rank writes into one hidden temporary directory; after a barrier rank 0 adds
``meta.json``, flushes it and renames the directory to its final name (a directory rename is
atomic on POSIX). A process killed mid-save leaves at most a stale ``.tmp_*`` directory, which
is never mistaken for a checkpoint and is removed on the next save.

Resuming on another world size: model and optimizer reshard; the data position is re-derived by
``train.data_position.rederive_position`` (or refused with the reason); each rank's RNG state is
that of the saved rank with its number, rank 0's for ranks the saved run did not have.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from train import distributed as dist
from train.errors import ConfigError
from train.seeding import rng_state, set_rng_state
from train.state import TrainState
from train.summary import git_sha

log = logging.getLogger(__name__)

DCP_METADATA = ".metadata"
META_FILE = "meta.json"
OLDER_FORMAT_FILE = "trainer.pt"
"""Where checkpoints before ``contents`` kept the non-tensor state: such a run is refused with
the commit to resume it with (this format reads only itself)."""
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint directory (DCP's metadata and ``meta.json``)."""
    return all((Path(path) / name).is_file() for name in (DCP_METADATA, META_FILE))


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, path), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def find_resume_checkpoint(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint ``trainer.resume`` points at.

    ``auto``: the run directory's newest checkpoint, or None for a fresh start; ``none``/null:
    always fresh; anything else: a checkpoint directory, or a run directory whose newest
    checkpoint is used (it must exist).
    """
    if resume is None or str(resume).lower() in ("none", "null", "false", ""):
        return None
    if resume == "auto":
        found = list_checkpoints(checkpoint_root(run_dir))
        return found[-1][1] if found else None
    path = Path(resume)
    if is_complete(path):
        return path
    for root in (path, checkpoint_root(path)):
        found = list_checkpoints(root)
        if found:
            return found[-1][1]
    raise ConfigError(
        f"trainer.resume={resume}: no complete checkpoint there; give a checkpoint or run "
        "directory, auto (this run's newest, else a fresh start) or null (always fresh)"
    )


class Positions(Protocol):
    """The train loader as a checkpoint sees it (``train.data.TrainLoader``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_positions(self, positions: list[dict[str, Any]]) -> None: ...


@dataclass
class Resumable:
    """The live objects a checkpoint saves and restores, besides the ``TrainState``."""

    model: torch.nn.Module
    """The bare model (sharded in place under FSDP2, never the DDP wrapper)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Positions
    """The train loader: ``state_dict()`` is its position, per rank."""


@dataclass
class ModelState:
    """The model's weights, keyed by parameter name with global shapes (each rank its shards)."""

    model: nn.Module

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


@dataclass
class OptimizerState:
    """The optimizer's state and groups, keyed by parameter name (each rank its shards)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


@dataclass
class DataPositions:
    """Every rank's train-loader position (gathered: a collective), so that a run on another
    world size can re-derive its own, or refuse with the reason."""

    loader: Positions
    world_size: int

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": dist.all_gather_object(self.loader.state_dict(), slow_io=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        positions = state_dict["ranks"]
        try:
            self.loader.load_positions(positions)
        except ValueError as err:
            raise ConfigError(
                f"trainer.resume: the checkpoint was written by {len(positions)} rank(s), this "
                f"run has {self.world_size}; the data position cannot be carried over: {err}"
            ) from None
        if len(positions) != self.world_size:
            log.info("checkpoint of %d rank(s) resumed on %d", len(positions), self.world_size)


@dataclass
class RngStates:
    """Every rank's RNG states (gathered); a rank resumes the saved rank's with its number,
    rank 0's where the saved run had fewer ranks."""

    rank: int

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": dist.all_gather_object(rng_state(), slow_io=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["ranks"]
        set_rng_state(saved[self.rank] if self.rank < len(saved) else saved[0])


@dataclass
class RunCounters:
    """The ``TrainState``; its world size stays this run's (the data position says the saved one)."""

    state: TrainState

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state.load_state_dict({**state_dict, "world_size": self.state.world_size})


@dataclass
class Whole:
    """``part``'s state dict stored by DCP as one value (pickled), not split into entries: the
    run that loads it cannot know its structure (list lengths) beforehand, and DCP loads only
    the entries that the loading side already has."""

    part: Stateful

    def state_dict(self) -> dict[str, Any]:
        return {"whole": (self.part.state_dict(),)}  # a tuple is one value to DCP

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.part.load_state_dict(state_dict["whole"][0])


def contents(live: Resumable, state: TrainState, *, rank: int) -> dict[str, Stateful]:
    """What a checkpoint holds, by key: saved and restored from this one definition."""
    return {
        "model": ModelState(live.model),
        "optimizer": OptimizerState(live.model, live.optimizer),
        "scheduler": Whole(live.scheduler),
        "train_state": Whole(RunCounters(state)),
        "data": Whole(DataPositions(live.loader, state.world_size)),
        "rng": Whole(RngStates(rank)),
    }


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every call without a process group; one process is a use it supports."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _dcp_options() -> dict[str, Any]:
    """One process: no collectives; several: DCP's on the slow-I/O group."""
    if not dist.is_initialized():
        return {"no_dist": True}
    return {"process_group": dist.slow_io_group()}


def save_training_state(
    run_dir: Path, live: Resumable, state: TrainState, *, rank: int, keep_last: int
) -> Path | None:
    """Checkpoint the run; every rank calls this. Returns the path on rank 0.

    ``keep_last <= 0`` keeps every checkpoint.
    """
    root = checkpoint_root(run_dir)
    final = root / f"step_{state.step:08d}"
    tmp = root / f".tmp_step_{state.step:08d}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp_*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    dist.barrier_for_slow_io()  # rank 0 has made the temporary directory
    with _single_process_quiet():
        dcp.save(contents(live, state, rank=rank), checkpoint_id=tmp, **_dcp_options())
    path = None
    if rank == 0:
        meta = {
            "step": state.step,
            "tokens": state.tokens,
            "world_size": state.world_size,
            "git_sha": git_sha(),
        }
        with open(tmp / META_FILE, "wb") as f:
            f.write(json.dumps(meta, indent=2).encode())
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        if final.exists():  # re-saving a step (e.g. a resumed run that had already finished)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)
        if keep_last > 0:
            for _, old in list_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        path = final
    dist.barrier_for_slow_io()  # rank 0's files and renames may take a while
    return path


def restore_training_state(path: Path, live: Resumable, state: TrainState, *, rank: int) -> None:
    """Load what ``save_training_state`` wrote into the run's live objects (every rank calls
    this), on this run's world size and parallelism."""
    if (Path(path) / OLDER_FORMAT_FILE).is_file():
        sha = json.loads((Path(path) / META_FILE).read_text()).get("git_sha", "unknown")
        raise ConfigError(
            f"trainer.resume: {path} is in the older format ({OLDER_FORMAT_FILE} beside the "
            f"shards); resume it with the code that wrote it (git {sha}), or start afresh"
        )
    with _single_process_quiet():
        dcp.load(contents(live, state, rank=rank), checkpoint_id=path, **_dcp_options())


def load_model_weights(path: Path, model: nn.Module) -> nn.Module:
    """Load a checkpoint's model weights into the unsharded ``model`` (one process, any world size
    the checkpoint was written with): the consolidation that exports and scripts use."""
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint directory")
    weights = {"model": model.state_dict()}
    with _single_process_quiet():
        dcp.load(weights, checkpoint_id=path, no_dist=True)
    model.load_state_dict(weights["model"])
    return model


def saved_model_dtype(path: Path) -> torch.dtype:
    """The dtype the checkpoint's model weights were saved in (read from the DCP metadata)."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    tensors = (
        m for key, m in metadata.items() if key.startswith("model.") and hasattr(m, "properties")
    )
    return next(tensors).properties.dtype


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU (every rank calls this: under FSDP2 it all-gathers;
    rank 0 gets them, the other ranks an empty dict)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
