"""repro/cpu_study/tables/v4.py: v4's questions read on the test split, points chosen on
validation, the family-wise reading per question, and the check that v4 repeats v3's runs."""

import json
import subprocess
from pathlib import Path

import pytest
from scipy.stats import ttest_rel

from repro.cpu_study import v4 as study_v4
from repro.cpu_study.make_tables import main as make_tables
from repro.cpu_study.tables.v4 import v4_table
from repro.cpu_study.tables.walks import walks_table
from repro.cpu_study.v4 import StudyV4
from repro.points import load_points
from repro.tables import curves


def write_run(root: Path, stage: str, method: str, point: str, seed: int, val: float, test: float):
    run_dir = root / stage / "llama_2m" / method / f"{point}_seed{seed}"
    run_dir.mkdir(parents=True)
    summary = {
        "final_val_ppl": val,
        "final_test_ppl": test,
        "seed": seed,
        "git_sha": "abc1234",
        "tokenizer": "spm:test",
        "wall_time_s": 900.0,
        "eval_history": [],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


FOAM2_TEST = [80.0, 81.0, 79.5, 80.5, 80.2, 79.8, 81.1, 80.9]
MUON_TEST = [78.0, 80.0, 78.5, 79.0, 78.1, 79.9, 79.2, 80.4]


@pytest.fixture
def study(tmp_path) -> tuple[Path, Path]:
    v4, v3 = tmp_path / "v4", tmp_path / "v3"
    for seed in range(8):
        write_run(v4, "final", "foam2", "lr0.04_alpha0.0625", seed, 79.0, FOAM2_TEST[seed])
        write_run(
            v4, "final", "muon_modulewise", "lr0.08_alpha0.03125", seed, 77.0, MUON_TEST[seed]
        )
    write_run(v4, "final", "apollo_1_4", "lr0.04_alpha0.25_gap20", 0, 80.0, 80.0)  # walking
    # FOAM-3 in Q2: two points with 3 seeds; validation prefers 0.03125, the test the other
    for seed in range(3):
        write_run(v4, "final", "foam3", "lr0.04_alpha0.03125", seed, 81.0, 95.0 + seed)
        write_run(v4, "final", "foam3", "lr0.04_alpha0.0625", seed, 83.0, 90.0 + seed)
    write_run(v3, "final", "foam2", "lr0.04_alpha0.0625", 0, 79.0001, 0.0)  # within 1e-5
    write_run(v3, "final", "muon_modulewise", "lr0.08_alpha0.03125", 0, 76.36, 0.0)
    return v4, v3


def test_q1_pairs_eight_seeds_on_the_test_split_holm_over_the_question(study):
    v4, v3 = study
    text = v4_table(load_points(v4, "final_test_ppl"), load_points(v3))
    q1 = text.split("## Q1")[1].split("## Q2")[0]
    diffs = [a - b for a, b in zip(FOAM2_TEST, MUON_TEST, strict=True)]
    mean = sum(diffs) / 8
    assert f"{mean:+.2f}" in q1 and "(n=8)" in q1
    p = ttest_rel(FOAM2_TEST, MUON_TEST).pvalue
    assert f"| {p:.3f} |" in q1  # the only comparison with both rows run: Holm over one
    assert "APOLLO-1/4 | not complete yet" in q1


def test_a_point_is_chosen_on_validation_never_on_the_test_split(study):
    v4, v3 = study
    q2 = v4_table(load_points(v4, "final_test_ppl"), load_points(v3)).split("## Q2")[1]
    foam3 = next(line for line in q2.splitlines() if line.startswith("| FOAM-3 |"))
    assert "alpha 0.03125" in foam3 and "96.00 ± 1.00 (n=3)" in foam3  # its worse test mean
    foam2 = next(line for line in q2.splitlines() if line.startswith("| FOAM-2 |"))
    assert "(n=3)" in foam2  # Q2 reads seeds 0-2 of the point Q1 ran 8 seeds at


def test_the_runs_v4_repeats_are_checked_against_v3(study):
    v4, v3 = study
    text = v4_table(load_points(v4, "final_test_ppl"), load_points(v3))
    assert "repeat a v3 run (same point and seed): 2; the same validation perplexity" in text
    assert "within a relative 1e-05: 1 (largest relative difference 8.4e-03)" in text
    assert "differs: muon_modulewise lr 0.08 alpha 0.03125 seed 0: v3 76.36, v4 77.0" in text


def test_make_tables_writes_v4_and_its_provenance(study, tmp_path):
    v4, v3 = study
    out = tmp_path / "tables"
    assert make_tables([str(v4), "--v4", str(v3), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["provenance.md", "v4.md", "walks.md"]
    assert "| abc1234 | spm:test | 23 |" in (out / "provenance.md").read_text()


def write_q3_seeds(v4: Path, method: str, point: str, test: float) -> None:
    """Seeds 0-2 of a Q3 (10,000-step) point, each with a validation curve."""
    for seed in range(3):
        write_run(v4, "long", method, point, seed, 40.0, test + seed)
        summary = v4 / "long/llama_2m" / method / f"{point}_seed{seed}" / "summary.json"
        record = json.loads(summary.read_text())
        record["eval_history"] = [
            {"step": step, "tokens": step * 4096, "val_ppl": 1000.0 / step**0.5 + seed}
            for step in (500, 1000, 1500)
        ]
        summary.write_text(json.dumps(record))


def test_q3_curves_are_drawn_once_a_row_has_its_three_seeds(study, tmp_path):
    v4, v3 = study
    out = tmp_path / "tables"
    assert make_tables([str(v4), "--v4", str(v3), "--out", str(out), "--curves"]) == 0
    assert not list(out.glob("*.png"))  # no Q3 row has its seeds yet
    write_q3_seeds(v4, "foam2", "lr0.04_alpha0.0625", 41.0)
    assert make_tables([str(v4), "--v4", str(v3), "--out", str(out), "--curves"]) == 0
    assert [p.name for p in out.glob("*.png")] == ["curves_q3_llama_2m.png"]
    assert "| FOAM-2 | 0.04, alpha 0.0625 | 42.00" in (out / "v4.md").read_text()


def test_q3_curves_draw_every_row_read_the_module_wise_one_too(study, tmp_path, monkeypatch):
    """Muon (module-wise) is not one of Table 2's rows; the curves once left it out."""
    v4, v3 = study
    write_q3_seeds(v4, "foam2", "lr0.04_alpha0.0625", 41.0)
    write_q3_seeds(v4, "muon_modulewise", "lr0.01_alpha0.25", 38.0)
    drawn = []

    def keep_labels(fig, path, ax):
        drawn.append([line.get_label() for line in ax.get_lines()])
        return path

    monkeypatch.setattr(curves, "save_figure", keep_labels)
    assert make_tables([str(v4), "--v4", str(v3), "--out", str(tmp_path), "--curves"]) == 0
    assert drawn == [["Muon, module-wise lr (n=3)", "FOAM-2 (n=3)"]]


def walk_runs(tmp_path: Path) -> tuple[Path, Path]:
    """FOAM-2 at 0.04/0.0625 best (v3), seven of its eight Q1 neighbours run (v3 or v4, all
    worse), 0.08/0.125 missing; seeds 0-1 of the point run in v4."""
    v4, v3 = tmp_path / "v4", tmp_path / "v3"
    write_run(v3, "final", "foam2", "lr0.04_alpha0.0625", 0, 79.6, 0.0)
    neighbours = {
        "lr0.02_alpha0.03125": 85.8,
        "lr0.02_alpha0.0625": 81.5,
        "lr0.04_alpha0.03125": 81.3,
        "lr0.04_alpha0.125": 91.7,
        "lr0.08_alpha0.0625": 83.2,
    }
    for name, ppl in neighbours.items():
        write_run(v3, "final", "foam2", name, 0, ppl, 0.0)
    for name, ppl in (("lr0.02_alpha0.125", 80.5), ("lr0.08_alpha0.03125", 82.7)):
        write_run(v4, "final", "foam2", name, 0, ppl, 88.0)
    for seed in (0, 1):
        write_run(v4, "final", "foam2", "lr0.04_alpha0.0625", seed, 79.6, 86.0)
    return v4, v3


def test_walks_show_each_rows_point_its_neighbours_and_what_the_driver_still_runs(tmp_path):
    v4, v3 = walk_runs(tmp_path)
    text = walks_table(v4, v3)
    q1, q2 = text.split("## Q1")[1].split("## Q2")
    foam2 = next(line for line in q1.splitlines() if line.startswith("| FOAM-2 |"))
    assert "| 0.04, 0.0625: 79.60 |" in foam2  # seed 0 ran in v4 too: not marked (v3)
    assert "0.02, 0.0625: 81.50 (v3)" in foam2 and "0.02, 0.125: 80.50;" in foam2
    assert "0.08, 0.125: to run" in foam2 and "| waits on 1 run | 2 of 8 |" in foam2
    q2_foam2 = next(line for line in q2.splitlines() if line.startswith("| FOAM-2 |"))
    assert q2_foam2.endswith("| bracketed | 2 of 3 |")  # Q2 walks the matrices' lr only
    assert "| Muon, module-wise lr | 0.08, 0.03125 (start) | - | not started | - |" in q1

    # The table's "to run" is what the driver would run next on the same runs.
    driver = StudyV4(tmp_path / "data", tmp_path / "runs", 1, dry_run=True, finished=v4, v3_runs=v3)
    driver.walk(study_v4.Q1, study_v4.Q1_ROWS[0])
    assert [d.name for d in driver.planned] == ["lr0.08_alpha0.125_seed0"]


def test_rows_cut_when_the_study_stopped_say_so_in_both_tables(study, tmp_path):
    v4, v3 = study
    write_run(v4, "long", "apollo_1_4", "lr0.04_alpha0.25_gap200", 0, 33.8, 33.9)
    walks_q3 = walks_table(v4, v3).split("## Q3")[1]
    assert "| FOAM-2 | 0.04, 0.0625 (start) | - | not started | - |" in walks_q3
    apollo = next(line for line in walks_q3.splitlines() if line.startswith("| APOLLO-1/4 |"))
    assert apollo.endswith("| cut when the study stopped | 1 of 3 |")
    assert "| Full-Adam | 0.0025, 1 (start) | - | cut when the study stopped | - |" in walks_q3
    q3 = v4_table(load_points(v4, "final_test_ppl"), load_points(v3)).split("## Q3")[1]
    assert "| APOLLO-1/4 | cut when the study stopped |" in q3
    assert "| FOAM-2 | not complete yet |" in q3


def q1_rows_repeating_v3(tmp_path: Path) -> tuple[Path, Path]:
    """FOAM-2 and APOLLO-1/4 with 8 seeds, their seeds 0-2 repeating v3's runs: far apart on
    seeds 0-2, close on 3-7."""
    v4, v3 = tmp_path / "v4", tmp_path / "v3"
    foam2 = [80.0, 80.5, 79.5, 80.0, 81.0, 80.0, 81.0, 80.0]
    apollo = [84.0, 84.5, 83.5, 80.9, 81.1, 80.2, 81.3, 80.9]
    for seed in range(8):
        write_run(v4, "final", "foam2", "lr0.04_alpha0.0625", seed, 79.0, foam2[seed])
        write_run(v4, "final", "apollo_1_4", "lr0.04_alpha0.25_gap20", seed, 80.0, apollo[seed])
    for seed in range(3):
        write_run(v3, "final", "foam2", "lr0.04_alpha0.0625", seed, 79.0, 0.0)
        write_run(v3, "final", "apollo_1_4", "lr0.04_alpha0.25_gap20", seed, 80.0, 0.0)
    return v4, v3


def test_q1_reads_the_seeds_no_v3_run_repeats_beside_all_eight(tmp_path):
    """A comparison resolved over seeds 0-7 whose seeds 3-7 alone hold 0 is said to resolve only
    with the re-used seeds, never read as a win."""
    v4, v3 = q1_rows_repeating_v3(tmp_path)
    q1 = v4_table(load_points(v4, "final_test_ppl"), load_points(v3)).split("## Q2")[0]
    assert (
        "repeat a v3 run at the same point and seed (the check above): FOAM-2 0-2; APOLLO-1/4 0-2."
        in q1
    )
    main, line = (row for row in q1.splitlines() if row.startswith("| FOAM-2 − APOLLO-1/4 |"))
    assert main.endswith(
        "| resolved only with the re-used seeds 0-2; unresolved on seeds 3-7 (below) |"
    )  # the rule alone would read "FOAM-2 better"
    cells = [c.strip() for c in line.strip("|").split("|")]
    everything = ttest_rel(
        [80.0, 80.5, 79.5, 80.0, 81.0, 80.0, 81.0, 80.0],
        [84.0, 84.5, 83.5, 80.9, 81.1, 80.2, 81.3, 80.9],
    )
    new = ttest_rel([80.0, 81.0, 80.0, 81.0, 80.0], [80.9, 81.1, 80.2, 81.3, 80.9])
    assert cells[1].startswith("-1.80 ") and cells[3] == f"{everything.pvalue:.3f}"
    assert cells[4].startswith("-0.48 ") and cells[4].endswith("(n=5)")
    assert cells[6] == f"{new.pvalue:.3f}"  # one comparison: Holm leaves it as it is
    assert cells[7] == "resolves only with the re-used seeds 0-2"


def test_q1_without_rows_that_repeat_v3_has_no_new_seeds_table(study):
    v4, v3 = study  # v3's FOAM-2 seed 0 is the only repeat: seeds 1-7 are new
    text = v4_table(load_points(v4, "final_test_ppl"), load_points(v3))
    assert "Seeds 1-7 alone beside seeds 0-7" in text
    line = next(row for row in text.splitlines() if "| seeds 1-7 alone |" in row)
    assert line.startswith("| Comparison | seeds 0-7: difference |")


def test_q2_says_which_rows_re_score_v3_runs(tmp_path):
    v4, v3 = q1_rows_repeating_v3(tmp_path)
    for seed in range(3):
        write_run(v4, "final", "foam3", "lr0.04_alpha0.03125", seed, 81.0, 90.0 + seed)
        write_run(v4, "final", "galore_1_4", "lr0.04_alpha0.125_gap20", seed, 90.0, 97.0)
    write_run(v3, "final", "galore_1_4", "lr0.04_alpha0.125_gap20", 0, 90.0, 0.0)
    q2 = v4_table(load_points(v4, "final_test_ppl"), load_points(v3)).split("## Q2")[1]
    assert "Re-scored, not new: 2 of these 4 rows repeat v3's runs at every seed" in q2
    assert "(APOLLO-1/4; FOAM-2: the same point and seed as a v3 run)" in q2
    assert "GaLore-1/4: seed 0 of 0-2 repeats a v3 run. FOAM-3: new runs." in q2
    assert "Comparisons between two re-scored rows: FOAM-2 − APOLLO-1/4." in q2


def test_a_row_whose_walk_moved_is_read_at_its_v3_point_too(tmp_path):
    """The control walked from its v3 point (0.04, 0.0625) to 0.02, 0.125: FOAM-2 against it
    at both points over seeds 0-2, validation beside."""
    v4, v3 = tmp_path / "v4", tmp_path / "v3"
    foam2 = [80.0, 81.0, 79.0, 80.0, 80.0, 80.0, 80.0, 80.0]
    for seed in range(8):
        write_run(v4, "final", "foam2", "lr0.04_alpha0.0625", seed, 79.0, foam2[seed])
        write_run(v4, "final", "adamw", "lr0.02_alpha0.125", seed, 85.0 + seed, 90.0 + seed)
    for seed in range(3):
        write_run(v4, "final", "adamw", "lr0.04_alpha0.0625", seed, 84.0, 88.0)
    write_run(v3, "final", "adamw", "lr0.04_alpha0.0625", 0, 84.0, 0.0)
    text = v4_table(load_points(v4, "final_test_ppl"), load_points(v3))
    walked, start = [
        row for row in text.splitlines() if row.startswith("| AdamW") and ": 0.0" in row
    ]
    # walked: test 90, 91, 92 against FOAM-2's 80, 81, 79: -10, -10, -13
    assert (
        "| walked: 0.02, alpha 0.125 | 85.00 | 86.00 | 2.45 | 91.00 | -11.00 ± 1.73 (n=3) |"
        in walked
    )
    assert (
        "| v3 point: 0.04, alpha 0.0625 | 84.00 | 84.00 | - | 88.00 | -8.00 ± 1.00 (n=3) |" in start
    )


def test_the_order_across_lengths_gives_its_exact_p_not_a_bootstrap(study):
    v4, v3 = study
    for seed in range(8):
        write_run(v4, "final", "adamw", "lr0.04_alpha0.0625", seed, 85.0, 90.0)
    write_q3_seeds(v4, "foam2", "lr0.04_alpha0.0625", 41.0)
    write_q3_seeds(v4, "muon_modulewise", "lr0.08_alpha0.03125", 38.0)
    write_q3_seeds(v4, "adamw", "lr0.04_alpha0.0625", 45.0)
    text = v4_table(load_points(v4, "final_test_ppl"), load_points(v3))
    order = next(line for line in text.splitlines() if line.startswith("Order at 1,000"))
    assert "3 rows: Kendall's tau **1.00** (0 of 3 pairs the other way" in order
    assert "exact two-sided p 0.333" in order and "not below 0.05" in order
    assert "bootstrap" not in order


def test_provenance_says_run_by_run_what_the_summary_and_the_notes_record(study, tmp_path):
    v4, v3 = study
    muon = v4 / "final/llama_2m/muon_modulewise/lr0.08_alpha0.03125_seed1/summary.json"
    record = json.loads(muon.read_text())
    record["environment"] = {"torch": "2.13.0", "cpu": "AMD EPYC", "cpu_capability": "AVX2"}
    record["environment"]["threads"] = 2
    muon.write_text(json.dumps(record))
    first, second = (
        "final/llama_2m/foam2/lr0.04_alpha0.0625_seed0",
        str(muon.parent.relative_to(v4)),
    )
    notes = {
        "torch": {"says": "2.13.0+cpu", "source": "environment.txt"},
        "machines": [
            {"first_run": first, "note": "the first", "says": "not described"},
            {"first_run": second, "note": "Machine note", "says": "AMD EPYC"},
        ],
        "threads": [
            {"runs": second, "says": "2", "source": "a note"},
            {"runs": "final/", "says": "1", "source": "Budget"},
        ],
        "finished": [
            [first, "abc1234", "2026-11-28 11:20"],
            [second, "def5678", "2026-11-29 01:00"],
        ],
    }
    (v4 / "machines.json").write_text(json.dumps(notes))
    out = tmp_path / "tables"
    assert make_tables([str(v4), "--v4", str(v3), "--out", str(out)]) == 0
    text = (out / "provenance.md").read_text()
    assert "Summaries that record their machine (`environment`): 1 of 23;" in text
    assert "* machine 1: the first; 1 run; not described." in text
    assert "* machine 2: Machine note; 1 run; AMD EPYC." in text
    assert f"| {first} | abc1234 2026-11-28 11:20 | nothing | machine 1 | 1 [Budget] |" in text
    assert (
        f"| {second} | def5678 2026-11-29 01:00 | torch 2.13.0; AMD EPYC (AVX2); 2 threads "
        "(the segment that finished it) | machine 2 | 2 [a note] |" in text
    )
    # a run the notes do not list: its summary only
    assert (
        "| final/llama_2m/foam3/lr0.04_alpha0.0625_seed2 | - | nothing | - | 1 [Budget] |" in text
    )


V4_RUNS = Path(__file__).resolve().parents[3] / "results" / "repro" / "v4" / "runs"


def test_the_committed_machine_record_lists_every_run_in_the_order_git_committed_them():
    """``machines.json``'s ``finished`` is git's record of when each summary was committed, which
    places each run on a machine: it must be that record, whole."""
    listed = [run for run, *_ in json.loads((V4_RUNS / "machines.json").read_text())["finished"]]
    on_disk = sorted(str(p.parent.relative_to(V4_RUNS)) for p in V4_RUNS.rglob("summary.json"))
    assert sorted(listed) == on_disk
    log = subprocess.run(
        [
            "git",
            "log",
            "--reverse",
            "--diff-filter=A",
            "--format=@%h",
            "--name-only",
            "--",
            "results/repro/v4/runs/*/summary.json",
        ],
        cwd=V4_RUNS.parents[3],
        capture_output=True,
        text=True,
    )
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no git history here")
    from_git = [
        line.removeprefix("results/repro/v4/runs/").removesuffix("/summary.json")
        for line in log.stdout.splitlines()
        if line.strip() and not line.startswith("@")
    ]
    assert listed == from_git
