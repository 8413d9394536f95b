"""End to end through the CLI (``python train/pretrain.py`` / ``torchrun``) on CPU with a tiny LLaMA."""

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from foam import fused
from tests.helpers.cli import (
    ENV,
    REPO,
    TINY,
    checkpoint_steps,
    command,
    logged_steps,
    one_line_error,
    records,
    run,
    stop_with,
    torchrun,
    train_losses,
)
from train.summary import DIVERGED_FILE

SUMMARY_KEYS = {
    "tokenizer",
    "final_val_loss",
    "final_val_ppl",
    "steps",
    "tokens",
    "tokens_per_s",
    "tokens_per_s_steady",
    "mfu_steady",
    "optimizer_state_bytes",
    "peak_memory_bytes",
    "wall_time_s",
    "step_s_estimated",
    "step_s_measured",
    "git_sha",
    "model",
    "optim",
    "lr",
    "alpha",
    "seed",
    "eval_history",
}


def test_tiny_run_writes_its_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    run(command(run_dir, "trainer.max_steps=3", "trainer.eval_every=2", "trainer.save_every=0"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert (
        summary["steps"] == 3 and summary["model"] == "llama_tiny" and summary["optim"] == "foam2"
    )
    assert (summary["lr"], summary["alpha"], summary["level"]) == (0.01, 0.25, 2)
    kernel = "cpp" if fused.kernel_available("cpu") else "eager"
    assert summary["foam_steps"] == {"matrices": kernel}  # which step FOAM's matrices took
    assert [e["step"] for e in summary["eval_history"]] == [2, 3]
    assert isinstance(summary["tokenizer"], str) and summary["tokenizer"]
    assert summary["final_val_ppl"] == pytest.approx(
        2.718281828 ** summary["final_val_loss"], rel=1e-6
    )
    assert sorted(train_losses(run_dir)) == [1, 2, 3]  # exactly max_steps optimizer steps
    first = records(run_dir)[0]
    assert (
        first["lr/matrices"] > 0
        and first["optimizer_state_bytes"] > 0
        and first["peak_memory_bytes"] > 0
    )
    assert "lr: 0.01" in (run_dir / "config.yaml").read_text()  # resolved
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000003"]


def test_a_diverged_run_says_where_and_writes_no_summary(tmp_path):
    """Exit status 3 and ``diverged.json``: under torchrun the status arrives as 1, so drivers
    read the file (scripts/reproduce_cpu.py, scripts/sweep.py)."""
    run_dir = tmp_path / "run"
    overrides = ("optim.lr=1e30", "trainer.max_steps=6", "trainer.eval_every=0")
    out = run(command(run_dir, *overrides, optim="adamw"), expect_rc=3)
    record = json.loads((run_dir / DIVERGED_FILE).read_text())
    assert record["error"].startswith(f"step {record['stopped_at_step']}: loss nan")
    assert record["error"] in out.stderr and record["git_sha"]
    assert not (run_dir / "summary.json").exists()


def test_release_semantics_trains_through_the_cli(tmp_path):
    """`+optim=foam2_release` reaches FOAM as semantics="release" (the checkpoint's groups)."""
    run_dir = tmp_path / "run"
    run(command(run_dir, "trainer.max_steps=2", "trainer.eval_every=0", optim="foam2_release"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["optim"] == "foam2_release"
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    dcp_to_torch_save(checkpoint, tmp_path / "whole.pt")  # the DCP checkpoint as one file
    groups = torch.load(tmp_path / "whole.pt", weights_only=True)["optimizer"]["param_groups"]
    release = {"semantics": "release", "fold_axis": "last", "bias_correction": "step_size"}
    assert all(g.items() >= release.items() for g in groups)
    assert all(math.isfinite(loss) for loss in train_losses(run_dir).values())


@pytest.mark.parametrize(
    ("optim", "flag"), [("foam2", "+model="), pytest.param(None, "+optim=", marks=pytest.mark.slow)]
)
def test_missing_model_or_optim_fails_with_a_message(tmp_path, optim, flag):
    model = [] if flag == "+model=" else ["+model=llama_tiny"]
    proc = run(command(tmp_path / "run", *model, optim=optim, tiny=False), expect_rc=2)
    assert flag in proc.stderr
    assert not (tmp_path / "run").exists()  # Hydra made it; the refused run takes it back


@pytest.mark.parametrize("args", [[], ["+optim=foam2"]])
def test_the_bare_command_names_the_flag_to_add(args):
    """What a new user types first, without a run directory of their own: the default directory's
    name reads the model choice, which must not turn a missing ``+model=`` into a traceback."""
    proc = run([sys.executable, "train/pretrain.py", *args], expect_rc=2)
    assert "+model=" in proc.stderr and "Traceback" not in proc.stderr


def test_batch_that_does_not_divide_fails_before_compute(tmp_path):
    proc = run(command(tmp_path / "run", "trainer.micro_batch_size=3"), expect_rc=2)
    assert (
        "trainer.global_batch_size=4" in proc.stderr and "trainer.micro_batch_size=3" in proc.stderr
    )
    assert not (tmp_path / "run").exists()


def test_missing_data_path_is_one_line_naming_the_key(tmp_path):
    missing = tmp_path / "nonexistent"
    proc = run(command(tmp_path / "run", "data=local", f"data.path={missing}"), expect_rc=2)
    assert one_line_error(proc).startswith(f"error: data.path={missing} does not exist")


def test_a_file_of_malformed_lines_is_one_line_with_the_skips(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n" * 7 + '{"url": "no text"}\n')
    proc = run(command(tmp_path / "run", "data=local", f"data.path={bad}"), expect_rc=2)
    line = one_line_error(proc)
    assert line.startswith(f"error: data.path={bad}: 0 of the first "), line
    assert "records skipped (bad_json: " in line and "no_text: 1)" in line


def test_a_level_beyond_every_axis_is_one_line_naming_the_largest_level(tmp_path):
    """llama_tiny's smallest matrices are 64 x 64: level 6 is the largest whose blocks fit."""
    proc = run(command(tmp_path / "run", "optim.level=20"), expect_rc=2)
    assert proc.stderr.strip().splitlines() == [one_line_error(proc)]
    assert one_line_error(proc).startswith("error: optim.level=20: level 20 makes blocks of")
    assert "the largest level these matrices allow is 6" in proc.stderr
    assert not (tmp_path / "run").exists()


# Each kind of config error met before the run starts: its overrides and how its one line starts.
# The CLI pays ~10 s of imports per call, so the first two run by default and the rest under
# -m slow; tests/train/test_config.py checks every kind's line in-process.
CONFIG_ERRORS = {
    "schema-name": (
        "+optim=foam_schema",
        "optim=foam_schema: no such optim config; did you mean foam_muon? (options: adam_mini, ",
    ),
    "misspelt-key": (
        "+optim=foam2 trainer.max_step=3",
        "trainer.max_step: not a key of trainer; did you mean trainer.max_steps?",
    ),
    "unknown-optim": ("+optim=fom2", "optim=fom2: no such optim config; did you mean foam2?"),
    "unknown-model": (
        "+optim=foam2 +model=lama_7b",
        "model=lama_7b: no such model config; did you mean llama_7b? (options: ",
    ),
    "unknown-data": ("+optim=foam2 data=c5", "data=c5: no such data config (options: c4, "),
    "unknown-trainer": (
        "+optim=foam2 trainer=papr",
        "trainer=papr: no such trainer config; did you mean paper? (options: cpu_debug, ",
    ),
    "appended-misspelt-key": (
        "+optim=foam2 +trainer.max_step=3",
        "trainer.max_step: not a key of trainer; did you mean trainer.max_steps?",
    ),
    "wrong-type": (
        "+optim=foam2 trainer.max_steps=abc",
        "trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted to Integer",
    ),
    "choice-outside-its-set": (
        "+optim=foam2 trainer.precision=fp16",
        "trainer.precision=fp16: Invalid value 'fp16', expected one of [bf16, bf16_mixed, fp32]",
    ),
    "unresolvable-value": (
        "+optim=foam2 optim.lr=${typo}",
        "optim.lr: Interpolation key 'typo' not found",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        pytest.param(*case, id=kind, marks=[] if i < 2 else [pytest.mark.slow])
        for i, (kind, case) in enumerate(CONFIG_ERRORS.items())
    ],
)
def test_config_errors_are_one_line_and_exit_2(tmp_path, overrides, line):
    """The README's promise, Hydra's own errors included: exactly one line on stderr, no run."""
    run_dir = tmp_path / "run"
    tiny = TINY[1:] if "+model=" in overrides else TINY
    cmd = command(run_dir, *tiny, *overrides.split(), optim=None, tiny=False)
    proc = run(cmd, expect_rc=2)
    assert proc.stderr.count("\n") == 1, proc.stderr[-4000:]
    assert proc.stderr.startswith(f"error: {line}"), proc.stderr
    assert not run_dir.exists()


@pytest.mark.slow
def test_invalid_fold_level_fails_before_compute(tmp_path):
    proc = run(command(tmp_path / "run", "optim.level=-1", optim="foam2"), expect_rc=2)
    assert "optim.level=-1" in proc.stderr


def test_nan_loss_stops_with_the_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = run(
        command(
            run_dir, "optim.lr=1e30", "trainer.save_every=1", "trainer.max_steps=6", optim="adamw"
        ),
        expect_rc=3,
    )
    assert "step 2: loss nan" in proc.stderr
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000001"]


CORRUPT_LINES = [b"{not json", json.dumps({"url": "no text"}).encode(), b"[1, 2, 3]"]


@pytest.fixture(scope="module")
def corpus_with_bad_records(tmp_path_factory) -> Path:
    """A local corpus whose training file holds ``CORRUPT_LINES`` among its first records."""
    root = tmp_path_factory.mktemp("corpus")
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "hum",
    ]
    docs = [
        json.dumps({"text": " ".join(words[(i * j) % len(words)] for j in range(20 + i % 30))})
        for i in range(1, 120)
    ]
    train = [line.encode() for line in docs[:80]]
    for position, bad in zip((1, 4, 9), CORRUPT_LINES, strict=True):
        train.insert(position, bad)
    (root / "train.jsonl").write_bytes(b"\n".join(train) + b"\n")
    (root / "validation.jsonl").write_text("\n".join(docs[80:]) + "\n")
    return root


RESUMABLE = (
    "trainer.max_steps=4",
    "trainer.save_every=2",
    "trainer.keep_last=0",
    "data.shuffle_buffer=0",
)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, corpus_with_bad_records) -> Path:
    """An uninterrupted 4-step run on the corpus with bad records, checkpointed at steps 2, 4."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    run(command(run_dir, "data=local", f"data.path={corpus_with_bad_records}", *RESUMABLE))
    return run_dir


def test_the_test_split_is_scored_once_at_the_end_beside_the_papers_figure(
    corpus_with_bad_records, tmp_path
):
    """``trainer.test_tokens``: the final evaluation also scores the mirror's test files, and
    every evaluation logs the harnesses' perplexity beside ours; without test files the run
    stops at start-up with one line naming the key."""
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_with_bad_records, corpus)
    validation = (corpus / "validation.jsonl").read_text().splitlines()
    (corpus / "test.jsonl").write_text("\n".join(reversed(validation[:20])) + "\n")
    run_dir = tmp_path / "run"
    args = ["data=local", f"data.path={corpus}", "trainer.max_steps=2", "trainer.eval_every=1"]
    run(command(run_dir, *args, "trainer.test_tokens=100000", "trainer.save_every=0"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["test_tokens"] < 100000  # the whole split: fewer tokens than asked
    assert summary["final_test_ppl"] == pytest.approx(math.exp(summary["final_test_loss"]))
    assert summary["final_test_ppl"] != summary["final_val_ppl"]
    assert [sorted(e) for e in summary["eval_history"]] == [
        ["step", "tokens", "val_loss", "val_loss_paper", "val_ppl", "val_ppl_paper", "val_tokens"]
    ] * 2
    assert summary["final_val_ppl_paper"] == summary["eval_history"][-1]["val_ppl_paper"]
    assert [r["step"] for r in records(run_dir) if "test_ppl" in r] == [2]  # once, at the end
    (corpus / "test.jsonl").unlink()
    proc = run(command(tmp_path / "no_test", *args, "trainer.test_tokens=10"), expect_rc=2)
    assert one_line_error(proc).startswith(f"error: data.path={corpus}: no test files")


def test_bad_records_are_skipped_and_counted_in_the_summary(whole_run):
    summary = json.loads((whole_run / "summary.json").read_text())
    assert summary["data_skipped"] == len(CORRUPT_LINES)
    assert summary["steps"] == 4 and math.isfinite(summary["final_val_loss"])


def test_resume_reproduces_the_uninterrupted_run(whole_run, corpus_with_bad_records, tmp_path):
    """A run stopped right after its step-2 checkpoint (its directory as a kill at that point
    leaves it: later checkpoints and the summary absent), then resumed by the same command,
    must retrace the uninterrupted run: model, optimizer, schedule, data position and RNG all
    come back. ``test_resume_after_a_kill_reproduces_the_uninterrupted_run`` (slow) kills
    a real process."""
    broken = tmp_path / "run"
    shutil.copytree(whole_run, broken)
    shutil.rmtree(broken / "checkpoints" / "step_00000004")
    (broken / "summary.json").unlink()
    resumed = run(command(broken, "data=local", f"data.path={corpus_with_bad_records}", *RESUMABLE))
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert "step_00000002" in resumed.stdout + resumed.stderr
    assert train_losses(broken) == train_losses(whole_run)
    assert sorted(train_losses(broken)) == [1, 2, 3, 4]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole_run, broken))
    for key in ("steps", "tokens", "final_val_loss", "eval_history", "data_skipped"):
        assert a[key] == b[key], key


@pytest.mark.slow
def test_nan_between_logs_is_caught_before_the_next_save(tmp_path):
    """The step's numbers are read at logs and saves only (train/step_stats.py): a NaN at step 2
    is reported at step 3's save, which then does not happen."""
    run_dir = tmp_path / "run"
    proc = run(
        command(
            run_dir,
            "optim.lr=1e30",
            "trainer.log_every=5",
            "trainer.save_every=3",
            "trainer.eval_every=0",
            "trainer.max_steps=6",
            optim="adamw",
        ),
        expect_rc=3,
    )
    assert "step 2: loss nan" in proc.stderr
    assert not list((run_dir / "checkpoints").glob("step_*"))
    assert sorted(train_losses(run_dir)) == [1]


@pytest.mark.slow
def test_resume_after_a_kill_reproduces_the_uninterrupted_run(tmp_path):
    overrides = (
        "trainer.max_steps=12",
        "trainer.save_every=2",
        "trainer.eval_every=6",
        "trainer.keep_last=2",
    )
    whole = tmp_path / "whole"
    run(command(whole, *overrides))

    broken = tmp_path / "broken"
    proc = subprocess.Popen(
        command(broken, *overrides),
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not (broken / "checkpoints" / "step_00000004").exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be interrupted"
    resumed = run(command(broken, *overrides))
    assert "resumed from" in resumed.stdout + resumed.stderr

    assert train_losses(broken) == train_losses(whole)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, broken))
    for key in ("steps", "tokens", "final_val_loss", "eval_history"):
        assert a[key] == b[key], key


REPRESENTATIVE = [
    "adamw",
    "foam_mini",
    "galore_1_4",
    "apollo_mini",
    "muon",
    "adam_mini",
    "foam8bit",
]


@pytest.mark.slow
@pytest.mark.parametrize("optim", REPRESENTATIVE)
def test_representative_optimizers_train(tmp_path, optim):
    run_dir = tmp_path / "run"
    run(
        command(
            run_dir,
            "trainer.max_steps=3",
            "trainer.save_every=0",
            "trainer.eval_every=1",
            optim=optim,
        )
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["optimizer_state_bytes"] > 0
    # it trains: the validation loss (same documents at every step) falls
    val = [e["val_loss"] for e in summary["eval_history"]]
    assert len(val) == 3 and val[-1] < val[0], val


@pytest.mark.slow
def test_resume_across_a_precision_change(tmp_path):
    """Saved in fp32, resumed in pure bf16: the loaded optimizer state follows the parameters."""
    run_dir = tmp_path / "run"
    base = ("trainer.save_every=1", "trainer.eval_every=0")
    run(command(run_dir, *base, "trainer.precision=fp32", "trainer.max_steps=2"))
    resumed = run(command(run_dir, *base, "trainer.precision=bf16", "trainer.max_steps=4"))
    assert "resumed from" in resumed.stdout + resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["precision"]) == (4, "bf16")
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4]


@pytest.mark.slow
def test_pure_bf16_run(tmp_path):
    run_dir = tmp_path / "run"
    run(command(run_dir, "trainer.precision=bf16", "trainer.max_steps=2", "trainer.save_every=0"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["precision"] == "bf16" and summary["steps"] == 2
    # bf16 weights: the saved model is bf16 too
    assert "bfloat16" in (run_dir / "pretrain.log").read_text()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_torchrun_matches_one_rank(tmp_path):
    """With one local file the global batch of a step is the same documents on 1 or 2 ranks (the
    stream is split by example, round-robin), so the token-weighted losses must agree."""
    corpus = tmp_path / "corpus.jsonl"
    text = Path(REPO.parent / "shared" / "data" / "tinyshakespeare.txt")
    paragraphs = (
        [p.strip() for p in text.read_text().split("\n\n") if p.strip()]
        if text.exists()
        else [f"document {i} " + "word " * (i % 50) for i in range(3000)]
    )
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    overrides = (
        "data=local",
        f"data.path={corpus}",
        "trainer.global_batch_size=8",
        "trainer.max_steps=3",
        "trainer.save_every=0",
        "trainer.eval_every=0",
    )
    one, two = tmp_path / "one", tmp_path / "two"
    run(command(one, *overrides, optim="adamw"))
    run(torchrun(command(two, *overrides, optim="adamw")))
    l1, l2 = train_losses(one), train_losses(two)
    assert sorted(l1) == sorted(l2) == [1, 2, 3]
    for step in l1:
        assert l2[step] == pytest.approx(l1[step], rel=1e-6)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s1["tokens"] == s2["tokens"] and s2["world_size"] == 2
    assert s2["final_val_loss"] == pytest.approx(s1["final_val_loss"], rel=1e-6)


@pytest.mark.slow
def test_wandb_offline_run_is_continued_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    base = ("logger=wandb", "trainer.save_every=1", "trainer.eval_every=0")
    run(command(run_dir, *base, "trainer.max_steps=2"))
    run_id = (run_dir / "wandb_id").read_text().strip()
    run(command(run_dir, *base, "trainer.max_steps=3"))  # resumes from step 2 (auto)
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs)
    assert sorted(train_losses(run_dir)) == [1, 2, 3]


def test_sigterm_saves_the_step_reached_and_exits_with_the_preemption_status(tmp_path):
    """A signal mid-run: the step finishes, its checkpoint is written, the exit status says
    "preempted"; before that, wall-clock checkpoints appeared without any step-based ones."""
    from train.preemption import PREEMPTED_EXIT_STATUS

    run_dir = tmp_path / "run"
    cmd = command(
        run_dir,
        "trainer.max_steps=1000",
        "trainer.save_every=0",
        "trainer.save_every_minutes=0.002",  # 0.12 s
        "trainer.keep_last=0",
        "trainer.eval_every=0",
        optim="adamw",
    )
    wall_clock_save = (lambda: bool(checkpoint_steps(run_dir)), "wall-clock checkpoint")
    proc = stop_with(cmd, run_dir, signal.SIGTERM, at_step=2, clock=wall_clock_save)
    assert proc.returncode == PREEMPTED_EXIT_STATUS, proc.stderr[-4000:]
    last = logged_steps(run_dir)
    steps = checkpoint_steps(run_dir)
    assert steps[-1] == last < 1000 and len(steps) >= 2  # wall-clock ones, then the signal's
    assert f"SIGTERM: stopped after step {last}" in proc.stdout + proc.stderr
    assert not (run_dir / "summary.json").exists()
    assert not list((run_dir / "checkpoints").glob(".tmp_*"))


@pytest.mark.slow
def test_resume_after_sigterm_reproduces_the_uninterrupted_run(tmp_path):
    from train.preemption import PREEMPTED_EXIT_STATUS

    overrides = ("trainer.max_steps=10", "trainer.save_every=0", "trainer.eval_every=5")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run(command(whole, *overrides))
    wandb = "logger=wandb"  # offline: the stopped wandb run is flushed and continued on resume
    stopped = stop_with(command(broken, *overrides, wandb), broken, signal.SIGUSR1, at_step=3)
    assert stopped.returncode == PREEMPTED_EXIT_STATUS, stopped.stderr[-4000:]
    assert checkpoint_steps(broken) == [logged_steps(broken)]
    run(command(broken, *overrides, wandb))
    assert train_losses(broken) == train_losses(whole)
    run_id = (broken / "wandb_id").read_text().strip()
    runs = sorted(p.name for p in (broken / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, broken))
    for key in ("steps", "tokens", "final_val_loss", "eval_history"):
        assert a[key] == b[key], key


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_resumes(tmp_path):
    """torchrun forwards SIGTERM to its workers; both finish the same step, save together and
    exit with the preemption status (torchrun itself then exits 1); the resumed run continues
    the uninterrupted run's losses."""
    overrides = ("trainer.max_steps=8", "trainer.save_every=0", "trainer.eval_every=0")

    def two_ranks(run_dir: Path) -> list[str]:
        return torchrun(command(run_dir, *overrides))

    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run(two_ranks(whole))
    stopped = stop_with(two_ranks(broken), broken, signal.SIGTERM, at_step=3)
    assert stopped.returncode == 1, stopped.stderr[-4000:]
    assert stopped.stderr.count("stopped: SIGTERM at step") == 2  # one line per rank
    assert checkpoint_steps(broken) == [logged_steps(broken)]
    run(two_ranks(broken))
    assert train_losses(broken) == train_losses(whole)
