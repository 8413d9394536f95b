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

Atomic and proven: every rank writes into one hidden temporary directory and checksums its own
files; rank 0 then adds ``meta.json`` and ``manifest.json`` (every file's size and CRC-32,
``train/manifest.py``), flushes them and renames the directory to its final name (a directory
rename is atomic on POSIX). A process killed mid-save leaves at most a stale ``.tmp_*``
directory, which is never mistaken for a checkpoint and is removed by the next run. Any rank's
failure in any of these steps stops every rank with the same one line
(``CheckpointSaveFailed``). Pruning (``keep_last``) and the re-save of a step rename before they
delete, so no half-deleted ``step_N`` is ever listed. ``trainer.resume=auto`` goes on from the
newest checkpoint that verifies and loads, setting aside (``step_N.bad-<reason>``) each one that
does not (``restore_first_loadable``).

Resuming on another world size: model and optimizer reshard; the data position is re-derived by
``train.data.position.rederive_position`` (or refused with the reason); each rank's RNG state is
that of the saved rank with its number, rank 0's for ranks the saved run did not have.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from train import distributed as dist
from train import faults, manifest
from train.errors import CheckpointSaveFailed, ConfigError
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
# Hidden names of a save's directories in flight, which no listing mistakes for checkpoints:
_TMP = ".tmp_"  # being written
_REPLACED = ".replaced_"  # a step saved again: the old directory, until the new one is in place
_PRUNED = ".pruned_"  # beyond keep_last: renamed, then deleted


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint directory (DCP's metadata and ``meta.json``)."""
    return all((Path(path) / name).is_file() for name in (DCP_METADATA, META_FILE))


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` directory under ``root`` as (step, path), oldest first: complete or not
    (one that is not is damaged: a published directory always is)."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, path), oldest first."""
    return [(step, path) for step, path in step_dirs(root) if is_complete(path)]


def set_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<name>.<label>`` (``.<label>.<n>`` when taken): out of every listing,
    never deleted."""
    target = path.with_name(f"{path.name}.{label}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{label}.{n}")
    os.replace(path, target)
    return target


def clear_leftovers(root: Path) -> None:
    """Remove what a save killed midway leaves (rank 0, with the run's lock held): a temporary
    directory, a checkpoint set aside for deletion. A re-saved step's old directory is put back
    where the new one never arrived, deleted where it did."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.name.startswith(_REPLACED):
            final = root / child.name[len(_REPLACED) :]
            if not final.exists():
                os.replace(child, final)
                continue
        if child.name.startswith((_TMP, _REPLACED, _PRUNED)):
            shutil.rmtree(child, ignore_errors=True)


def resume_candidates(resume: str | None, run_dir: Path, *, set_aside_newer: bool) -> list[Path]:
    """The checkpoints ``trainer.resume`` may go on from, newest first (rank 0 decides).

    ``auto``: every ``step_N`` of the run directory (the newest that verifies and loads wins;
    ``restore_first_loadable``), none for a fresh start, and a refusal where the only ones left
    were set aside as damaged; ``none``/null: a fresh start; anything else: that checkpoint
    directory, or a run directory's newest. An explicit checkpoint older than one of this run's
    is refused, unless ``set_aside_newer`` renames the newer ones ``step_N.aside``, so that the
    run's history is the trajectory it resumes.
    """
    root = checkpoint_root(run_dir)
    clear_leftovers(root)
    if resume is None or str(resume).lower() in ("none", "null", "false", ""):
        return []
    if resume == "auto":
        found = [path for _, path in reversed(step_dirs(root))]
        damaged = sorted(p.name for p in root.glob("step_*.bad-*")) if root.is_dir() else []
        if not found and damaged:
            raise ConfigError(
                f"trainer.resume=auto: every checkpoint in {root} was set aside as damaged "
                f"({', '.join(damaged)}); move them away and set trainer.resume=none to start "
                "afresh, or resume one with trainer.resume=<path> trainer.verify_checkpoints=false"
            )
        return found
    path = _explicit_checkpoint(resume)
    step = _saved_step(path)
    newer = [p for s, p in step_dirs(root) if s > step and p.resolve() != path.resolve()]
    if newer and not set_aside_newer:
        raise ConfigError(
            f"trainer.resume={resume}: this run has newer checkpoints ({newer[-1].name} and "
            f"{len(newer) - 1} more); resuming step {step} would fork its history. Set "
            "trainer.resume_set_aside_newer=true to rename them step_N.aside and go on"
        )
    for p in newer:
        log.warning("set aside %s (newer than the resumed step %d)", set_aside(p, "aside"), step)
    return [path]


def _explicit_checkpoint(resume: str) -> Path:
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


def read_meta(path: Path) -> dict[str, Any]:
    """The checkpoint's ``meta.json`` (step, tokens, world size, git sha, data fingerprint)."""
    return json.loads((Path(path) / META_FILE).read_text())


def _saved_step(path: Path) -> int:
    return int(read_meta(path)["step"])


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


@contextlib.contextmanager
def _every_rank_or_none(step: int, rank: int, where: Path) -> Iterator[None]:
    """A step of a save that any rank may fail: leaving it is a collective (on the slow-I/O
    group), and every rank raises ``CheckpointSaveFailed`` with the same line (the failing rank,
    the errno and the path) if any rank failed, within seconds rather than at a barrier's
    timeout of hours."""
    failure = None
    try:
        yield
    except CheckpointException as err:  # DCP's own: raised on every rank, naming the rank
        failed_rank, (cause, _) = next(iter(err.failures.items()))
        failure = _failure_line(failed_rank, cause, where)
    except Exception as err:
        failure = _failure_line(rank, err, where)
    failed = [f for f in dist.all_gather_object(failure, slow_io=True) if f is not None]
    if failed:
        raise CheckpointSaveFailed(f"checkpoint of step {step} not saved: {failed[0]}")


def _failure_line(rank: int, err: BaseException, where: Path) -> str:
    """``rank R: EIO (Input/output error) at PATH`` (the file when the error names one, else
    the directory being written). ``torch.save``'s zip writer turns a failed write into a
    ``RuntimeError`` whose context is the ``OSError``: that is what is named (the context does
    not survive DCP's gathering of another rank's error)."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None and cause.errno is not None:
        err = cause
        path = err.filename or where
        name = errno.errorcode.get(err.errno, str(err.errno))
        return f"rank {rank}: {name} ({err.strerror}) at {path}"
    return f"rank {rank}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def save_training_state(
    run_dir: Path,
    live: Resumable,
    state: TrainState,
    *,
    rank: int,
    keep_last: int,
    data_fingerprint: dict[str, Any] | None = None,
    background: bool = False,
) -> Path | None:
    """Checkpoint the run; every rank calls this. Returns the path on rank 0 once published.

    ``keep_last <= 0`` keeps every checkpoint. Any rank's failure raises
    ``CheckpointSaveFailed`` on every rank; nothing half-written is published, and the previous
    checkpoint stays the newest. ``background``: the state is copied and its shards written by
    ``dcp.async_save`` while training goes on; the checkpoint is checked and published (the
    same manifest, rename and failure rules) by the next call or ``finish_background_save``,
    so at most one is in flight.
    """
    finish_background_save()
    save = _start_save(run_dir, live, state, rank=rank, keep_last=keep_last, background=background)
    save.meta["data"] = data_fingerprint
    if background:
        global _in_flight
        _in_flight = save
        return None
    return _finish_save(save)


def finish_background_save() -> Path | None:
    """Wait for the checkpoint ``save_training_state(background=True)`` left in flight, if any,
    and publish it (every rank calls this); its path on rank 0."""
    global _in_flight
    save, _in_flight = _in_flight, None
    return None if save is None else _finish_save(save)


@dataclass
class _Save:
    """A checkpoint on its way: its shards written, or being written in the background."""

    rank: int
    root: Path
    tmp: Path
    keep_last: int
    meta: dict[str, Any]
    """``meta.json``, as of the step saved."""
    shards: Future | None
    """``dcp.async_save``'s future; None once the shards are written."""

    @property
    def step(self) -> int:
        return self.meta["step"]


_in_flight: _Save | None = None
_background_group: torch.distributed.ProcessGroup | None = None


def _start_save(
    run_dir: Path,
    live: Resumable,
    state: TrainState,
    *,
    rank: int,
    keep_last: int,
    background: bool,
) -> _Save:
    root = checkpoint_root(run_dir)
    tmp = root / f"{_TMP}{step_dir_name(state.step)}"
    meta = {
        "step": state.step,
        "tokens": state.tokens,
        "world_size": state.world_size,
        "git_sha": git_sha(),
    }
    save = _Save(rank, root, tmp, keep_last, meta, shards=None)
    with _every_rank_or_none(state.step, rank, root):
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            clear_leftovers(root)
            tmp.mkdir()
    with _every_rank_or_none(state.step, rank, tmp), _single_process_quiet():
        if background:
            save.shards = dcp.async_save(
                contents(live, state, rank=rank), checkpoint_id=tmp, **_background_options()
            )
        else:
            dcp.save(contents(live, state, rank=rank), checkpoint_id=tmp, **_dcp_options())
    return save


def _background_options() -> dict[str, Any]:
    """``dcp.async_save``'s collectives run in its own thread: on a group of their own, which
    no collective of the training thread can interleave with."""
    global _background_group
    if not dist.is_initialized():  # the save's thread outlives _single_process_quiet
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return {"no_dist": True}
    if _background_group is None:
        _background_group = torch.distributed.new_group(
            backend="gloo", timeout=dist.SLOW_IO_TIMEOUT
        )
    return {"process_group": _background_group}


def _finish_save(save: _Save) -> Path | None:
    """Check every rank's shards, then publish (rank 0): ``meta.json``, the manifest, the
    rename, pruning."""
    step, rank, tmp = save.step, save.rank, save.tmp
    with _every_rank_or_none(step, rank, tmp):
        if save.shards is not None:
            with _single_process_quiet():
                save.shards.result()
        faults.hit("save:after_shards", step=step, path=tmp / f"__{rank}_0.distcp")
        mine = manifest.describe_files(tmp, manifest.owned_files(tmp, rank))
    files = {k: v for part in dist.all_gather_object(mine, slow_io=True) for k, v in part.items()}
    final = save.root / step_dir_name(step)
    with _every_rank_or_none(step, rank, tmp):
        if rank == 0:
            faults.hit("save:before_publish", step=step, path=tmp / META_FILE)
            _write_synced(tmp / META_FILE, json.dumps(save.meta, indent=2).encode())
            files |= manifest.describe_files(tmp, [META_FILE])
            manifest.write_manifest(tmp, files)
            _publish(tmp, final)
            _prune(save.root, save.keep_last)
            log.info("saved %s", final)
    return final if rank == 0 else None


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _publish(tmp: Path, final: Path) -> None:
    """Rename the written directory to its final name (atomic on POSIX). A step saved again
    (a resumed run that had already finished) moves the old one aside first and deletes it only
    once the new one is in place: a crash in between leaves it for ``clear_leftovers`` to put
    back."""
    _fsync(tmp)
    replaced = final.with_name(f"{_REPLACED}{final.name}") if final.exists() else None
    if replaced:
        os.replace(final, replaced)
    os.replace(tmp, final)
    _fsync(final.parent)
    if replaced:
        shutil.rmtree(replaced, ignore_errors=True)


def _prune(root: Path, keep_last: int) -> None:
    """Delete the checkpoints beyond the newest ``keep_last``, each renamed out of the listing
    first, so that a crash mid-deletion leaves no half-deleted ``step_N`` to be tried."""
    if keep_last <= 0:
        return
    for _, old in list_checkpoints(root)[:-keep_last]:
        pruned = old.with_name(f"{_PRUNED}{old.name}")
        os.replace(old, pruned)
        shutil.rmtree(pruned, ignore_errors=True)


def restore_training_state(path: Path, live: Resumable, state: TrainState, *, rank: int) -> None:
    """Load what ``save_training_state`` wrote into the run's live objects (every rank calls
    this), on this run's world size and parallelism. No verification: see
    ``restore_first_loadable``."""
    if (Path(path) / OLDER_FORMAT_FILE).is_file():
        sha = json.loads((Path(path) / META_FILE).read_text()).get("git_sha", "unknown")
        raise ConfigError(
            f"trainer.resume: {path} is in the older format ({OLDER_FORMAT_FILE} beside the "
            f"shards); resume it with the code that wrote it (git {sha}), or start afresh"
        )
    with _single_process_quiet():
        dcp.load(contents(live, state, rank=rank), checkpoint_id=path, **_dcp_options())


def verify_checkpoint(path: Path, *, rank: int, world_size: int) -> None:
    """Check this rank's share of the checkpoint's files against its manifest (every rank calls
    this with its own share); ``manifest.CheckpointDamaged`` when one differs."""
    if not is_complete(path):
        raise manifest.CheckpointDamaged(
            "incomplete", f"{path} lacks {DCP_METADATA} or {META_FILE}"
        )
    files = manifest.read_manifest(path)
    manifest.verify_files(path, files, sorted(files)[rank::world_size])


def restore_first_loadable(
    candidates: list[Path],
    live: Resumable,
    state: TrainState,
    *,
    rank: int,
    verify: bool,
    set_aside_failures: bool,
    before_load: Callable[[Path], None] = lambda path: None,
) -> Path | None:
    """Restore the first of ``candidates`` (newest first) that verifies and loads; returns it,
    or None when there are none (a fresh start). Every rank calls this.

    ``set_aside_failures`` (``trainer.resume=auto``): one that fails is renamed
    ``step_N.bad-<reason>`` by rank 0, with one line naming it and the reason, and the next is
    tried; where none is left, a ``ConfigError`` (exit status 2) listing them. Otherwise (an
    explicit checkpoint) its failure is that error at once, and nothing is renamed.
    ``before_load`` may refuse a checkpoint that verified (a ``ConfigError``: not damage).
    """
    failures = []
    for path in candidates:
        failure = _attempt(path, live, state, rank=rank, verify=verify, before_load=before_load)
        if failure is None:
            return path
        reason, detail = failure
        if reason == "no-manifest":  # not damage: written before checkpoints carried one
            raise ConfigError(
                f"trainer.resume: {path} has no {manifest.MANIFEST_FILE} (written before "
                "checkpoints carried one); resume it with trainer.verify_checkpoints=false"
            )
        if not set_aside_failures:
            raise ConfigError(f"trainer.resume={path}: {detail}")
        if rank == 0:
            aside = set_aside(path, f"bad-{reason}")
            log.warning("checkpoint %s fails (%s): set aside as %s", path.name, detail, aside.name)
        failures.append(f"{path.name}: {reason}")
    if failures:
        raise ConfigError(
            f"trainer.resume=auto: no checkpoint in {candidates[0].parent} loads "
            f"({'; '.join(failures)}), each set aside as step_N.bad-<reason>; nothing was "
            "rewritten. Restore one from a copy, or set trainer.resume=none to start afresh"
        )
    return None


def _attempt(
    path: Path,
    live: Resumable,
    state: TrainState,
    *,
    rank: int,
    verify: bool,
    before_load: Callable[[Path], None],
) -> tuple[str, str] | None:
    """Verify, then load ``path`` on every rank; the first rank's (reason, detail) where any
    rank failed, the same on every rank."""
    failure = None
    if verify:
        try:
            verify_checkpoint(path, rank=rank, world_size=dist.world_size())
        except manifest.CheckpointDamaged as err:
            failure = (err.reason, str(err))
        except OSError as err:
            failure = ("unreadable", str(err))
    failures = [f for f in dist.all_gather_object(failure, slow_io=True) if f is not None]
    if failures:
        return failures[0]
    before_load(path)
    try:
        restore_training_state(path, live, state, rank=rank)
    except ConfigError:
        raise  # not damage: the checkpoint is fine, this run cannot take it
    except (Exception, CheckpointException) as err:
        failure = ("load", f"{path} does not load: {_one_line(err)}")
    failures = [f for f in dist.all_gather_object(failure, slow_io=True) if f is not None]
    return failures[0] if failures else None


def _one_line(err: BaseException) -> str:
    if isinstance(err, CheckpointException):
        err = next(iter(err.failures.values()))[0]
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


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
