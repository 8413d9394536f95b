"""Atomic, last-k checkpoints of the full training state in ``<run_dir>/checkpoints/step_XXXXXXXX``.

What a checkpoint holds is defined once, by ``save_training_state`` and ``restore_training_state``:
``model``, ``optimizer``, ``scheduler`` (their state dicts), ``data`` and ``rng`` (one entry per
rank: the train loader's position and the RNG states) and ``train_state`` (``TrainState``:
step, tokens, times, eval history, logger run id, world size). ``meta.json`` next to it repeats
the step, tokens and git sha for humans and tools.

A checkpoint is written into a hidden temporary directory, flushed to disk and only then renamed
to its final name (a directory rename is atomic on POSIX). A process killed mid-save leaves at
most a stale ``.tmp_*`` directory, which is never mistaken for a checkpoint and is removed on
the next save; the previous checkpoint stays valid.

Checkpoints hold only tensors and plain Python values, so they load with
``torch.load(weights_only=True)``; optimizers that pickle helper objects in their state fall back
to a full unpickle of the run's own file, with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train import distributed as dist
from train.config import ConfigError
from train.seeding import rng_state, set_rng_state
from train.state import TrainState
from train.summary import git_sha

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
META_FILE = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, path), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file() and (child / META_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def save_checkpoint(
    run_dir: Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep_last: int
) -> Path:
    """Write ``state`` (torch.save) and ``meta`` (JSON, for humans and tools) atomically.

    Call on the main rank only. ``keep_last <= 0`` keeps every checkpoint.
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp_*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}"
    tmp.mkdir()
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    with open(tmp / META_FILE, "w") as f:
        json.dump({"step": step, **meta}, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. a resumed run that had already finished)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last > 0:
        for _, old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """The state saved by ``save_checkpoint`` in directory ``path``."""
    file = Path(path) / STATE_FILE
    try:  # mmap: every rank reads a 7B checkpoint without holding a copy of it in host memory
        return torch.load(file, map_location=map_location, weights_only=True, mmap=True)
    except Exception as err:  # pickle.UnpicklingError for objects outside the weights-only set
        log.warning(
            "weights_only load of %s failed (%s); loading the run's own file in full", file, err
        )
        return torch.load(file, map_location=map_location, weights_only=False)


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
    if (path / STATE_FILE).is_file():
        return path
    for root in (path, checkpoint_root(path)):
        found = list_checkpoints(root)
        if found:
            return found[-1][1]
    raise FileNotFoundError(f"trainer.resume={resume!r}: no checkpoint found there")


@dataclass
class Resumable:
    """The live objects a checkpoint saves and restores, besides the ``TrainState``."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any
    """The train loader: ``state_dict()`` is its position, per rank."""


def save_training_state(
    run_dir: Path, live: Resumable, state: TrainState, *, rank: int, keep_last: int
) -> Path | None:
    """Checkpoint the run (every rank calls this; rank 0 writes). Returns the path on rank 0."""
    data = dist.all_gather_object(live.loader.state_dict())
    rngs = dist.all_gather_object(rng_state())
    path = None
    if rank == 0:
        contents = {
            "model": live.model.state_dict(),
            "optimizer": live.optimizer.state_dict(),
            "scheduler": live.scheduler.state_dict(),
            "data": data,
            "rng": rngs,
            "train_state": state.state_dict(),
        }
        meta = {"tokens": state.tokens, "git_sha": git_sha()}
        path = save_checkpoint(run_dir, state.step, contents, meta, keep_last=keep_last)
    dist.barrier_for_slow_io()
    return path


def saved_train_state(contents: dict[str, Any]) -> dict[str, Any]:
    """The counters of a checkpoint; ones written before ``TrainState`` kept them at top level."""
    if "train_state" in contents:
        return contents["train_state"]
    return {f.name: contents[f.name] for f in dataclasses.fields(TrainState)}


def restore_training_state(path: Path, live: Resumable, state: TrainState, *, rank: int) -> None:
    """Load what ``save_training_state`` wrote into the run's live objects."""
    contents = load_checkpoint(path)
    saved = saved_train_state(contents)
    saved_world = saved["world_size"]
    if saved_world != state.world_size:
        raise ConfigError(
            f"trainer.resume: {path} was written by {saved_world} rank(s), this run has "
            f"{state.world_size}; the data position is per rank"
        )
    live.model.load_state_dict(contents["model"])
    live.optimizer.load_state_dict(contents["optimizer"])
    live.scheduler.load_state_dict(contents["scheduler"])
    live.loader.load_state_dict(contents["data"][rank])
    set_rng_state(contents["rng"][rank])
    state.load_state_dict(saved)
