"""Checkpoints: atomic (a crash or kill mid-save leaves the previous one valid), last-k, weights-only."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from train import checkpoint as ckpt
from train.seeding import rng_state, set_rng_state


def state(step: int) -> dict:
    return {
        "model": {"w": torch.full((4,), float(step))},
        "step": step,
        "name": "x",
        "betas": (0.9, 0.95),
    }


def test_save_load_round_trip_weights_only(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, 3, state(3), {"tokens": 7}, keep_last=2)
    assert path.name == "step_00000003"
    loaded = torch.load(path / ckpt.STATE_FILE, weights_only=True)
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.full((4,), 3.0))
    assert ckpt.load_checkpoint(path)["betas"] == (0.9, 0.95)


@pytest.mark.parametrize(("keep_last", "kept"), [(2, [3, 4]), (1, [4]), (0, [1, 2, 3, 4])])
def test_keep_last_k(tmp_path, keep_last, kept):
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(tmp_path, step, state(step), {}, keep_last=keep_last)
    assert [s for s, _ in ckpt.list_checkpoints(ckpt.checkpoint_root(tmp_path))] == kept


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, state(1), {}, keep_last=2)
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(10)  # half-written file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 2, state(2), {}, keep_last=2)
    monkeypatch.setattr(torch, "save", real_save)
    latest = ckpt.find_resume_checkpoint("auto", tmp_path)
    assert latest.name == "step_00000001"
    assert ckpt.load_checkpoint(latest)["step"] == 1
    ckpt.save_checkpoint(tmp_path, 2, state(2), {}, keep_last=2)  # the stale temp dir is cleared
    assert not list(ckpt.checkpoint_root(tmp_path).glob(".tmp_*"))


KILLED_SAVER = textwrap.dedent(
    """
    import sys, torch
    from train.checkpoint import save_checkpoint
    run_dir = sys.argv[1]
    big = torch.randn(16_000_000)  # 64 MB: each save takes a while
    for step in range(1, 10_000):
        save_checkpoint(run_dir, step, {"w": big, "step": step}, {}, keep_last=2)
        print(step, flush=True)
    """
)


def test_sigkill_during_save_leaves_a_loadable_checkpoint(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVER, str(tmp_path)],
        cwd=repo,
        stdout=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "1"  # one complete checkpoint exists
        time.sleep(0.15)  # then kill it somewhere inside a later save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    latest = ckpt.find_resume_checkpoint("auto", tmp_path)
    loaded = ckpt.load_checkpoint(latest)
    assert loaded["w"].numel() == 16_000_000 and loaded["step"] == int(latest.name.split("_")[1])


def test_resume_modes(tmp_path):
    assert ckpt.find_resume_checkpoint("auto", tmp_path) is None
    assert ckpt.find_resume_checkpoint("none", tmp_path) is None
    assert ckpt.find_resume_checkpoint(None, tmp_path) is None
    with pytest.raises(FileNotFoundError, match=r"trainer\.resume"):
        ckpt.find_resume_checkpoint(str(tmp_path / "nowhere"), tmp_path)
    path = ckpt.save_checkpoint(tmp_path, 5, state(5), {}, keep_last=0)
    assert ckpt.find_resume_checkpoint(str(tmp_path), tmp_path / "other") == path
    assert ckpt.find_resume_checkpoint(str(path), tmp_path / "other") == path


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    saved = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    path = ckpt.save_checkpoint(tmp_path, 1, {"rng": saved}, {}, keep_last=1)
    set_rng_state(torch.load(path / ckpt.STATE_FILE, weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_resume_picks_the_newest_of_several_checkpoints(tmp_path):
    for step in (2, 10, 4):
        ckpt.save_checkpoint(tmp_path, step, state(step), {}, keep_last=0)
    newest = ckpt.checkpoint_root(tmp_path) / "step_00000010"
    assert ckpt.find_resume_checkpoint("auto", tmp_path) == newest
    assert ckpt.find_resume_checkpoint(str(tmp_path), tmp_path / "other") == newest
    assert ckpt.find_resume_checkpoint(str(newest.parent), tmp_path / "other") == newest


def test_incomplete_or_foreign_directories_are_not_checkpoints(tmp_path):
    root = ckpt.checkpoint_root(tmp_path)
    ckpt.save_checkpoint(tmp_path, 1, state(1), {}, keep_last=0)
    (root / "step_00000007").mkdir()
    torch.save(state(7), root / "step_00000007" / ckpt.STATE_FILE)  # no meta.json
    (root / "step_00000008").mkdir()
    (root / "step_00000008" / ckpt.META_FILE).write_text("{}")  # no state.pt
    (root / "notes").mkdir()
    torch.save(state(9), root / "notes" / ckpt.STATE_FILE)
    (root / "notes" / ckpt.META_FILE).write_text("{}")
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [1]


def test_saving_a_step_again_replaces_it(tmp_path):
    ckpt.save_checkpoint(tmp_path, 3, state(3), {"tokens": 1}, keep_last=0)
    path = ckpt.save_checkpoint(tmp_path, 3, state(30), {"tokens": 2}, keep_last=0)
    assert ckpt.load_checkpoint(path)["step"] == 30
    assert '"tokens": 2' in (path / ckpt.META_FILE).read_text()


class Opaque:
    """Something only a full unpickle can load (an optimizer that pickles a helper object)."""

    def __init__(self, value: int):
        self.value = value


def test_objects_outside_weights_only_load_through_the_fallback_with_a_warning(tmp_path, caplog):
    plain = ckpt.save_checkpoint(tmp_path / "plain", 1, state(1), {}, keep_last=0)
    with caplog.at_level("WARNING", logger="train.checkpoint"):
        assert ckpt.load_checkpoint(plain)["step"] == 1
    assert not caplog.records  # tensors and plain values load weights-only
    odd = ckpt.save_checkpoint(tmp_path / "odd", 1, {"helper": Opaque(5)}, {}, keep_last=0)
    with caplog.at_level("WARNING", logger="train.checkpoint"):
        assert ckpt.load_checkpoint(odd)["helper"].value == 5
    assert "weights_only load" in caplog.text


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_saving_leaves_no_file_descriptor_open(tmp_path):
    """A run saves thousands of checkpoints: each save must close what it opens."""
    ckpt.save_checkpoint(tmp_path, 1, state(1), {}, keep_last=2)  # first-use imports and caches
    before = len(list(Path("/proc/self/fd").iterdir()))
    for step in (2, 3, 4):
        ckpt.save_checkpoint(tmp_path, step, state(step), {}, keep_last=2)
    assert len(list(Path("/proc/self/fd").iterdir())) == before
