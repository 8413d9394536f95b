"""Faults a cluster does to a long run, injected: damaged checkpoints, failed saves, a second
launch on a live run, a torn metrics line, changed data (issue #75; README "Faults").

Each CLI test asserts the exit status, the one line, which checkpoints exist after, and where
the run goes on, that its losses equal the uninterrupted run's. The in-process tests prove the
pieces (manifest, lock, metrics history, pruning) in milliseconds; runs of several ranks and the
longer scenarios are marked slow.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.checkpoint import live, save
from tests.helpers.cli import ENV, REPO, command, torchrun, train_losses, wait_for
from train import checkpoint as ckpt
from train import manifest, run_lock
from train.data.fingerprint import check_unchanged, fingerprint
from train.errors import SAVE_FAILED_EXIT_STATUS, CheckpointSaveFailed, ConfigError
from train.loggers import JsonlWriter
from train.schema import DataConfig
from train.state import TrainState

STEPS = ("trainer.max_steps=6", "trainer.save_every=2", "trainer.keep_last=0")
QUICK = ("trainer.eval_every=0", "data.shuffle_buffer=0")


def launch(
    run_dir: Path, *overrides: str, fault: str | None = None, expect_rc: int = 0, **popen
) -> subprocess.CompletedProcess:
    env = {**ENV, **({"FOAM_FAULT": fault} if fault else {})}
    proc = subprocess.run(
        command(run_dir, *STEPS, *QUICK, *overrides, optim="adamw"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **popen,
    )
    assert proc.returncode == expect_rc, proc.stderr[-4000:]
    return proc


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def shard(path: Path) -> Path:
    return path / "__0_0.distcp"


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted run: 6 steps, checkpoints at 2, 4 and 6."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    launch(run_dir)
    return run_dir


def copy_of(whole: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)
    (run_dir / "summary.json").unlink()
    return run_dir


# --- checkpoints that prove themselves ---------------------------------------------------------


def test_damaged_checkpoints_are_set_aside_and_the_newest_good_one_resumes(whole, tmp_path):
    """The newest checkpoint has one bit flipped (it loaded without a word before), the one
    before it a shard cut short (a traceback on every requeue before): both are set aside with
    one line each, and the run resumes from step 2 onto the uninterrupted run's losses."""
    run_dir = copy_of(whole, tmp_path)
    root = run_dir / "checkpoints"
    flipped = shard(root / "step_00000006")
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    cut = shard(root / "step_00000004")
    os.truncate(cut, cut.stat().st_size // 2)
    proc = launch(run_dir)
    out = proc.stdout + proc.stderr
    assert "checkpoint step_00000006 fails (checksum:" in out
    assert "checkpoint step_00000004 fails (size:" in out
    assert "resumed from" in out and "step_00000002" in out
    assert names(run_dir) == [
        "step_00000002",
        "step_00000004",
        "step_00000004.bad-size",
        "step_00000006",
        "step_00000006.bad-checksum",
    ]
    assert train_losses(run_dir) == train_losses(whole)


@pytest.mark.slow
def test_without_verification_a_checkpoint_that_does_not_load_is_set_aside(whole, tmp_path):
    run_dir = copy_of(whole, tmp_path)
    cut = shard(run_dir / "checkpoints" / "step_00000006")
    os.truncate(cut, cut.stat().st_size // 2)
    proc = launch(run_dir, "trainer.verify_checkpoints=false")
    assert "checkpoint step_00000006 fails (step_00000006 does not load" in (
        proc.stdout + proc.stderr
    ).replace(str(run_dir / "checkpoints") + "/", "")
    assert "step_00000006.bad-load" in names(run_dir)
    assert train_losses(run_dir) == train_losses(whole)


def test_when_no_checkpoint_loads_the_run_refuses_and_rewrites_nothing(whole, tmp_path):
    """Every ``meta.json`` gone: before, the run started afresh from step 1 and rewrote
    metrics.jsonl; now exit 2 with one line, the history untouched, and the requeue after it
    refuses again rather than starting afresh."""
    run_dir = copy_of(whole, tmp_path)
    for path in (run_dir / "checkpoints").iterdir():
        (path / ckpt.META_FILE).unlink()
    history = (run_dir / "metrics.jsonl").read_bytes()
    proc = launch(run_dir, expect_rc=2)
    (line,) = error_lines(proc)
    assert line.startswith("error: trainer.resume=auto: no checkpoint in")
    assert "step_00000006: incomplete; step_00000004: incomplete" in line
    assert names(run_dir) == [f"step_0000000{s}.bad-incomplete" for s in (2, 4, 6)]
    assert (run_dir / "metrics.jsonl").read_bytes() == history
    again = launch(run_dir, expect_rc=2)
    (line,) = error_lines(again)
    assert "every checkpoint in" in line and "set aside as damaged" in line
    assert (run_dir / "metrics.jsonl").read_bytes() == history


def test_manifest_catches_a_cut_short_file_and_a_flipped_bit(tmp_path):
    path = save(tmp_path, live(64), 1)
    ckpt.verify_checkpoint(path, rank=0, world_size=1)
    data = bytearray(shard(path).read_bytes())
    data[100] ^= 1
    shard(path).write_bytes(bytes(data))
    with pytest.raises(manifest.CheckpointDamaged, match="checksum") as err:
        ckpt.verify_checkpoint(path, rank=0, world_size=1)
    assert err.value.reason == "checksum"
    shard(path).write_bytes(bytes(data[:-5]))
    with pytest.raises(manifest.CheckpointDamaged, match=r"has \d+ bytes, the manifest says"):
        ckpt.verify_checkpoint(path, rank=0, world_size=1)
    (path / manifest.MANIFEST_FILE).unlink()
    with pytest.raises(manifest.CheckpointDamaged, match="no-manifest"):
        ckpt.verify_checkpoint(path, rank=0, world_size=1)


def test_resume_falls_back_past_a_checkpoint_that_fails(tmp_path):
    run = live()
    for step in (1, 2, 3):
        save(tmp_path, run, step, keep_last=0)
    root = ckpt.checkpoint_root(tmp_path)
    os.truncate(shard(root / "step_00000003"), 10)
    candidates = ckpt.resume_candidates("auto", tmp_path, set_aside_newer=False)
    resumed, state = live(), TrainState()
    kwargs = {"rank": 0, "verify": True}
    with pytest.raises(ConfigError, match=r"trainer\.resume=.*step_00000003: size: "):
        ckpt.restore_first_loadable(candidates, resumed, state, set_aside_failures=False, **kwargs)
    assert (root / "step_00000003").is_dir()  # an explicit checkpoint is never renamed
    path = ckpt.restore_first_loadable(
        candidates, resumed, state, set_aside_failures=True, **kwargs
    )
    assert path == root / "step_00000002" and state.step == 2
    assert torch.equal(resumed.model.weight, torch.full((4, 4), 2.0))
    assert (root / "step_00000003.bad-size").is_dir()
    (root / "step_00000002" / manifest.MANIFEST_FILE).unlink()  # as written before manifests
    with pytest.raises(
        ConfigError, match=r"no manifest\.json .* trainer\.verify_checkpoints=false"
    ):
        ckpt.restore_first_loadable(
            [root / "step_00000002"], resumed, state, set_aside_failures=True, **kwargs
        )
    assert (root / "step_00000002").is_dir()


# --- saves that fail cleanly -------------------------------------------------------------------


def _file_size_limit(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_at_a_save_stops_with_one_line_and_the_io_status(tmp_path):
    """A file-size limit (EFBIG, what a full disk's ENOSPC does to a write): before, a traceback
    after a progress bar; now the one line naming the errno and the path, exit status 74, and
    nothing half-written published."""
    run_dir = tmp_path / "run"
    shard_bytes = 20 << 20  # llama_tiny's shard is ~50 MB; logs and metrics are far below
    proc = launch(
        run_dir, expect_rc=SAVE_FAILED_EXIT_STATUS, preexec_fn=_file_size_limit(shard_bytes)
    )
    (line,) = error_lines(proc)
    assert line.startswith("error: checkpoint of step 2 not saved: rank 0: EFBIG (File too large)")
    assert str(run_dir / "checkpoints" / ".tmp_step_00000002") in line
    assert names(run_dir) == [".tmp_step_00000002"]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_an_io_error_after_the_shards_keeps_the_previous_checkpoint_and_resumes(whole, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(
        run_dir, fault="save:after_shards:4@0:io_error", expect_rc=SAVE_FAILED_EXIT_STATUS
    )
    (line,) = error_lines(proc)
    assert line == (
        "error: checkpoint of step 4 not saved: rank 0: EIO (injected I/O error (FOAM_FAULT)) "
        f"at {run_dir / 'checkpoints' / '.tmp_step_00000004' / '__0_0.distcp'}"
    )
    assert names(run_dir) == [".tmp_step_00000004", "step_00000002"]
    launch(run_dir)  # the next run clears the stale temporary directory and resumes
    assert names(run_dir) == ["step_00000002", "step_00000004", "step_00000006"]
    assert train_losses(run_dir) == train_losses(whole)


@pytest.mark.slow
def test_a_failed_save_can_be_trained_past(whole, tmp_path):
    """``trainer.continue_after_failed_save``: a warning, the next save tries again, and the
    run's losses are the uninterrupted run's."""
    run_dir = tmp_path / "run"
    proc = launch(
        run_dir, "trainer.continue_after_failed_save=true", fault="save:before_publish:2@0:io_error"
    )
    assert "checkpoint of step 2 not saved: rank 0: EIO" in proc.stdout + proc.stderr
    assert "training goes on (trainer.continue_after_failed_save)" in proc.stdout + proc.stderr
    assert names(run_dir) == ["step_00000004", "step_00000006"]
    assert train_losses(run_dir) == train_losses(whole)


def on_two_ranks(run_dir: Path, *overrides: str) -> list[str]:
    """The quick AdamW run of these tests under torchrun on 2 ranks."""
    return torchrun(command(run_dir, *STEPS, *QUICK, *overrides, optim="adamw"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("fault", "failing"),
    [
        (
            "save:after_shards:4@1:io_error",
            "rank 1: EIO (injected I/O error (FOAM_FAULT)) at {tmp}/__1_0.distcp",
        ),
        (
            "save:before_publish:4@0:io_error",
            "rank 0: EIO (injected I/O error (FOAM_FAULT)) at {tmp}/meta.json",
        ),
    ],
)
def test_one_ranks_failed_save_stops_every_rank_in_seconds(tmp_path, fault, failing):
    """Rank 1's write error, or rank 0's publishing step: before, the other rank waited at a
    barrier whose timeout is hours; now both ranks stop with the same line and status 74."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run(
        on_two_ranks(run_dir, "trainer.global_batch_size=8"),
        cwd=REPO,
        env={**ENV, "FOAM_FAULT": fault},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-4000:]  # torchrun's own, for any failed worker
    tmp = run_dir / "checkpoints" / ".tmp_step_00000004"
    line = f"error: checkpoint of step 4 not saved: {failing.format(tmp=tmp)}"
    assert proc.stderr.count(line) == 2, proc.stderr[-4000:]  # one line per rank
    assert proc.stderr.count(f"exitcode  : {SAVE_FAILED_EXIT_STATUS}") >= 1
    assert names(run_dir) == [".tmp_step_00000004", "step_00000002"]
    assert time.monotonic() - started < 300


def test_pruning_and_resaving_never_leave_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    """A crash mid-deletion of an old checkpoint (keep_last) or of a re-saved step's old copy
    leaves no ``step_N`` that is not whole, and the newest complete one in place."""
    run = live()
    save(tmp_path, run, 1, keep_last=1)
    root = ckpt.checkpoint_root(tmp_path)

    def crash(path, *args, **kwargs):
        (Path(path) / "__0_0.distcp").unlink()  # half-deleted, then the process dies
        raise KeyboardInterrupt

    for _ in ("pruning step 1", "deleting step 2's old copy as it is saved again"):
        monkeypatch.setattr(ckpt.shutil, "rmtree", crash)
        with pytest.raises(KeyboardInterrupt):
            save(tmp_path, run, 2, keep_last=1)
        monkeypatch.undo()
        assert [s for s, _ in ckpt.step_dirs(root)] == [2]
        ckpt.verify_checkpoint(root / "step_00000002", rank=0, world_size=1)
        ckpt.clear_leftovers(root)
        assert sorted(p.name for p in root.iterdir()) == ["step_00000002"]


def test_a_resaved_step_interrupted_between_its_renames_is_put_back(tmp_path, monkeypatch):
    run = live()
    save(tmp_path, run, 3, keep_last=0)
    root = ckpt.checkpoint_root(tmp_path)
    real_replace = os.replace

    def die_before_the_new_one_lands(src, dst):
        if Path(src).name.startswith(".tmp_"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", die_before_the_new_one_lands)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, run, 3, keep_last=0)
    monkeypatch.undo()
    assert not (root / "step_00000003").exists()
    assert ckpt.resume_candidates("auto", tmp_path, set_aside_newer=False) == [
        root / "step_00000003"
    ]
    ckpt.verify_checkpoint(root / "step_00000003", rank=0, world_size=1)


def test_a_save_failure_is_one_line_naming_rank_errno_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("FOAM_FAULT", "save:after_shards:2@0:io_error")
    from train import faults

    faults.planned.cache_clear()
    try:
        save(tmp_path, live(), 1)
        with pytest.raises(CheckpointSaveFailed) as err:
            save(tmp_path, live(), 2)
    finally:
        faults.planned.cache_clear()
    tmp = ckpt.checkpoint_root(tmp_path) / ".tmp_step_00000002"
    assert str(err.value) == (
        "checkpoint of step 2 not saved: rank 0: EIO (injected I/O error (FOAM_FAULT)) "
        f"at {tmp / '__0_0.distcp'}"
    )
    assert [s for s, _ in ckpt.list_checkpoints(ckpt.checkpoint_root(tmp_path))] == [1]


# --- one writer per run, one history ----------------------------------------------------------


def test_a_second_launch_on_a_live_run_refuses_and_a_dead_ones_lock_is_taken_over(
    tmp_path, monkeypatch
):
    """Before, two launches on one run dir both ran to exit 0, writing the same files."""
    held = run_lock.RunLock.acquire(tmp_path)
    try:
        with pytest.raises(
            ConfigError, match=rf"run dir {tmp_path} is in use by pid {os.getpid()}"
        ):
            run_lock.RunLock.acquire(tmp_path)
    finally:
        held.release()
    assert not (tmp_path / run_lock.LOCK_FILE).exists()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = {"pid": int(dead.stdout), "host": os.uname().nodename, "start": None}
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(stale))
    run_lock.RunLock.acquire(tmp_path).release()  # its holder is gone: taken over
    elsewhere = {"pid": 1, "host": "another-node", "start": None}
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(elsewhere))
    with pytest.raises(ConfigError, match="in use by pid 1 on another-node"):
        run_lock.RunLock.acquire(tmp_path)  # another host's, refreshed within STALE_AFTER_S
    old = time.time() - run_lock.STALE_AFTER_S - 60
    os.utime(tmp_path / run_lock.LOCK_FILE, (old, old))
    run_lock.RunLock.acquire(tmp_path).release()  # that host stopped refreshing it
    requeued = {"pid": 1, "host": "a-lost-node", "start": None, "job": "4242"}
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(requeued))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run_lock.RunLock.acquire(tmp_path).release()  # this job's earlier attempt, on a lost node


@pytest.mark.slow
def test_a_second_launch_on_a_live_run_refuses_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        command(run_dir, "trainer.max_steps=10000", *QUICK, optim="adamw"),
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists(), first, "the first step")
        second = launch(run_dir, expect_rc=2)
        (line,) = error_lines(second)
        assert line == (
            f"error: run dir {run_dir} is in use by pid {first.pid} on {os.uname().nodename} "
            "(its run.lock); wait for that run to end or use another hydra.run.dir"
        )
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    launch(run_dir, "trainer.resume=none")  # the killed run's lock is stale: taken over


def test_a_torn_metrics_line_is_dropped_and_later_records_truncated(tmp_path, caplog):
    """Before, the resumed run's metrics writer raised ``JSONDecodeError``."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"step": 5, "lo')
    JsonlWriter(tmp_path, resume_step=3).close()
    assert path.read_text() == "".join(f"{line}\n" for line in lines[:3])
    assert "dropped 1 line(s) that do not parse (line 5" in caplog.text


def test_a_fresh_start_keeps_the_earlier_history(tmp_path):
    """Before, a fresh start in a run dir deleted its metrics.jsonl."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "metrics.jsonl.1").write_text('{"step": 7}\n')
    JsonlWriter(tmp_path, resume_step=None).close()
    assert (tmp_path / "metrics.jsonl.2").read_text() == '{"step": 1}\n'
    assert (tmp_path / "metrics.jsonl").read_text() == ""


@pytest.mark.slow
def test_a_resume_after_a_torn_metrics_line_continues_the_history(whole, tmp_path):
    """Before: exit 1 with a JSONDecodeError on every requeue."""
    run_dir = copy_of(whole, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "loss": 0.')
    proc = launch(run_dir)
    assert "dropped 1 line(s) that do not parse" in proc.stdout + proc.stderr
    assert "resumed from" in proc.stdout + proc.stderr
    assert train_losses(run_dir) == train_losses(whole)


def test_resuming_an_older_checkpoint_of_the_run_needs_the_newer_set_aside(tmp_path):
    run = live()
    for step in (1, 2, 3):
        save(tmp_path, run, step, keep_last=0)
    root = ckpt.checkpoint_root(tmp_path)
    older = str(root / "step_00000001")
    with pytest.raises(ConfigError, match=r"has newer checkpoints \(step_00000003 and 1 more\)"):
        ckpt.resume_candidates(older, tmp_path, set_aside_newer=False)
    assert ckpt.resume_candidates(older, tmp_path, set_aside_newer=True) == [Path(older)]
    assert sorted(p.name for p in root.iterdir()) == [
        "step_00000001",
        "step_00000002.aside",
        "step_00000003.aside",
    ]


@pytest.mark.slow
def test_resuming_an_older_checkpoint_through_the_cli(whole, tmp_path):
    run_dir = copy_of(whole, tmp_path)
    older = run_dir / "checkpoints" / "step_00000002"
    history = (run_dir / "metrics.jsonl").read_bytes()
    (line,) = error_lines(launch(run_dir, f"trainer.resume={older}", expect_rc=2))
    assert "has newer checkpoints (step_00000006 and 1 more)" in line
    assert (run_dir / "metrics.jsonl").read_bytes() == history
    launch(run_dir, f"trainer.resume={older}", "trainer.resume_set_aside_newer=true")
    assert names(run_dir) == [
        "step_00000002",
        "step_00000004",
        "step_00000004.aside",
        "step_00000006",
        "step_00000006.aside",
    ]
    assert train_losses(run_dir) == train_losses(whole)


# --- the data a checkpoint was trained on -------------------------------------------------------


def test_the_data_fingerprint_sees_a_changed_added_or_removed_file(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.jsonl", "b.jsonl", "validation.jsonl"):
        (corpus / name).write_text('{"text": "some words"}\n' * 100)
    cfg = DataConfig(name="local", path=str(corpus))
    saved = fingerprint(cfg)
    check_unchanged(saved, fingerprint(cfg), "step 4")
    with open(corpus / "b.jsonl", "a") as f:
        f.write('{"text": "one more"}\n')
    (corpus / "c.jsonl").write_text('{"text": "new"}\n')
    with pytest.raises(
        ConfigError, match=r"changed since step 4 \(added c.jsonl, changed b.jsonl\)"
    ):
        check_unchanged(saved, fingerprint(cfg), "step 4")
    hub = fingerprint(DataConfig(name="c4"))
    with pytest.raises(ConfigError, match="allenai/c4/en then, local now"):
        check_unchanged(hub, saved, "step 4")


@pytest.mark.slow
def test_a_resume_onto_changed_data_refuses_unless_told(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [json.dumps({"text": f"document {i} " + "word " * (i % 40)}) for i in range(400)]
    (corpus / "train.jsonl").write_text("\n".join(docs[:300]) + "\n")
    (corpus / "validation.jsonl").write_text("\n".join(docs[300:]) + "\n")
    run_dir = tmp_path / "run"
    data = ("data=local", f"data.path={corpus}")
    launch(run_dir, *data, "trainer.max_steps=2")
    with open(corpus / "validation.jsonl", "a") as f:  # the tokenizer learns train.jsonl's
        f.write(json.dumps({"text": "a late addition"}) + "\n")
    (line,) = error_lines(launch(run_dir, *data, "trainer.max_steps=4", expect_rc=2))
    assert "the data changed since the checkpoint" in line and "changed validation.jsonl" in line
    assert names(run_dir) == ["step_00000002"]
    launch(run_dir, *data, "trainer.max_steps=4", "trainer.allow_data_change=true")
    assert names(run_dir) == ["step_00000002", "step_00000004"]


# --- saves in the background ------------------------------------------------------------------


@pytest.mark.slow
def test_async_saves_publish_the_same_checkpoints_and_resume_the_same_run(whole, tmp_path):
    run_dir = tmp_path / "run"
    launch(run_dir, "trainer.async_save=true")  # 2 and 4 in the background, 6 (the last) not
    assert names(run_dir) == ["step_00000002", "step_00000004", "step_00000006"]
    for path in (run_dir / "checkpoints").iterdir():
        ckpt.verify_checkpoint(path, rank=0, world_size=1)
    assert train_losses(run_dir) == train_losses(whole)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    (run_dir / "summary.json").unlink()
    launch(run_dir, "trainer.async_save=true")  # resumes from step 4, written in the background
    assert train_losses(run_dir) == train_losses(whole)


@pytest.mark.slow
def test_an_async_save_that_fails_stops_the_run_at_the_next_save(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(
        run_dir,
        "trainer.async_save=true",
        fault="save:after_shards:2@0:io_error",
        expect_rc=SAVE_FAILED_EXIT_STATUS,
    )
    (line,) = error_lines(proc)
    assert line.startswith("error: checkpoint of step 2 not saved: rank 0: EIO")
    assert names(run_dir) == [".tmp_step_00000002"]
    assert max(train_losses(run_dir)) == 4  # found at step 4's save, before it is written


@pytest.mark.slow
@pytest.mark.distributed
def test_async_saves_on_two_ranks_resume_the_same_run(tmp_path):
    """The background writes' collectives run on a group of their own while the ranks train."""
    run_dir = tmp_path / "run"
    two_ranks = on_two_ranks(run_dir, "trainer.global_batch_size=8", "trainer.async_save=true")
    subprocess.run(two_ranks, cwd=REPO, env=ENV, capture_output=True, timeout=600, check=True)
    assert names(run_dir) == ["step_00000002", "step_00000004", "step_00000006"]
    for path in (run_dir / "checkpoints").iterdir():
        ckpt.verify_checkpoint(path, rank=0, world_size=1)
    whole = train_losses(run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    (run_dir / "summary.json").unlink()
    subprocess.run(two_ranks, cwd=REPO, env=ENV, capture_output=True, timeout=600, check=True)
    assert train_losses(run_dir) == whole
