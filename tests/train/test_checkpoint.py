"""Checkpoint files (``train/checkpoint.py``) in one process: complete or absent, last-k, resume
modes, the RNG and data position through DCP, and the model consolidated from the DCP files."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import foam
import models
from tests.helpers.checkpoint import Position, live, save
from train import checkpoint as ckpt
from train.errors import ConfigError
from train.state import TrainState


def resume_from(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint ``trainer.resume`` goes on from when it loads (the newest candidate)."""
    found = ckpt.resume_candidates(resume, run_dir, set_aside_newer=False)
    return found[0] if found else None


def test_round_trip(tmp_path):
    run = live()
    path = save(tmp_path, run, 3)
    assert path.name == "step_00000003" and ckpt.is_complete(path)
    resumed, state = live(), TrainState()
    ckpt.restore_training_state(path, resumed, state, rank=0)
    assert torch.equal(resumed.model.weight, torch.full((4, 4), 3.0))
    assert (state.step, state.tokens) == (3, 30)


@pytest.mark.parametrize(("keep_last", "kept"), [(2, [3, 4]), (1, [4]), (0, [1, 2, 3, 4])])
def test_keep_last_k(tmp_path, keep_last, kept):
    run = live()
    for step in (1, 2, 3, 4):
        save(tmp_path, run, step, keep_last=keep_last)
    assert [s for s, _ in ckpt.list_checkpoints(ckpt.checkpoint_root(tmp_path))] == kept


def test_resume_picks_the_newest_of_several_checkpoints(tmp_path):
    run = live()
    for step in (2, 10, 4):
        save(tmp_path, run, step, keep_last=0)
    newest = ckpt.checkpoint_root(tmp_path) / "step_00000010"
    assert resume_from("auto", tmp_path) == newest
    assert resume_from(str(tmp_path), tmp_path / "other") == newest
    assert resume_from(str(newest.parent), tmp_path / "other") == newest


def test_incomplete_or_foreign_directories_are_not_checkpoints(tmp_path):
    root = ckpt.checkpoint_root(tmp_path)
    save(tmp_path, live(), 1, keep_last=0)
    for step, missing in ((7, ckpt.META_FILE), (9, ckpt.DCP_METADATA)):
        copy = root / f"step_{step:08d}"
        shutil.copytree(root / "step_00000001", copy)
        (copy / missing).unlink()
    shutil.copytree(root / "step_00000001", root / "notes")
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [1]


def test_saving_a_step_again_replaces_it(tmp_path):
    run = live()
    save(tmp_path, run, 3, keep_last=0)
    with torch.no_grad():
        run.model.bias.fill_(5.0)
    path = save(tmp_path, run, 3, keep_last=0)
    resumed = live()
    ckpt.restore_training_state(path, resumed, TrainState(), rank=0)
    assert torch.equal(resumed.model.bias, torch.full((4,), 5.0))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_saving_leaves_no_file_descriptor_open(tmp_path):
    """A run saves thousands of checkpoints: each save must close what it opens."""
    run = live()
    save(tmp_path, run, 1)  # first-use imports and caches
    before = len(list(Path("/proc/self/fd").iterdir()))
    for step in (2, 3, 4):
        save(tmp_path, run, step)
    assert len(list(Path("/proc/self/fd").iterdir())) == before


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = live()
    save(tmp_path, run, 1)

    def crash_midway(*args, **kwargs):
        raise KeyboardInterrupt  # the process "dies" while the shards are written

    monkeypatch.setattr(dcp, "save", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, run, 2)
    monkeypatch.undo()
    assert list(ckpt.checkpoint_root(tmp_path).glob(".tmp_*"))
    latest = resume_from("auto", tmp_path)
    assert latest.name == "step_00000001"
    save(tmp_path, run, 2)  # the stale temp dir is cleared
    assert not list(ckpt.checkpoint_root(tmp_path).glob(".tmp_*"))


KILLED_SAVER = textwrap.dedent(
    """
    import sys, torch
    from tests.helpers.checkpoint import live, save
    run = live(4000)  # 64 MB of weights: each save takes a while
    for step in range(1, 10_000):
        save(sys.argv[1], run, step)
        print(step, flush=True)
    """
)


def test_sigkill_during_save_leaves_a_loadable_checkpoint(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", KILLED_SAVER, str(tmp_path)],
        cwd=repo,
        stdout=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)},
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "1"  # one complete checkpoint exists
        time.sleep(0.3)  # then kill it somewhere inside a later save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    latest = resume_from("auto", tmp_path)
    step = int(latest.name.split("_")[1])
    model = ckpt.load_model_weights(latest, torch.nn.Linear(4000, 4000))
    assert torch.equal(model.weight[:2, :2], torch.full((2, 2), float(step)))


def test_resume_modes(tmp_path):
    assert resume_from("auto", tmp_path) is None
    assert resume_from("none", tmp_path) is None
    assert resume_from(None, tmp_path) is None
    with pytest.raises(ConfigError, match=r"trainer\.resume=.*nowhere: no complete checkpoint"):
        resume_from(str(tmp_path / "nowhere"), tmp_path)
    path = save(tmp_path, live(), 5, keep_last=0)
    assert resume_from(str(tmp_path), tmp_path / "other") == path
    assert resume_from(str(path), tmp_path / "other") == path


def test_rng_state_and_data_position_round_trip_through_the_dcp_checkpoint(tmp_path):
    import random

    import numpy as np

    run = live()
    run.loader.records = 6
    path = save(tmp_path, run, 1)  # saving draws nothing: the RNG is where it was saved
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(1)  # moved on since the save
    resumed = live()
    ckpt.restore_training_state(path, resumed, TrainState(), rank=0)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert resumed.loader.records == 6
    names = sorted(p.name for p in path.iterdir())
    assert names == [".metadata", "__0_0.distcp", "manifest.json", "meta.json"]


def test_consolidated_weights_need_a_complete_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        ckpt.load_model_weights(tmp_path, torch.nn.Linear(2, 2))


def tiny_llama(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.build_model({**models.load_model_config("llama_tiny"), "vocab_size": 64})


def _tree_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_tree_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_tree_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", sorted(foam.available_optimizers()))
def test_every_optimizer_round_trips_through_the_dcp_checkpoint(tmp_path, name):
    """Whatever a method keeps in its state (projections, int8 codes, gradients of LDAdamW's
    error feedback), a fresh run restored from the checkpoint holds the same."""
    if name in ("adamw8bit", "foam8bit", "galore8bit"):
        pytest.importorskip("bitsandbytes")
    runs = []
    for seed in (0, 1):
        model = tiny_llama(seed)
        optimizer = foam.build_optimizer(name, model, lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        runs.append(ckpt.Resumable(model, optimizer, scheduler, Position()))
    saved, restored = runs
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    saved.model(input_ids=ids, labels=ids).loss.backward()
    saved.optimizer.step()
    path = ckpt.save_training_state(tmp_path, saved, TrainState(step=1), rank=0, keep_last=1)
    ckpt.restore_training_state(path, restored, TrainState(), rank=0)
    assert _tree_equal(restored.optimizer.state_dict(), saved.optimizer.state_dict())
    assert _tree_equal(restored.model.state_dict(), saved.model.state_dict())


def test_a_checkpoint_of_the_older_format_is_refused_with_the_commit_that_reads_it(tmp_path):
    path = save(tmp_path, live(), 2)
    (path / ckpt.OLDER_FORMAT_FILE).write_bytes(b"")
    (path / ckpt.META_FILE).write_text('{"git_sha": "abc123"}')
    with pytest.raises(ConfigError, match=r"older format .*git abc123"):
        ckpt.restore_training_state(path, live(), TrainState(), rank=0)
