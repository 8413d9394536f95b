"""scripts/reproduce_cpu.py: the coordinate search brackets each method's optimum."""

import contextlib
import gzip
import json
import math
import subprocess
import threading
import time
from pathlib import Path

import pytest

from repro import reproduce_cpu, study_cli
from repro.reproduce_cpu import METHODS, Method, Setting, Study
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
    adamw, control = METHODS[0], reproduce_cpu.CONTROL
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
    command = reproduce_cpu.train_command(
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

    monkeypatch.setattr(reproduce_cpu.subprocess, "run", train)
    setting = Setting(1e-1, 0.25, None)
    if not diverged:
        with pytest.raises(RuntimeError, match="exit status 1"):
            study.run("final", "foam2", "foam2", setting, 0)
        return
    assert study.run("final", "foam2", "foam2", setting, 0) == math.inf
    assert study.run("final", "foam2", "foam2", setting, 0) == math.inf
    assert len(launched) == 1


def test_the_protocol_is_what_protocol_md_says():
    overrides = reproduce_cpu.protocol(Path("/data"), reproduce_cpu.FINAL_STEPS, seed=2)
    assert "trainer.max_steps=1000" in overrides and "data.shuffle_seed=2" in overrides
    tokens = 1000 * 16 * 256
    assert tokens == 4_096_000 and "trainer.global_batch_size=16" in overrides
    assert reproduce_cpu.GAPS == (200, 20) and reproduce_cpu.SEEDS == (0, 1, 2)
    text = (Path(__file__).resolve().parents[1] / "results" / "repro" / "PROTOCOL.md").read_text()
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


def test_a_corpus_that_is_not_the_studys_is_refused(tmp_path, monkeypatch, capsys):
    data = tmp_path / "mirror"
    (data / "en").mkdir(parents=True)
    with gzip.open(data / "en" / "c4-train.00000-of-00001.json.gz", "wt") as f:
        f.write(json.dumps({"text": "Other text.", "timestamp": "", "url": "u"}) + "\n")
    assert "corpus digest" in reproduce_cpu.data_mismatch(data)
    monkeypatch.setattr(study_cli, "environment_mismatch", lambda: None)
    with pytest.raises(SystemExit):
        study_cli.main(["--data", str(data), "--plan"])
    assert "is not the study's" in capsys.readouterr().err
    # the right text, but a tokenizer trained differently (another sentencepiece)
    monkeypatch.setattr(reproduce_cpu, "corpus_digest", lambda _: reproduce_cpu.CORPUS_DIGEST)
    monkeypatch.setattr(reproduce_cpu, "tokenizer_sha256", lambda *_: "0" * 64)
    assert "sentencepiece" in reproduce_cpu.data_mismatch(data)
    monkeypatch.setattr(
        reproduce_cpu, "tokenizer_sha256", lambda *_: reproduce_cpu.TOKENIZER_SHA256
    )
    assert reproduce_cpu.data_mismatch(data) is None


def test_packages_other_than_the_studys_are_refused(tmp_path):
    pins = tmp_path / "environment.txt"
    pins.write_text(f"pytest=={pytest.__version__}\nno-such-package==1.0\n# a comment\n")
    message = reproduce_cpu.environment_mismatch(pins)
    assert message is not None and "no-such-package missing (study: 1.0)" in message
    assert "pytest" not in message.split(";")[0]  # the installed pytest is the pinned one
    pins.write_text(f"pytest=={pytest.__version__}\n")
    assert reproduce_cpu.environment_mismatch(pins) is None


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
    assert reproduce_cpu.twin_method("foam2", ("optim.residual=false",)) is None


def test_the_finals_lr_and_alpha_are_walked_to_their_optimum_at_full_length(tmp_path, monkeypatch):
    """Every method's finals and FOAM-2's ablations sit at the lr and alpha that are best at
    1,000 steps, bracketed there at seed 0, even where the 500-step search preferred others."""
    monkeypatch.setattr(reproduce_cpu, "LOOKUP_SECONDS", 0)  # runs are instant here
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
        assert {(best_lr, best_alpha, seed) for seed in reproduce_cpu.SEEDS} <= runs, method
        bracket = [(best_lr / 2, best_alpha), (best_lr * 2, best_alpha)]
        if method.searches_alpha:
            bracket += [(best_lr, best_alpha / 2), (best_lr, best_alpha * 2)]
        assert {(*point, 0) for point in bracket} <= runs, method  # bracketed at full length
    paper_lr = {
        (1e-2, alpha) for alpha in reproduce_cpu.PAPER_ALPHA_GRID
    }  # configs/paper_lr/foam.yaml, 60M
    assert {(lr, a, seed) for n, a, _, lr, seed in finals if n == "foam2"} >= {
        (*point, seed) for point in paper_lr for seed in reproduce_cpu.SEEDS
    }  # the paper's alpha figure at the paper's lr
    finals_at["foam2"] |= paper_lr
    for name, points in finals_at.items():  # no wasted seeds
        assert {(lr, a) for n, a, _, lr, seed in finals if n == name and seed > 0} == points
    ablations = {(lr, alpha) for name, alpha, _, lr, _ in finals if name.startswith("ablation_")}
    assert ablations == {(best_lr, 0.5)}  # FOAM-2's walked point


@pytest.mark.parametrize("start", ["cores busy", "paused at the start"])
def test_freed_slots_go_to_the_runs_later_runs_wait_on(start):
    """A search run asking last starts before the seeds that asked first."""
    slots = reproduce_cpu.PrioritySlots(2)
    started: list[tuple[str, int]] = []
    asked = [("final", 2), ("final", 1), ("final", 0), ("search", 0)]

    def run(stage: str, seed: int) -> None:
        with slots.hold(reproduce_cpu.run_priority(stage, seed)):
            started.append((stage, seed))

    with contextlib.ExitStack() as stack:
        if start == "paused at the start":
            stack.enter_context(slots.paused())
        else:
            stack.enter_context(slots.hold((0, 0)))
            stack.enter_context(slots.hold((0, 0)))
        threads = []
        for stage, seed in asked:
            threads.append(threading.Thread(target=run, args=(stage, seed)))
            threads[-1].start()
            while slots.waiting + len(started) < len(threads):  # each asks before the next
                time.sleep(0.001)
    for thread in threads:
        thread.join(timeout=10)
    assert started == [("search", 0), ("final", 0), ("final", 1), ("final", 2)]


def test_every_slot_is_used_when_runs_wait():
    slots = reproduce_cpu.PrioritySlots(2)
    inside, most = 0, 0
    guard = threading.Lock()

    def run() -> None:
        nonlocal inside, most
        with slots.hold((1, 1)):
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.02)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert most == 2 and slots.waiting == 0


def test_the_papers_view_keeps_alpha_on_the_papers_grid(tmp_path):
    """The "as the paper tunes" view searches and walks like the other, but never leaves the
    paper's alpha grid, even where a lower alpha is better; it reads only in-grid runs."""
    foam2 = next(m for m in reproduce_cpu.PAPER_VIEW if m.name == "foam2")
    assert foam2.alpha_range == (0.25, 1.0)
    study, ran = fake_study(tmp_path, bowl(best_lr=5e-3, best_alpha=0.0625))
    best = study.best_at_full_length(foam2)
    assert best == Setting(5e-3, 0.25, None)  # on the grid's edge, as the paper's tuning allows
    assert min(s.alpha for s in ran) == 0.25 and max(s.alpha for s in ran) <= 1.0
    assert Setting(2.5e-3, 0.25, None) in ran and Setting(1e-2, 0.25, None) in ran  # lr bracketed
    apollo_mini = next(m for m in reproduce_cpu.PAPER_VIEW if m.name == "apollo_mini")
    assert apollo_mini.alpha_range == (64.0, 256.0)
    assert {m.name for m in reproduce_cpu.PAPER_VIEW} == {
        m.name for m in METHODS if m.searches_alpha and not m.name.endswith("_modulewise")
    }

    study = Study(tmp_path / "data", tmp_path / "runs2", jobs=2)
    for setting, ppl in ((Setting(4e-2, 0.0625, None), 80.0), (Setting(5e-3, 0.25, None), 90.0)):
        run_dir = study.run_dir("search", "foam2", setting, 0)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"final_val_ppl": ppl}))
    assert study.seed0_runs("search", foam2) == {Setting(5e-3, 0.25, None): 90.0}
    assert len(study.seed0_runs("search", reproduce_cpu.FOAM2)) == 2


def test_muon_and_adam_mini_get_the_module_wise_lr(tmp_path):
    """Equal freedom: Muon and Adam-mini search lr and alpha (with the diagonal) like the control,
    in directories of their own, their optim configs unchanged."""
    for name, optim in (("muon_modulewise", "muon"), ("adam_mini_modulewise", "adam_mini")):
        method = next(m for m in METHODS if m.name == name)
        assert method.optim == optim and method.searches_alpha and method.alpha_range is None
        study, ran = fake_study(tmp_path, bowl(best_lr=2e-2, best_alpha=0.125))
        assert study.search(method) == Setting(2e-2, 0.125, None)
        assert set(Setting(2e-2, 0.125, None).neighbours(method)) <= set(ran)


def test_a_freed_slot_waits_for_the_runs_its_run_leads_to():
    """A walk's seeds are asked for only after its last run ends: with a handover wait they
    take its slot before a run of lower priority that has waited for hours; without it, not."""

    def order(handover_s: float) -> list[str]:
        slots = reproduce_cpu.PrioritySlots(1, handover_s=handover_s)
        started: list[str] = []

        def run(name: str, priority: tuple[int, ...]) -> None:
            with slots.hold(priority):
                started.append(name)

        def walk() -> None:
            with slots.hold((0,)):
                while slots.waiting < 1:  # the next row's run waits
                    time.sleep(0.001)
            time.sleep(0.05)  # the walk reads its summaries
            run("seed", (1,))  # what the walk's end leads to, asked for after its slot is free

        threads = [threading.Thread(target=walk), threading.Thread(target=run, args=("next", (2,)))]
        for thread in threads:
            thread.start()
            time.sleep(0.01)
        for thread in threads:
            thread.join(timeout=10)
        return started

    assert order(handover_s=0.5) == ["seed", "next"]
    assert order(handover_s=0.0) == ["next", "seed"]


def test_a_lane_at_its_limit_leaves_a_slot_to_the_other_lane_but_never_an_idle_one():
    """v4's 10,000-step runs hold one slot of two while a 1,000-step run waits, whatever their
    priority; with none waiting they take both."""
    slots = reproduce_cpu.PrioritySlots(2, lane_limits={"long": 1})
    started: list[str] = []
    release = {name: threading.Event() for name in ("long0", "long1", "long2", "short0")}

    def run(name: str, lane: str, priority: tuple[int, ...]) -> None:
        with slots.hold(priority, lane=lane):
            started.append(name)
            release[name].wait(timeout=10)

    with slots.paused():
        threads = [
            threading.Thread(target=run, args=args)
            for args in (("long0", "long", (0,)), ("long1", "long", (0,)), ("short0", "", (1,)))
        ]
        for thread in threads:
            thread.start()
        while slots.waiting < 3:
            time.sleep(0.001)
    while len(started) < 2:
        time.sleep(0.001)
    assert sorted(started) == ["long0", "short0"]  # long1 is first by priority, yet waits
    release["short0"].set()
    while len(started) < 3:  # nothing else waits: the long lane takes the freed slot
        time.sleep(0.001)
    assert started[-1] == "long1"
    threads.append(threading.Thread(target=run, args=("long2", "long", (0,))))
    threads[-1].start()
    while slots.waiting < 1:
        time.sleep(0.001)
    release["long0"].set()
    while len(started) < 4:
        time.sleep(0.001)
    assert started[-1] == "long2"
    for name in ("long1", "long2"):
        release[name].set()
    for thread in threads:
        thread.join(timeout=10)
