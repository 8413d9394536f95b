"""tools/thread_check.py: a run's command repeated at several thread counts, numbers compared bit for bit."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import TINY
from tools import thread_check
from tools.thread_check import (
    Numbers,
    check_overrides,
    command_overrides,
    first_difference,
    how_far,
)


def recorded_run(tmp_path: Path, overrides: list[str]) -> Path:
    """A run directory as far as the check reads it: Hydra's record of the overrides."""
    run_dir = tmp_path / "recorded"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return run_dir


def test_the_check_keeps_the_runs_settings_and_sets_its_own_length_and_directory():
    recorded = [
        "+model=llama_2m",
        "+optim=foam2",
        "optim.lr=0.02",
        "hydra.run.dir=/runs/x",
        "trainer.resume=auto",
        "trainer.max_steps=10000",
        "trainer.save_every=100",
        "trainer.eval_every=500",
        "trainer.test_tokens=10000000",
        "logger=wandb",
    ]
    assert check_overrides(recorded, 120, Path("/scratch/t2")) == [
        "+model=llama_2m",
        "+optim=foam2",
        "optim.lr=0.02",
        "hydra.run.dir=/scratch/t2",
        "trainer.max_steps=120",
        "trainer.save_every=0",
        "trainer.save_every_minutes=0",
        "trainer.eval_every=0",
        "trainer.test_tokens=0",
        "logger=none",
    ]


def numbers(losses: list[float], val_loss: float | None = 5.5) -> Numbers:
    return Numbers([(10 * (i + 1), x) for i, x in enumerate(losses)], val_loss, 0.5)


def test_the_first_difference_is_named_and_equal_numbers_have_none():
    assert first_difference(numbers([6.0, 5.9]), numbers([6.0, 5.9])) is None
    assert first_difference(numbers([6.0, 5.9]), numbers([6.0, 5.9 + 1e-15])) == (
        f"training loss at step 20: 5.9 against {5.9 + 1e-15!r}"
    )
    assert first_difference(numbers([6.0]), numbers([6.0], 5.25)) == (
        "final validation loss: 5.5 against 5.25"
    )
    assert first_difference(numbers([6.0]), numbers([6.0, 5.9])) == "they logged different steps"


def test_how_far_names_the_largest_training_loss_gap_and_both_validation_losses():
    assert how_far(numbers([6.0, 5.9, 5.8]), numbers([6.0, 5.875, 5.75], 5.25)) == (
        "largest training-loss gap 0.05 (step 30); final validation loss 5.5 against 5.25"
    )
    assert how_far(numbers([]), numbers([], 5.25)) == "final validation loss 5.5 against 5.25"


def test_repeats_that_differ_exit_1_saying_where_they_part_and_how_far(
    tmp_path, capsys, monkeypatch
):
    ran = {1: numbers([6.0, 5.9]), 2: numbers([6.0, 5.9 + 1e-3], 5.5 + 2e-3)}
    monkeypatch.setattr(thread_check, "repeat", lambda *args: ran[args[-1]])
    command = f"python train/pretrain.py {' '.join(TINY)}"
    assert thread_check.main(["--command", command, "--out", str(tmp_path)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == [
        f"1 and 2 threads differ: training loss at step 20: 5.9 against {5.9 + 1e-3!r}",
        f"  largest training-loss gap 0.001 (step 20); final validation loss 5.5 against "
        f"{5.5 + 2e-3!r}",
    ]


def test_a_command_lines_overrides_are_what_follows_the_trainer_however_it_is_launched():
    launched = (
        "/v/bin/python -m torch.distributed.run --standalone --nproc_per_node=1 "
        "/study/train/pretrain.py +model=llama_2m 'optim.lr=0.02' hydra.run.dir=/runs/a"
    )
    assert command_overrides(launched) == [
        "+model=llama_2m",
        "optim.lr=0.02",
        "hydra.run.dir=/runs/a",
    ]
    assert command_overrides("python train/pretrain.py") == []
    assert command_overrides("python -m torch.distributed.run other.py +model=x") is None


@pytest.mark.parametrize("given", ["--like", "--command"])
def test_a_tiny_run_repeated_agrees_with_itself_and_the_check_runs_its_own_length(
    tmp_path, capsys, given
):
    long_run = [*TINY, "+optim=adamw", "trainer.max_steps=500", "trainer.eval_every=100"]
    recorded = [*long_run, f"hydra.run.dir={tmp_path / 'elsewhere'}"]
    if given == "--like":
        which = str(recorded_run(tmp_path, recorded))
    else:
        which = shlex.join(
            ["python", "-m", "torch.distributed.run", "train/pretrain.py", *recorded]
        )
    out = tmp_path / "check"
    argv = [given, which, "--threads", "1", "1", "--steps", "4", "--out", str(out)]
    assert thread_check.main(argv) == 0
    printed = capsys.readouterr().out
    assert "the same numbers at 1, 1 threads: the training loss at 4 logged steps" in printed
    rows = [
        json.loads(line) for line in (out / "threads1" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "1"], "--threads: at least two counts, each at least 1"),
        (["--steps", "0"], "--steps 0: needs at least 1"),
        (["--trainer", "nowhere.py"], "--trainer nowhere.py: no such file"),
    ],
)
def test_a_bad_command_line_is_refused_in_one_line(tmp_path, capsys, argv, message):
    like = recorded_run(tmp_path, TINY)
    with pytest.raises(SystemExit) as exit_:
        thread_check.main(["--like", str(like), *argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith(message)


def test_a_directory_without_the_record_of_its_command_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        thread_check.main(["--like", str(tmp_path)])
    assert exit_.value.code == 2
    assert (
        "no .hydra/overrides.yaml (not a run directory of this trainer)" in capsys.readouterr().err
    )


def test_a_command_of_another_program_or_both_ways_at_once_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        thread_check.main(["--command", "python other.py +model=llama_2m"])
    assert exit_.value.code == 2
    assert "--command: no pretrain.py in it" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        thread_check.main(["--like", str(tmp_path), "--command", "python train/pretrain.py"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
