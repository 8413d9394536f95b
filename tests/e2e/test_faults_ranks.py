"""Issue #75, the running side: each fault injected (``FOAM_FAULT``, train/faults.py) on one or two
gloo ranks on the CPU, and what the run does about it: torchrun restarts that resume
(train/elastic.py), hangs that become restarts (train/distributed.py), skipped or stopped
updates (train/step_guard.py), replicas that stop agreeing (train/replicas.py).

The end-to-end runs compare a faulted run's losses with the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import foam
import models
from tests.helpers.cli import ENV, TINY, TORCHRUN, checkpoint_steps, train_losses
from train import elastic
from train.distributed import shutdown
from train.errors import TrainingDiverged
from train.replicas import ReplicasDiffer, check_replicas_agree
from train.schedule import build_scheduler
from train.state import TrainState
from train.step import train_step
from train.step_guard import GuardPolicy, OnNonFinite, OnSpike, StepGuard, repeated
from train.summary import DIVERGED_FILE

REPO = Path(__file__).resolve().parents[2]

CPU = torch.device("cpu")
VOCAB, T = 128, 16
RESTARTABLE = ("trainer.max_steps=8", "trainer.save_every=2", "trainer.eval_every=0")


def trainer(*overrides: str, optim: str = "adamw") -> list[str]:
    """The trainer's arguments (script path absolute: some tests run in another directory)."""
    return [str(REPO / "train" / "pretrain.py"), f"+optim={optim}", *TINY, *overrides]


def launch(
    cmd: list[str], *, fault: str | None = None, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess:
    full_env = {**ENV, "PYTHONPATH": str(REPO), **env}
    full_env.pop("FOAM_FAULT", None)
    if fault:
        full_env["FOAM_FAULT"] = fault
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=900)


def two_ranks(*args: str, restarts: int = 0) -> list[str]:
    return [TORCHRUN, "--standalone", "--nproc_per_node", "2", f"--max-restarts={restarts}", *args]


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The run's one ``error:`` line (the progress bar may be drawn after it)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    return line


# -- the hook's points in the trainer ----------------------------------------------------------


def test_a_fault_spec_that_does_not_parse_is_one_line_before_any_step(tmp_path):
    proc = launch(
        [sys.executable, *trainer(f"hydra.run.dir={tmp_path / 'run'}")], fault="step@0:exit"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert (
        error_line(proc)
        == "error: FOAM_FAULT='step@0:exit': the step point needs its step (step:K)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_the_eval_point_fires_as_that_evaluation_begins(tmp_path):
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", "trainer.max_steps=6", "trainer.eval_every=2"]
    proc = launch([sys.executable, *trainer(*args)], fault="eval:4@0:exit")
    assert proc.returncode == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [2]  # step 4's never began
    assert max(r["step"] for r in records) == 4


# -- restarts that resume ----------------------------------------------------------------------


def test_the_default_run_dir_is_keyed_on_the_rendezvous_id(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-4711")
    assert elastic.run_stamp() == "job-4711"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", elastic.TORCHRUN_DEFAULT_RUN_ID)
    assert elastic.run_stamp()[:2] == "20"  # the launch time: torchrun's shared default id
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert elastic.run_stamp()[:2] == "20"


def test_restarts_that_could_not_find_their_run_dir_are_refused_in_one_line(tmp_path):
    """torchrun's default rendezvous id is shared by every job that names none: with restarts on
    and no hydra.run.dir, the restart could not find its run (no torchrun needed to see it)."""
    proc = launch(
        [sys.executable, *trainer()],
        cwd=tmp_path,
        TORCHELASTIC_MAX_RESTARTS="1",
        TORCHELASTIC_RUN_ID="none",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_line(proc).startswith(
        "error: torchrun --max-restarts 1 without hydra.run.dir: a restart could not find"
    )
    assert not (tmp_path / "runs").exists()


def test_a_restarted_attempt_finds_its_own_store_not_the_dead_attempts(monkeypatch):
    """The agent's store still holds the first attempt's published address (a dead port): the
    second attempt's rank 1 reads it first, finds it dead, and meets rank 0 on its new store."""
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with socket_closed_port() as dead:
        agent.set(elastic.BOOTSTRAP_KEY, f"127.0.0.1:{dead}:stale")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    probed_dead = threading.Event()
    listening = elastic._listening

    def probe(host: str, port: int) -> bool:
        if port == dead:
            probed_dead.set()
        return listening(host, port)

    monkeypatch.setattr(elastic, "_listening", probe)
    stores: dict[int, dist.Store] = {}

    def rank1() -> None:
        stores[1] = elastic.attempt_store(1, 2, timedelta(seconds=120))

    waiting = threading.Thread(target=rank1)
    waiting.start()
    assert probed_dead.wait(timeout=120)  # rank 1 met the dead attempt's address first
    stores[0] = elastic.attempt_store(0, 2, timedelta(seconds=120))
    waiting.join(timeout=120)
    stores[0].set("hello", "from rank 0")
    assert stores[1].get("hello") == b"from rank 0"


class socket_closed_port:
    """A port nothing listens on any more."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        self._sock.close()
        return port

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    """The two-rank run every faulted one must reproduce."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    proc = launch(two_ranks(*trainer(*RESTARTABLE, f"hydra.run.dir={run_dir}")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_losses(run_dir)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_killed_mid_step_restarts_once_and_resumes_bit_for_bit(tmp_path, uninterrupted):
    """Rank 1 SIGKILLs itself as step 5 begins, under --max-restarts 1 and the default run dir:
    the restarted workers form their groups, resume from step 4 in the same directory and end
    with the uninterrupted run's losses."""
    proc = launch(
        two_ranks(*trainer(*RESTARTABLE), restarts=1), fault="step:5@1:sigkill", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # one directory for both attempts
    out = proc.stdout + proc.stderr
    assert out.count("resumed from") == 1 and "step_00000004 at step 4" in out
    assert "connectFullMesh" not in out
    assert train_losses(run_dir) == uninterrupted
    assert checkpoint_steps(run_dir) == [6, 8]


# -- hangs become restarts ---------------------------------------------------------------------


def freeze_a_rank(tmp_path: Path, bound: str, fault: str):
    """Two ranks with ``bound`` (a timeout option) at 10 s and rank 1 frozen by ``fault``: the job
    must exit non-zero within the bound + torchrun's 30 s SIGTERM grace + start-up (on a loaded
    CPU). Returns the run dir, the frozen launch and the relaunch to call once checked."""
    run_dir = tmp_path / "run"
    args = trainer(*RESTARTABLE, f"hydra.run.dir={run_dir}", f"{bound}=10")
    start = time.monotonic()
    frozen = launch(two_ranks(*args), fault=fault)
    elapsed = time.monotonic() - start
    assert frozen.returncode != 0
    assert elapsed < 10 + 30 + 300, elapsed
    return run_dir, frozen, lambda: launch(two_ranks(*args))


@pytest.mark.slow
@pytest.mark.distributed
def test_a_frozen_rank_ends_the_job_within_the_bound_and_the_next_launch_resumes(
    tmp_path, uninterrupted
):
    """Rank 1 SIGSTOPs itself as step 5 begins; trainer.collective_timeout_s=10: rank 0 gives up
    with one line, torchrun kills the frozen rank (after its 30 s SIGTERM grace), the job exits
    non-zero in well under torch's gloo default (30 min), nothing of step 5 is published, and the
    next launch resumes to the uninterrupted run's losses."""
    run_dir, frozen, relaunch = freeze_a_rank(
        tmp_path, "trainer.collective_timeout_s", "step:5@1:stop"
    )
    assert "error: rank 0: a collective failed (Timed out waiting 10000ms" in frozen.stderr
    assert checkpoint_steps(run_dir) == [2, 4]
    assert not list((run_dir / "checkpoints").glob(".tmp_*"))
    resumed = relaunch()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert train_losses(run_dir) == uninterrupted


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_frozen_mid_save_ends_the_job_within_the_bound_and_nothing_is_published(
    tmp_path, uninterrupted
):
    """Rank 1 SIGSTOPs itself after writing its shards of step 4's checkpoint; the save's group
    waits at most trainer.slow_io_timeout_s=10: rank 0 gives up, the job exits non-zero, step 4
    is never published (its temporary directory at most), and the next launch clears it and
    resumes from step 2 to the uninterrupted run's losses."""
    run_dir, frozen, relaunch = freeze_a_rank(
        tmp_path, "trainer.slow_io_timeout_s", "save:after_shards:4@1:stop"
    )
    assert "error: " in frozen.stderr, frozen.stderr[-3000:]
    assert checkpoint_steps(run_dir) == [2]
    resumed = relaunch()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list((run_dir / "checkpoints").glob(".tmp_*"))
    assert train_losses(run_dir) == uninterrupted


# -- updates that may not land -----------------------------------------------------------------


def tiny_model() -> torch.nn.Module:
    cfg = {**models.load_model_config("llama_tiny"), "vocab_size": VOCAB, "num_hidden_layers": 2}
    torch.manual_seed(0)
    return models.build_model(cfg)


def batch(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (2, T), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def steps_of(optim: str, plan: list[tuple[int, float | None]], policy: GuardPolicy):
    """Train on ``plan`` ((batch seed, loss scale) per step) under ``policy``; returns the
    model, optimizer, scheduler and state."""
    model = tiny_model()
    optimizer = foam.build_optimizer(optim, model, lr=1e-3)
    scheduler = build_scheduler(optimizer, max_steps=10)
    state = TrainState()
    guard = StepGuard(policy, state)
    for seed, scale in plan:
        train_step(
            model,
            optimizer,
            scheduler,
            iter([batch(seed)]),
            accumulation=1,
            device=CPU,
            world_size=1,
            autocast=lambda: torch.autocast("cpu", enabled=False),
            grad_clip=1.0,
            loss_scale=scale,
            allows=guard.allows,
        )
        state.step += 1
    return model, optimizer, scheduler, state


def flat_state(optimizer: torch.optim.Optimizer) -> list:
    out = []
    for entry in optimizer.state_dict()["state"].values():
        for key in sorted(entry):
            value = entry[key]
            out.append((key, value.clone() if isinstance(value, torch.Tensor) else value))
    return out


@pytest.mark.parametrize("optim", ["adamw", "foam"])
def test_a_skipped_update_leaves_weights_state_steps_and_schedule_as_if_never_drawn(optim):
    """Steps on batches 1, NaN(2), 3 under on_nonfinite=skip end where steps on 1, 3 do: the
    same weights, optimizer state (FOAM's and AdamW's step counts included) and lr."""
    skip = GuardPolicy(on_nonfinite=OnNonFinite.skip)
    model, optimizer, scheduler, state = steps_of(
        optim, [(1, None), (2, float("nan")), (3, None)], skip
    )
    ref_model, ref_optimizer, ref_scheduler, _ = steps_of(optim, [(1, None), (3, None)], skip)
    assert state.skipped_steps == 1 and state.skips_in_row == 0
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)
    mine, ref = flat_state(optimizer), flat_state(ref_optimizer)
    assert [k for k, _ in mine] == [k for k, _ in ref] and any(k == "step" for k, _ in mine)
    for (key, a), (_, b) in zip(mine, ref, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, key
    assert scheduler.last_epoch == ref_scheduler.last_epoch == 2
    assert scheduler.get_last_lr() == ref_scheduler.get_last_lr()


def test_skips_in_a_row_beyond_the_limit_stop_the_run():
    policy = GuardPolicy(on_nonfinite=OnNonFinite.skip, max_skips_in_row=2)
    nan = float("nan")
    with pytest.raises(TrainingDiverged, match=r"step 4: 3 updates in a row skipped \(loss nan"):
        steps_of("adamw", [(1, None), (2, nan), (3, nan), (4, nan)], policy)


def test_under_stop_a_judged_update_never_lands():
    """With the spike rule on (updates judged before they land), a NaN under the default stop
    raises at that step, before its update."""
    policy = GuardPolicy(on_spike=OnSpike.skip)
    with pytest.raises(TrainingDiverged, match=r"^step 2: loss nan, grad norm nan; stopped before"):
        steps_of("adamw", [(1, None), (2, float("nan"))], policy)


def judge(guard: StepGuard, loss: float, norm: float = 1.0) -> bool:
    landed = guard.allows(torch.tensor(loss, dtype=torch.float64), torch.tensor(norm))
    guard.state.step += 1
    return landed


def test_the_spike_rule_skips_beyond_k_sigma_of_the_landed_window():
    """Window [1, 2, 1, 2]: mean 1.5, deviation 0.5, so at 2 sigma the bound is 2.5."""
    guard = StepGuard(
        GuardPolicy(on_spike=OnSpike.skip, spike_sigma=2.0, spike_window=4), TrainState()
    )
    assert all(judge(guard, loss) for loss in (9.0, 1.0, 2.0, 1.0, 2.0))  # 9: window not full
    assert guard.state.recent == [[1.0, 1.0], [2.0, 1.0], [1.0, 1.0], [2.0, 1.0]]
    assert not judge(guard, 2.6)  # skipped, and kept out of the window
    assert judge(guard, 2.4)
    assert guard.state.recent[-1] == [2.4, 1.0] and guard.state.skipped_steps == 1
    assert not judge(guard, 1.5, norm=5.0)  # the gradient norm's window: all 1.0, deviation 0
    assert judge(guard, 0.1)  # a falling loss is never a spike


def test_a_divergence_at_the_step_the_last_attempt_stopped_at_says_so(tmp_path):
    err = TrainingDiverged("step 5: loss nan, grad norm nan; stopped before ...")
    assert repeated(err, tmp_path, 5) is err  # no earlier attempt
    (tmp_path / DIVERGED_FILE).write_text(json.dumps({"stopped_at_step": 5}))
    assert repeated(err, tmp_path, 6) is err
    again = str(repeated(err, tmp_path, 5))
    assert again.startswith(str(err)) and "previous attempt diverged at this step too" in again
    assert "\n" not in again


@pytest.mark.slow
def test_nan_skipped_through_the_cli_and_counted(tmp_path):
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", "trainer.max_steps=6", "trainer.eval_every=0"]
    proc = launch(
        [sys.executable, *trainer(*args, "trainer.on_nonfinite=skip")], fault="step:3@0:nan"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = "step 3: update skipped (loss nan, grad norm nan); 1 in a row, 1 in all"
    assert skipped in proc.stdout + proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert all(math.isfinite(x) for x in losses) and records[-2]["skipped_steps"] == 1


@pytest.mark.slow
def test_a_finite_spike_is_skipped_through_the_cli(tmp_path):
    """Step 7's loss (and gradients) x1000 on every rank, the spike rule on a 4-step window (at
    20 sigma: so short a window is noisy, and llama_tiny's gradient norm moves by 2x in a step)."""
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", "trainer.max_steps=8", "trainer.eval_every=0"]
    rule = ["trainer.on_spike=skip", "trainer.spike_window=4", "trainer.spike_sigma=20"]
    proc = launch([sys.executable, *trainer(*args, *rule)], fault="step:7@*:spike:1000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "step 7: update skipped (loss " in out and "beyond 20 sigma of the last 4" in out
    assert out.count("update skipped") == 1


@pytest.mark.slow
def test_a_resumed_run_that_diverges_at_the_same_step_says_so(tmp_path):
    """The default: a NaN at step 5 stops with exit 3 after step 4's checkpoint; the same command
    (a requeue) resumes, meets it again, and says so instead of looping silently."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, *trainer(*RESTARTABLE, f"hydra.run.dir={run_dir}")]
    first = launch(cmd, fault="step:5@0:nan")
    assert first.returncode == 3, first.stderr[-3000:]
    assert checkpoint_steps(run_dir) == [2, 4]
    assert "previous attempt" not in first.stderr
    again = launch(cmd, fault="step:5@0:nan")
    assert again.returncode == 3
    assert error_line(again).startswith("error: step 5: loss nan")
    assert "previous attempt diverged at this step too" in error_line(again)


# -- replicas that stop agreeing ---------------------------------------------------------------


def _replicas(rank: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    model = tiny_model()
    verdicts = []
    for step in (20, 40):
        try:
            check_replicas_agree(model, step=step)
            verdicts.append("agree")
        except ReplicasDiffer as err:
            verdicts.append(str(err))
        if rank == 1:  # the lowest mantissa bit of one element, after step 20's check
            model.get_parameter("model.layers.1.mlp.up_proj.weight").detach().view(torch.int32)[
                3, 7
            ] ^= 1
    out[rank] = verdicts
    shutdown()


@pytest.mark.slow
@pytest.mark.distributed
def test_one_flipped_bit_in_one_replica_stops_every_rank_naming_step_and_rank(tmp_path):
    """Two gloo ranks with the same model agree at step 20; rank 1 flips one bit; at step 40
    both ranks raise the same line, naming the step, the rank and the tensor."""
    out = mp.Manager().dict()
    mp.spawn(_replicas, args=(str(tmp_path / "init"), out), nprocs=2)
    assert out[0] == out[1]
    assert out[0][0] == "agree"
    assert out[0][1].startswith(
        "step 40: rank 1's parameters differ from rank 0's (1 tensor(s), first "
        "model.layers.1.mlp.up_proj.weight)"
    )


def test_replica_check_is_a_no_op_in_one_process():
    assert os.environ.get("WORLD_SIZE") is None
    check_replicas_agree(tiny_model(), step=1)
