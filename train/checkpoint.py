"""Atomic, last-k, resharding checkpoints of the full training state in
``<run_dir>/checkpoints/step_XXXXXXXX``.

What a checkpoint holds is defined once, by ``save_training_state`` and ``restore_training_state``:

* the model and the optimizer, as a ``torch.distributed.checkpoint`` (DCP) checkpoint
  (``.metadata`` plus ``__<rank>_0.distcp`` files): every rank writes its own shards in parallel
  (under DDP, DCP writes each replicated tensor once), and the state dicts come from
  ``get_state_dict``, keyed by parameter name with global shapes, so a checkpoint saved on N
  ranks loads on M ranks, with ``ddp`` or ``fsdp`` (``set_state_dict`` reshards on load);
* ``trainer.pt`` (rank 0, ``torch.save`` of plain values): the scheduler, ``data`` and ``rng``
  (one entry per rank: the train loader's position and the RNG states) and ``train_state``
  (``TrainState``);
* ``meta.json``: the step, tokens, world size and git sha, for humans and tools.

Atomic: every rank writes into one hidden temporary directory; after a barrier rank 0 adds
``trainer.pt`` and ``meta.json``, flushes them and renames the directory to its final name (a
directory rename is atomic on POSIX). A process killed mid-save leaves at most a stale ``.tmp_*``
directory, which is never mistaken for a checkpoint and is removed on the next save.

Resuming on another world size: model and optimizer reshard; the data position is re-derived by
``train.data.rederive_position`` (or refused with the reason); each rank's RNG state is that of
the saved rank with its number, rank 0's for ranks the saved run did not have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from train import distributed as dist
from train.config import ConfigError
from train.seeding import rng_state, set_rng_state
from train.state import TrainState
from train.summary import git_sha

log = logging.getLogger(__name__)

DCP_METADATA = ".metadata"
TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"
LEGACY_FILE = "state.pt"
"""The single-file format before DCP; such checkpoints still resume (``_restore_legacy``)."""
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
    """Whether ``path`` is a finished checkpoint directory (its three parts are there, or the
    two of the older single-file format)."""
    parts = (DCP_METADATA, TRAINER_FILE, META_FILE)
    if (Path(path) / LEGACY_FILE).is_file():
        parts = (LEGACY_FILE, META_FILE)
    return all((Path(path) / name).is_file() for name in parts)


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
    raise FileNotFoundError(f"trainer.resume={resume!r}: no checkpoint found there")


@dataclass
class Resumable:
    """The live objects a checkpoint saves and restores, besides the ``TrainState``."""

    model: torch.nn.Module
    """The bare model (sharded in place under FSDP2, never the DDP wrapper)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any
    """The train loader: ``state_dict()`` is its position, per rank."""


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every call without a process group; one process is a use it supports."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _write_file(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


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
    model_state, optimizer_state = get_state_dict(live.model, live.optimizer)
    contents = {"model": model_state, "optimizer": optimizer_state}
    with _single_process_quiet():
        dcp.save(contents, checkpoint_id=tmp, no_dist=not dist.is_initialized())
    data = dist.all_gather_object(live.loader.state_dict())
    rngs = dist.all_gather_object(rng_state())
    path = None
    if rank == 0:
        trainer = {
            "scheduler": live.scheduler.state_dict(),
            "data": data,
            "rng": rngs,
            "train_state": state.state_dict(),
        }
        meta = {
            "step": state.step,
            "tokens": state.tokens,
            "world_size": state.world_size,
            "git_sha": git_sha(),
        }
        _write_file(tmp / TRAINER_FILE, lambda f: torch.save(trainer, f))
        _write_file(tmp / META_FILE, lambda f: f.write(json.dumps(meta, indent=2).encode()))
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


def saved_train_state(contents: dict[str, Any]) -> dict[str, Any]:
    """The counters of a checkpoint; ones written before ``TrainState`` kept them at top level."""
    if "train_state" in contents:
        return contents["train_state"]
    return {f.name: contents[f.name] for f in dataclasses.fields(TrainState)}


def restore_training_state(path: Path, live: Resumable, state: TrainState, *, rank: int) -> None:
    """Load what ``save_training_state`` wrote into the run's live objects (every rank calls
    this), on this run's world size and parallelism."""
    if (Path(path) / LEGACY_FILE).is_file():
        _restore_legacy(path, live, state, rank=rank)
        return
    trainer = torch.load(Path(path) / TRAINER_FILE, weights_only=True)
    positions = trainer["data"]
    try:  # first: a refused data position changes nothing
        live.loader.load_positions(positions)
    except ValueError as err:
        raise ConfigError(
            f"trainer.resume: {path} was written by {len(positions)} rank(s), this run has "
            f"{state.world_size}; the data position cannot be carried over: {err}"
        ) from None
    if len(positions) != state.world_size:
        log.info("checkpoint of %d rank(s) resumed on %d", len(positions), state.world_size)
    model_state, optimizer_state = get_state_dict(live.model, live.optimizer)
    contents = {"model": model_state, "optimizer": optimizer_state}
    with _single_process_quiet():
        dcp.load(contents, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(
        live.model,
        live.optimizer,
        model_state_dict=contents["model"],
        optim_state_dict=contents["optimizer"],
    )
    live.scheduler.load_state_dict(trainer["scheduler"])
    rngs = trainer["rng"]
    set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
    saved = trainer["train_state"]
    state.load_state_dict({**saved, "world_size": state.world_size})


def _restore_legacy(path: Path, live: Resumable, state: TrainState, *, rank: int) -> None:
    """Resume from a checkpoint of the single-file format that came before DCP (``state.pt``
    holds everything; counters at top level before ``TrainState``): same world size only."""
    contents = torch.load(Path(path) / LEGACY_FILE, weights_only=True)
    saved = saved_train_state(contents)
    if saved["world_size"] != state.world_size:
        raise ConfigError(
            f"trainer.resume: {path} (single-file format) was written by {saved['world_size']} "
            f"rank(s), this run has {state.world_size}; resume it on as many"
        )
    live.model.load_state_dict(contents["model"])
    live.optimizer.load_state_dict(contents["optimizer"])
    live.scheduler.load_state_dict(contents["scheduler"])
    live.loader.load_state_dict(contents["data"][rank])
    set_rng_state(contents["rng"][rank])
    state.load_state_dict(saved)


def _legacy_model(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a single-file checkpoint (memory-mapped, not read in full)."""
    return torch.load(Path(path) / LEGACY_FILE, weights_only=True, mmap=True)["model"]


def load_model_weights(path: Path, model: nn.Module) -> nn.Module:
    """Load a checkpoint's model weights into the unsharded ``model`` (one process, any world size
    the checkpoint was written with): the consolidation that exports and scripts use."""
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint directory")
    if (Path(path) / LEGACY_FILE).is_file():
        model.load_state_dict(_legacy_model(path))
        return model
    weights = {"model": model.state_dict()}
    with _single_process_quiet():
        dcp.load(weights, checkpoint_id=path, no_dist=True)
    model.load_state_dict(weights["model"])
    return model


def saved_model_dtype(path: Path) -> torch.dtype:
    """The dtype the checkpoint's model weights were saved in (read from the DCP metadata)."""
    if (Path(path) / LEGACY_FILE).is_file():
        return next(iter(_legacy_model(path).values())).dtype
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
