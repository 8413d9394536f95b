"""repro/cpu_study/v4.py: v4's walks bracket each row in the directions the amendment names, read
v3's full-length runs as walk data, score the test split, and rank Q3's rows."""

import json
import math
import threading
from pathlib import Path

import pytest

from repro.cpu_study import cli as study_cli
from repro.cpu_study import v4 as study_v4
from repro.cpu_study.study import Setting, Study
from repro.cpu_study.v4 import (
    FULL,
    LONG,
    Q1_ROWS,
    Q2_ROWS,
    Q3_ROWS,
    StudyV4,
    eight_directions,
    matrices_only,
    q3_rank,
    two_lrs,
)
from tools.thread_check import command_overrides

FOAM2 = Q1_ROWS[0]
FULL_ADAM = Q3_ROWS[-1]


def lrs(settings: list[Setting]) -> set[tuple[float, float]]:
    """Each setting as (non-matrix lr, matrices' lr)."""
    return {(s.lr, s.lr * s.alpha) for s in settings}


def test_q1_brackets_in_all_eight_directions_of_lr_and_alpha():
    around = eight_directions(Setting(0.08, 0.03125, None), FOAM2.method)
    assert len(set(around)) == 8
    assert Setting(0.04, 0.0625, None) in around and Setting(0.16, 0.0625, None) in around
    assert Setting(0.04, 0.015625, None) in around  # both lrs down


def test_q2_moves_only_the_matrices_lr_and_q3_each_lr_alone():
    start = Setting(0.04, 0.0625, None)
    assert lrs(matrices_only(start, FOAM2.method)) == {(0.04, 0.00125), (0.04, 0.005)}
    assert lrs(two_lrs(start, FOAM2.method)) == {
        (0.02, 0.0025),
        (0.08, 0.0025),
        (0.04, 0.00125),
        (0.04, 0.005),
    }
    assert two_lrs(FULL_ADAM.start, FULL_ADAM.method) == [
        Setting(1.25e-3, 1.0, None),
        Setting(5e-3, 1.0, None),
    ]
    assert all(row.start.lr == study_v4.SHARED_LR for row in Q2_ROWS)


def test_every_v4_run_scores_the_test_split_and_v3s_validation_rows(tmp_path):
    study = StudyV4(tmp_path / "data", tmp_path / "runs", 2, long_data=tmp_path / "long")
    full, long = study.protocol(FULL, 3), study.protocol(LONG, 3)
    assert "trainer.eval_tokens=278528" in full and "trainer.test_tokens=400000" in full
    assert "trainer.max_steps=1000" in full and "trainer.eval_every=100" in full
    assert sum(o.startswith("trainer.eval_tokens=") for o in full) == 1
    assert "trainer.max_steps=10000" in long and "trainer.eval_every=500" in long
    assert f"data.path={tmp_path / 'long'}" in long and "data.shuffle_seed=3" in long


def test_q3_stopped_after_its_first_three_rows():
    assert [study_v4.Q3.cut(row) for row in Q3_ROWS] == [False] * 3 + [True] * 3
    assert not any(study_v4.Q1.cut(row) for row in Q1_ROWS)


def test_q3_rows_finish_in_their_order_each_rows_seeds_before_the_next_rows_walk():
    study = StudyV4(Path("d"), Path("r"), 2)
    control, full_adam = Setting(0.04, 0.0625, None), Setting(2.5e-3, 1.0, None)
    ranks = [q3_rank(r.method.name, r.start) for r in Q3_ROWS]
    assert ranks == list(range(len(Q3_ROWS)))
    assert q3_rank("adamw", control) == 1 and q3_rank("adamw", full_adam) == 5
    walk_q1 = study.priority(FULL, 0, "foam2", control)
    seed_q1 = study.priority(FULL, 5, "foam2", control)
    walk_foam2, seed_foam2 = (study.priority(LONG, seed, "foam2", control) for seed in (0, 1))
    walk_control, seed_control = (study.priority(LONG, seed, "adamw", control) for seed in (0, 2))
    walk_muon = study.priority(LONG, 0, "muon_modulewise", Setting(0.08, 0.03125, None))
    assert walk_q1 < seed_q1 < walk_foam2 < seed_foam2 < walk_control < seed_control < walk_muon
    assert study.priority(LONG, 0, "adamw", full_adam) > seed_control  # the last row, last
    assert study.handover_seconds() > 0  # so that a walk's seeds can ask before the next row
    assert Study(Path("d"), Path("r"), 2).handover_seconds() == 0  # v3's driver: no wait


def write_summary(run_dir: Path, ppl: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"final_val_ppl": ppl}))


def test_walks_go_on_from_v3s_full_length_runs_and_q2_keeps_the_shared_lr(tmp_path):
    v3 = tmp_path / "v3"
    method_dir = v3 / "final" / "llama_2m" / "foam2"
    for name, ppl in (("lr0.04_alpha0.0625", 79.6), ("lr0.08_alpha0.0625", 81.0)):
        write_summary(method_dir / f"{name}_seed0", ppl)
    write_summary(method_dir / "lr0.04_alpha0.0625_seed1", 70.0)  # not a walk run
    study = StudyV4(tmp_path / "data", tmp_path / "runs", 2, finished=tmp_path / "v4", v3_runs=v3)
    ran: list[Setting] = []

    def run(stage, name, optim, setting, seed, overrides=()):
        ran.append(setting)
        return 80.0 + abs(math.log2(setting.lr * setting.alpha / 0.0025))

    study.run = run
    assert study.walk(study_v4.Q1, FOAM2) == Setting(0.04, 0.0625, None)
    assert len(ran) == 7 and Setting(0.08, 0.0625, None) not in ran  # v3 ran it
    ran.clear()
    assert study.walk(study_v4.Q2, FOAM2) == Setting(0.04, 0.0625, None)
    assert {s.lr for s in ran} == {0.04}


def test_a_q3_walk_takes_one_run_at_a_time_and_moves_at_the_first_better_one(tmp_path):
    """The control's Q3 walk as it stood (PROTOCOL.md v4, "Walk note"): 2e-2/0.0625 beat
    2e-2/0.125, so the walk goes on from it with its first neighbour not yet run alone, and,
    that one being better, moves on without the other two."""
    control = Q3_ROWS[1]
    method_dir = tmp_path / "v4" / LONG / "llama_2m" / "adamw"
    walked = {"lr0.04_alpha0.0625": 37.11, "lr0.02_alpha0.125": 36.35}
    walked |= {"lr0.01_alpha0.25": 36.66, "lr0.02_alpha0.0625": 34.45}
    for name, ppl in walked.items():
        write_summary(method_dir / f"{name}_seed0", ppl)
    study = StudyV4(tmp_path / "data", tmp_path / "runs", 1, finished=tmp_path / "v4")
    ran: list[Setting] = []

    def run(stage, name, optim, setting, seed, overrides=()):
        assert stage == LONG and name == "adamw" and seed == 0
        ran.append(setting)
        return 34.0 if setting == Setting(0.01, 0.125, None) else 40.0

    study.run = run
    assert study.walk(study_v4.Q3, control) == Setting(0.01, 0.125, None)
    assert ran == [
        Setting(0.01, 0.125, None),
        Setting(0.005, 0.25, None),
        Setting(0.01, 0.0625, None),
    ]


def test_a_walk_in_rounds_asks_for_every_neighbour_at_once(tmp_path):
    """Without ``one_at_a_time`` (the 1,000-step questions) a walk's neighbours run together:
    each run below returns only once all four have been asked for."""
    control = Q3_ROWS[1]
    together = threading.Barrier(4, timeout=10)

    def run(stage, name, optim, setting, seed, overrides=()):
        together.wait()
        return 40.0

    study = StudyV4(tmp_path / "data", tmp_path / "runs", 4, finished=tmp_path / "v4")
    study.run = run
    seen = {control.start: 37.0}
    assert study.descend(LONG, control.method, control.start, two_lrs, seen) == control.start


def test_q3_needs_its_pinned_corpus_and_v4_its_test_split(tmp_path, monkeypatch, capsys):
    (tmp_path / "en").mkdir()
    assert "is not the pinned f228d6aed08aa422" in study_v4.long_corpus_mismatch(tmp_path)
    assert "test split digest" in study_v4.test_split_mismatch(tmp_path)
    monkeypatch.setattr(study_cli, "environment_mismatch", lambda: None)
    monkeypatch.setattr(study_cli, "data_mismatch", lambda _: None)
    with pytest.raises(SystemExit):
        study_cli.main(["--data", str(tmp_path), "--long-data", str(tmp_path), "--plan"])
    assert "--long-data needs --v4" in capsys.readouterr().err


def test_the_plan_lists_each_runs_command_for_the_thread_check(tmp_path, monkeypatch, capsys):
    for check in ("environment_mismatch", "data_mismatch", "test_split_mismatch"):
        monkeypatch.setattr(study_cli, check, lambda *_: None)
    monkeypatch.setattr(study_cli, "long_corpus_mismatch", lambda _: None)
    (tmp_path / "en").mkdir()
    args = ["--v4", "--data", str(tmp_path), "--long-data", str(tmp_path / "long")]
    args += ["--root", str(tmp_path / "runs"), "--finished", str(tmp_path / "none")]
    assert study_cli.main([*args, "--plan"]) == 0
    *dirs, count = capsys.readouterr().out.splitlines()
    assert study_cli.main([*args, "--plan", "--commands"]) == 0
    *commands, same_count = capsys.readouterr().out.splitlines()
    assert count == same_count == f"{len(dirs)} runs can start now" and len(dirs) > len(Q3_ROWS)
    overrides = [command_overrides(command) for command in commands]
    run_dirs = {
        o.split("=", 1)[1] for run in overrides for o in run if o.startswith("hydra.run.dir=")
    }
    assert run_dirs == set(dirs)  # the same runs (the dry run's threads list them in any order)
    q3 = [run for run in overrides if f"data.path={tmp_path / 'long'}" in run]
    assert all("trainer.max_steps=10000" in run for run in q3)
    assert len(q3) == 3  # the start of each row Q3 ran; the rows cut when it stopped run nothing
    assert {o for run in q3 for o in run if o.startswith("+optim=")} >= {
        "+optim=foam2",
        "+optim=muon",
    }
    with pytest.raises(SystemExit):
        study_cli.main([*args, "--commands"])
    assert "--commands lists the plan's commands: it needs --plan" in capsys.readouterr().err
