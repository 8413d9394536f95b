"""The CPU study's driver (repro/cpu_study/study.py): its search brackets each optimum."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from repro.cpu_study import study as driver
from repro.cpu_study.study import METHODS, Method, Setting, Study
from repro.runs import Point, collect, run_dir_fields
from train.summary import write_diverged


def fake_study(tmp_path: Path, ppl) -> tuple[Study, list[Setting]]:
    """A study whose runs return ``ppl(setting)`` instantly, recording what was run."""
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=2)
    ran: list[Setting] = []

    def run(stage, name, optim, setting, seed, overrides=()):
        ran.append(setting)
        return ppl(setting)

    study.run = run
    return study, ran


def bowl(best_lr: float, best_alpha: float | None = None, best_gap: int | None = None):
    def ppl(s: Setting) -> float:
        value = 100 + 10 * math.log2(s.lr / best_lr) ** 2
        if best_alpha is not None:
            value += 5 * abs(math.log2(s.alpha / best_alpha))
        if best_gap is not None and s.gap != best_gap:
            value += 3
        return value

    return ppl


def test_lr_search_walks_to_an_interior_optimum(tmp_path):
    method = Method("muon", "muon", 1e-2)
    study, ran = fake_study(tmp_path, bowl(best_lr=1e-2 / 8))
    best = study.search(method)
    assert best == Setting(1e-2 / 8, None, None)
    lrs = {s.lr for s in ran}
    assert {best.lr / 2, best.lr * 2} <= lrs  # bracketed on both sides
    assert max(lrs) == 2e-2  # it started at 1e-2 and only walked down


def test_search_over_lr_alpha_and_gap(tmp_path):
    galore = next(m for m in METHODS if m.name == "galore_1_4")
    study, ran = fake_study(tmp_path, bowl(best_lr=2e-2, best_alpha=0.5, best_gap=20))
    best = study.search(galore)
    assert best == Setting(2e-2, 0.5, 20)
    for neighbour in best.neighbours(galore):
        assert neighbour in ran


def test_alpha_is_extended_past_the_papers_grid_until_bracketed(tmp_path):
    """FOAM's best alpha below the paper's lowest (0.25) is found, with both neighbours run."""
    foam2 = next(m for m in METHODS if m.name == "foam2")
    study, ran = fake_study(tmp_path, bowl(best_lr=5e-3, best_alpha=0.0625))
    best = study.search(foam2)
    assert best == Setting(5e-3, 0.0625, None)
    assert Setting(5e-3, 0.03125, None) in ran and Setting(5e-3, 0.125, None) in ran
    assert Setting(5e-3, 1.0, None) not in ran  # it walked away from the paper's upper edge


def test_the_search_moves_the_non_matrix_lr_at_a_fixed_matrix_lr(tmp_path):
    """Alpha only scales the matrices' lr, so the method has two lrs: lr (embeddings, head,
    norms) and lr x alpha (matrices). An optimum off both axes, where neither an lr step nor an
    alpha step alone improves on the start, is still found."""
    foam2 = next(m for m in METHODS if m.name == "foam2")  # starts at lr 5e-3, alpha 0.25

    def ppl(s: Setting) -> float:
        others, matrices = math.log2(s.lr / 1e-2), math.log2(s.lr * s.alpha / 1.25e-3)
        return 100 + others**2 + 4 * matrices**2

    study, ran = fake_study(tmp_path, ppl)
    best = study.search(foam2)
    assert best == Setting(1e-2, 0.125, None)
    assert set(best.neighbours(foam2)) <= set(ran)


def test_the_search_goes_on_from_the_best_run_so_far(tmp_path):
    """Finished search runs (here and committed) count: a neighbour the protocol adds later is
    run around the best point, not along the path that led to it; AdamW's directory holds the
    control's runs too, which AdamW's own search ignores."""
    adamw, control = METHODS[0], driver.CONTROL
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=2, finished=tmp_path / "committed")
    done = {
        (study.root, Setting(5e-3, 0.25, None)): 130.0,
        (study.finished, Setting(1e-2, 0.125, None)): 120.0,  # committed by an earlier session
        (study.root, Setting(2.5e-3, 1.0, None)): 150.0,
    }
    for (base, setting), ppl in done.items():
        run_dir = base / study.run_dir("search", "adamw", setting, 0).relative_to(study.root)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"final_val_ppl": ppl}))
    assert study.seed0_runs("search", control) == {s: ppl for (_, s), ppl in done.items()}
    assert study.seed0_runs("search", adamw) == {Setting(2.5e-3, 1.0, None): 150.0}
    study.dry_run = True
    assert study.search(control) is None
    # every neighbour of the committed best (1e-2, 0.125) but the one already run, (5e-3, 0.25)
    assert {p.name for p in study.planned} == {
        "lr0.005_alpha0.125_seed0",
        "lr0.02_alpha0.125_seed0",
        "lr0.01_alpha0.0625_seed0",
        "lr0.01_alpha0.25_seed0",
        "lr0.02_alpha0.0625_seed0",
    }


@pytest.mark.parametrize("earlier_ppl", [80.0, 95.0])
def test_the_walk_goes_on_from_the_best_full_length_run(tmp_path, earlier_ppl):
    """A full-length run made before the search moved away (FOAM-2's lr check at 5e-3) counts:
    where it beats the search's point at full length, the walk brackets the optimum around it;
    where it does not, the walk goes on from the search's point. Either way the search's point
    is run at full length."""
    foam2 = next(m for m in METHODS if m.name == "foam2")
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=2)
    earlier, searched = Setting(5e-3, 0.25, None), Setting(2e-2, 0.0625, None)
    run_dir = study.run_dir("final", "foam2", earlier, 0)
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"final_val_ppl": earlier_ppl}))
    at_search_length = bowl(best_lr=searched.lr, best_alpha=searched.alpha)
    ran: list[Setting] = []

    def run(stage, name, optim, setting, seed, overrides=()):
        if stage == "search":
            return at_search_length(setting)
        ran.append(setting)
        distance = abs(math.log2(setting.lr / earlier.lr)) + abs(
            math.log2(setting.alpha / earlier.alpha)
        )
        return 90.0 if setting == searched else earlier_ppl + distance

    study.run = run
    best = study.best_at_full_length(foam2)
    assert ran[0] == searched
    if earlier_ppl < 90:
        assert best == earlier
        assert set(earlier.walk_neighbours(foam2)) <= set(ran)
    else:
        assert best == searched
        assert earlier not in ran


@pytest.mark.parametrize("halvings", [1, 7, 8, 12])
def test_a_setting_is_the_value_its_run_gets(halvings):
    """Halved seven times, 0.25 has 7 digits (0.001953125): the name keeps them all, so the
    setting read back from its run directory is the setting, and doubling it again lands on the
    point one halving up, not on a near-duplicate of it."""
    setting = Setting(5e-3 / 2**halvings, 0.25 / 2**halvings, None)
    name = Point("m", "foam2", setting.lr, setting.alpha, 0, "foam2").run_dir(Path(".")).name
    assert run_dir_fields(name)[:2] == (setting.lr, setting.alpha)
    up = Setting(setting.lr * 2, setting.alpha * 2, None)
    assert up == Setting(5e-3 / 2 ** (halvings - 1), 0.25 / 2 ** (halvings - 1), None)
    command = driver.train_command(
        Point("m", "foam2", setting.lr, setting.alpha, 0, "foam2"), Path("."), 1, []
    )
    assert f"optim.alpha={0.25 / 2**halvings!r}" in command


def test_diverged_neighbours_count_as_worse(tmp_path):
    method = Method("adamw", "adamw", 2.5e-3, start_alpha=1.0)
    study, _ = fake_study(tmp_path, lambda s: math.inf if s.lr > 3e-3 else 100 + 1 / s.lr * 1e-3)
    assert study.search(method).lr == 2.5e-3


@pytest.mark.parametrize("diverged", [True, False])
def test_a_run_the_trainer_records_as_diverged_is_infinitely_bad_and_not_run_again(
    tmp_path, monkeypatch, diverged
):
    """Under torchrun the trainer's exit status 3 arrives as 1, like any failure: the trainer's
    diverged.json tells the two apart."""
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=1)
    launched = []
    git = subprocess.run

    def train(cmd, **kwargs):
        if cmd[0] == "git":  # write_diverged's git_sha
            return git(cmd, **kwargs)
        run_dir = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        launched.append(run_dir)
        if diverged:
            write_diverged(run_dir, 7, "step 7: loss nan, grad norm nan")
        return subprocess.CompletedProcess(cmd, returncode=1)

    monkeypatch.setattr(driver.subprocess, "run", train)
    setting = Setting(1e-1, 0.25, None)
    if not diverged:
        with pytest.raises(RuntimeError, match="exit status 1"):
            study.run("final", "foam2", "foam2", setting, 0)
        return
    assert study.run("final", "foam2", "foam2", setting, 0) == math.inf
    assert study.run("final", "foam2", "foam2", setting, 0) == math.inf
    assert len(launched) == 1


def test_the_protocol_is_what_protocol_md_says():
    overrides = driver.protocol(Path("/data"), driver.FINAL_STEPS, seed=2)
    assert "trainer.max_steps=1000" in overrides and "data.shuffle_seed=2" in overrides
    assert "data.seq_len=256" in overrides  # the paper's, from the trainer's schema
    tokens = 1000 * 16 * 256
    assert tokens == 4_096_000 and "trainer.global_batch_size=16" in overrides
    assert driver.GAPS == (200, 20) and driver.SEEDS == (0, 1, 2)
    text = (Path(__file__).resolve().parents[3] / "results" / "repro" / "PROTOCOL.md").read_text()
    assert "4,096,000 tokens" in text and "{200, 20}" in text


def test_runs_committed_by_an_earlier_session_count_as_done(tmp_path):
    finished = tmp_path / "committed"
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=1, finished=finished)
    setting = Setting(1e-2, 0.25, None)
    run_dir = study.run_dir("search", "foam2", setting, 0)
    assert study.result(run_dir) is None
    committed = finished / run_dir.relative_to(study.root)
    committed.mkdir(parents=True)
    (committed / "summary.json").write_text('{"final_val_ppl": 42.0}')
    assert study.result(run_dir) == 42.0
    assert collect(finished, tmp_path / "copy") == 1


def test_the_search_starts_where_the_protocol_says():
    apollo_mini = next(m for m in METHODS if m.name == "apollo_mini")
    assert apollo_mini.start() == Setting(5e-3, 64.0, 20)
    galore = next(m for m in METHODS if m.name == "galore_1_4")
    assert galore.start() == Setting(2e-2, 0.25, 200)  # the first of its gaps


def test_an_ablation_that_is_a_table2_method_at_the_same_point_is_not_run_twice(tmp_path):
    """FOAM-3's finals serve as the FOAM-3 ablation when its walk ended at FOAM-2's point."""
    best = Setting(5e-3, 0.25, None)
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=2)
    ran: list[tuple[str, Setting]] = []

    def run(stage, name, optim, setting, seed, overrides=()):
        ran.append((name, setting))
        # At both lengths FOAM-3 is best at FOAM-2's point and FOAM-Mini one lr step lower.
        target = 2.5e-3 if optim == "foam_mini" else 5e-3
        return bowl(target, 0.25)(setting)

    study.run = run
    study.ablations(best)
    names = {name for name, _ in ran}
    assert "ablation_foam3" not in names  # its twin, FOAM-3, chose the same point
    assert "ablation_foam_mini" in names and "ablation_foam1" in names
    assert {s for name, s in ran if name.startswith("ablation_")} == {best}
    assert driver.twin_method("foam2", ("optim.residual=false",)) is None


def test_the_finals_lr_and_alpha_are_walked_to_their_optimum_at_full_length(tmp_path, monkeypatch):
    """Every method's finals and FOAM-2's ablations sit at the lr and alpha that are best at
    1,000 steps, bracketed there at seed 0, even where the 500-step search preferred others."""
    monkeypatch.setattr(driver, "LOOKUP_SECONDS", 0)  # runs are instant here
    study = Study(tmp_path / "data", tmp_path / "runs", jobs=2)
    finals: set[tuple[str, float | None, int | None, float, int]] = set()

    def alpha_best(optim: str, stage: str) -> float:
        at_search = 64.0 if optim == "apollo_mini" else 0.25
        return at_search if stage == "search" else at_search * 2  # one alpha step up

    def run(stage, name, optim, setting, seed, overrides=()):
        if stage == "final":
            finals.add((name, setting.alpha, setting.gap, setting.lr, seed))
        best_lr = 5e-3 if stage == "search" else 5e-3 / 4  # the optimum moves by two lr steps
        alpha_cost = (
            0 if setting.alpha is None else abs(math.log2(setting.alpha / alpha_best(optim, stage)))
        )
        return 100 + 10 * math.log2(setting.lr / best_lr) ** 2 + alpha_cost + (setting.gap == 20)

    study.run = run
    study.all()
    best_lr = 5e-3 / 4
    finals_at: dict[str, set[tuple[float, float | None]]] = {}  # AdamW's dir has the control's
    for method in METHODS:
        if method.searches_alpha:
            best_alpha = alpha_best(method.optim, "final")
        else:
            best_alpha = method.start_alpha
        finals_at.setdefault(method.name, set()).add((best_lr, best_alpha))
        runs = {(lr, alpha, seed) for name, alpha, _, lr, seed in finals if name == method.name}
        assert {(best_lr, best_alpha, seed) for seed in driver.SEEDS} <= runs, method
        bracket = [(best_lr / 2, best_alpha), (best_lr * 2, best_alpha)]
        if method.searches_alpha:
            bracket += [(best_lr, best_alpha / 2), (best_lr, best_alpha * 2)]
        assert {(*point, 0) for point in bracket} <= runs, method  # bracketed at full length
    paper_lr = {
        (1e-2, alpha) for alpha in driver.PAPER_ALPHA_GRID
    }  # configs/paper_lr/foam.yaml, 60M
    assert {(lr, a, seed) for n, a, _, lr, seed in finals if n == "foam2"} >= {
        (*point, seed) for point in paper_lr for seed in driver.SEEDS
    }  # the paper's alpha figure at the paper's lr
    finals_at["foam2"] |= paper_lr
    for name, points in finals_at.items():  # no wasted seeds
        assert {(lr, a) for n, a, _, lr, seed in finals if n == name and seed > 0} == points
    ablations = {(lr, alpha) for name, alpha, _, lr, _ in finals if name.startswith("ablation_")}
    assert ablations == {(best_lr, 0.5)}  # FOAM-2's walked point


def test_the_papers_view_keeps_alpha_on_the_papers_grid(tmp_path):
    """The "as the paper tunes" view searches and walks like the other, but never leaves the
    paper's alpha grid, even where a lower alpha is better; it reads only in-grid runs."""
    foam2 = next(m for m in driver.PAPER_VIEW if m.name == "foam2")
    assert foam2.alpha_range == (0.25, 1.0)
    study, ran = fake_study(tmp_path, bowl(best_lr=5e-3, best_alpha=0.0625))
    best = study.best_at_full_length(foam2)
    assert best == Setting(5e-3, 0.25, None)  # on the grid's edge, as the paper's tuning allows
    assert min(s.alpha for s in ran) == 0.25 and max(s.alpha for s in ran) <= 1.0
    assert Setting(2.5e-3, 0.25, None) in ran and Setting(1e-2, 0.25, None) in ran  # lr bracketed
    apollo_mini = next(m for m in driver.PAPER_VIEW if m.name == "apollo_mini")
    assert apollo_mini.alpha_range == (64.0, 256.0)
    assert {m.name for m in driver.PAPER_VIEW} == {
        m.name for m in METHODS if m.searches_alpha and not m.name.endswith("_modulewise")
    }

    study = Study(tmp_path / "data", tmp_path / "runs2", jobs=2)
    for setting, ppl in ((Setting(4e-2, 0.0625, None), 80.0), (Setting(5e-3, 0.25, None), 90.0)):
        run_dir = study.run_dir("search", "foam2", setting, 0)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"final_val_ppl": ppl}))
    assert study.seed0_runs("search", foam2) == {Setting(5e-3, 0.25, None): 90.0}
    assert len(study.seed0_runs("search", driver.FOAM2)) == 2


def test_muon_and_adam_mini_get_the_module_wise_lr(tmp_path):
    """Equal freedom: Muon and Adam-mini search lr and alpha (with the diagonal) like the control,
    in directories of their own, their optim configs unchanged."""
    for name, optim in (("muon_modulewise", "muon"), ("adam_mini_modulewise", "adam_mini")):
        method = next(m for m in METHODS if m.name == name)
        assert method.optim == optim and method.searches_alpha and method.alpha_range is None
        study, ran = fake_study(tmp_path, bowl(best_lr=2e-2, best_alpha=0.125))
        assert study.search(method) == Setting(2e-2, 0.125, None)
        assert set(Setting(2e-2, 0.125, None).neighbours(method)) <= set(ran)
