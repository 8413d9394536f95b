"""scripts/sweep.py and scripts/make_tables.py: the paper's grid, a real tiny sweep, the tables."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from repro import make_tables, paired_stats, sweep
from repro.cpu_study import make_tables as study_tables
from repro.points import CONTROL, Key, Point, load_points
from repro.tables.paired import agreement, comparisons
from train.summary import write_diverged

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_papers_full_grid(capsys):
    assert sweep.main(["--model", "llama_60m", "--dry-run"]) == 0
    header, *commands = capsys.readouterr().out.strip().splitlines()
    points = 3 * 7 + 4 * 4 * 3  # lr-only methods + lr x alpha methods
    assert len(commands) == points
    assert (
        header
        == f"# llama_60m: {points} of {points} points to run (0 done or diverged), one command per line"
    )
    adamw = [c for c in commands if "+optim=adamw " in c]
    assert sorted(float(c.split("optim.lr=")[1].split()[0]) for c in adamw) == [
        1e-4,
        2.5e-4,
        5e-4,
        1e-3,
        2.5e-3,
        5e-3,
        1e-2,
    ]
    assert not any("optim.alpha" in c for c in adamw)
    foam = [c for c in commands if "+optim=foam2 " in c]
    grid = {
        (c.split("optim.lr=")[1].split()[0], c.split("optim.alpha=")[1].split()[0]) for c in foam
    }
    assert grid == {
        (lr, a) for lr in ("0.001", "0.0025", "0.005", "0.01") for a in ("0.25", "0.5", "1")
    }
    assert all("+model=llama_60m" in c and "trainer.resume=auto" in c for c in commands)
    assert all("-m " not in c.split("pretrain.py")[1] for c in commands)  # no Hydra multirun


def test_finished_and_diverged_points_are_skipped(tmp_path, capsys):
    done, diverged = (
        point.run_dir(tmp_path)
        for point in sweep.grid("llama_tiny", ["foam2"], [1e-3, 2e-3], [0.25], [0])
    )
    for run_dir, record in ((done, "summary.json"), (diverged, "diverged.json")):
        run_dir.mkdir(parents=True)
        (run_dir / record).write_text("{}")
    grid = ["--model", "llama_tiny", "--methods", "foam2", "--lrs", "1e-3", "2e-3", "4e-3"]
    sweep.main([*grid, "--alphas", "0.25", "--seeds", "0", "--root", str(tmp_path), "--dry-run"])
    out = capsys.readouterr().out
    assert f"done, skipped: {done}" in out and f"diverged, skipped: {diverged}" in out
    assert out.count("pretrain.py") == 1
    assert "# llama_tiny: 1 of 3 points to run (2 done or diverged)" in out


def summary(model, lr, alpha, seed, ppl, steps=(10, 20)):
    history = [
        {"step": s, "tokens": s * 100, "val_loss": math.log(ppl + 20 - s), "val_ppl": ppl + 20 - s}
        for s in steps
    ]
    return {
        "model": model,
        "optim": "x",
        "lr": lr,
        "alpha": alpha,
        "seed": seed,
        "final_val_ppl": ppl,
        "eval_history": history,
        "peak_memory_bytes": 2**30,
        "wall_time_s": 3600.0,
        "tokens_per_s": 2000.0,
    }


def write_runs(root, method, model, points, gap=None, steps=20):
    """``points``: (lr, alpha, seed, ppl); ppl None writes a diverged run as the study does."""
    for lr, alpha, seed, ppl in points:
        name = f"lr{lr:g}" + ("" if alpha is None else f"_alpha{alpha:g}")
        name += ("" if gap is None else f"_gap{gap}") + f"_seed{seed}"
        run = root / model / method / name
        run.mkdir(parents=True)
        if ppl is None:
            (run / "diverged.json").write_text('{"returncode": 3}')
            continue
        record = summary(model, lr, alpha, seed, ppl)
        record.update(
            steps=steps,
            git_sha="abc123",
            tokenizer="spm:a.model",
            projections=None if gap is None else 3,
        )
        (run / "summary.json").write_text(json.dumps(record))


def test_tables_take_the_best_point_with_sample_std(tmp_path):
    write_runs(
        tmp_path,
        "adamw",
        "llama_60m",
        [(1e-3, None, 0, 30.0), (1e-3, None, 1, 32.0), (1e-2, None, 0, 40.0)],
    )
    write_runs(
        tmp_path,
        "foam2",
        "llama_60m",
        [(5e-3, 0.25, 0, 29.5), (1e-2, 0.25, 0, 28.5), (1e-2, 0.25, 1, 28.5)],
    )
    write_runs(tmp_path, "foam2", "llama_60m", [(2e-2, 0.25, 0, None), (1e-2, 1.0, 0, 29.0)])
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out), "--table3-steps", "10", "20"]) == 0
    table2 = (out / "table2.md").read_text().splitlines()
    assert table2[0] == "| Method | llama_60m PPL | llama_60m memory |"
    # sample std of 30 and 32 is sqrt(2); AdamW's best lr has no lower neighbour: flagged
    assert table2[2] == "| Full-Adam | 31.00 ± 1.41 (n=2)† | 0.35G |"
    # FOAM-2's best has both lr neighbours (2e-2 diverged), but not alpha 0.125 and 0.5
    assert "| FOAM-2 | 28.50 ± 0.00 (n=2)† | 0.27G |" in table2
    assert "† llama_60m FOAM-2: alpha on the grid's edge" in table2
    assert not any("module-wise" in line for line in table2)  # no control run: no control row
    assert not any("FOAM-2: lr" in line for line in table2)
    table3 = (out / "table3.md").read_text().splitlines()
    assert table3[2] == "| llama_60m | Full-Adam | 1.00G | 41.00 | 31.00 | 1.000 | 2.0K |"
    assert "\\begin{tabular}" in (out / "table2.tex").read_text()
    sweep_md = (out / "sweep.md").read_text()
    assert "| - | llama_60m | foam2 | 0.01 | 1 | - | - | 20 | 29.00 (n=1) |" in sweep_md
    assert "| - | llama_60m | foam2 | 0.02 | 0.25 | - | - | - | diverged |" in sweep_md
    # FOAM-2 - AdamW over seeds 0 and 1: (28.5 - 30) and (28.5 - 32); t(0.975, 1) = 12.706;
    # the paper: 28.53 - 29.57
    assert (
        "| llama_60m | FOAM-2 − Full-Adam | -2.50 ± 1.41 (n=2) | [-15.21, +10.21] | - | -1.04 "
        "| not read (n < 3) |"
    ) in (out / "paired.md").read_text()
    # 7 runs of summary()'s 3600 s each
    assert "| abc123 | spm:a.model | 7 | 7.0 |" in (out / "provenance.md").read_text()
    assert "Warning" not in (out / "provenance.md").read_text()


def test_a_curve_is_averaged_only_at_the_steps_every_seed_logged():
    """Table 3, the curve figures and the experiments' curve tables all read ``Point.ppl_at``."""
    history = [{"step": s, "tokens": 100 * s, "val_ppl": p} for s, p in ((10, 40.0), (20, 30.0))]
    point = Point(
        Key("final", "llama_2m", "foam2", 1e-2, 0.25, 0),
        {0: 30.0, 1: 36.0},
        [
            {"eval_history": history},
            {"eval_history": [{"step": 10, "tokens": 1000, "val_ppl": 50.0}]},
        ],
    )
    assert list(point.evaluations()) == [10]  # seed 1 never logged step 20
    assert point.ppl_at(10) == 45.0 and point.ppl_at(20) is None
    assert Point(point.key, {0: 30.0}, [{}]).evaluations() == {}  # a summary without a history


def test_a_point_with_a_diverged_seed_is_shown_diverged_not_left_out(tmp_path):
    """Its row would otherwise fall back, unmarked, to a neighbour run at one seed."""
    seeds = [(1e-2, 0.25, 0, 28.0), (1e-2, 0.25, 1, None), (1e-2, 0.25, 2, 29.0)]
    write_runs(tmp_path, "foam2", "llama_60m", [*seeds, (5e-3, 0.25, 0, 30.0)])
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    assert "| FOAM-2 | diverged (1 of 3 seeds)† |" in (out / "table2.md").read_text()


def test_provenance_flags_runs_on_different_tokenizers(tmp_path):
    write_runs(tmp_path, "adamw", "llama_60m", [(1e-3, None, 0, 30.0), (2e-3, None, 0, 31.0)])
    other = tmp_path / "llama_60m" / "adamw" / "lr0.002_seed0" / "summary.json"
    record = json.loads(other.read_text())
    other.write_text(json.dumps({**record, "tokenizer": "spm:b.model"}))
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    text = (out / "provenance.md").read_text()
    assert (
        "| abc123 | spm:a.model | 1 | 1.0 |" in text
        and "| abc123 | spm:b.model | 1 | 1.0 |" in text
    )
    assert "| all | | 2 | 2.0 |" in text
    assert "the runs of 20 steps used 2 tokenizers (spm:a.model, spm:b.model)" in text


def test_provenance_says_without_warning_when_each_length_has_its_own_tokenizer(tmp_path):
    """v4's Q3 trains 10,000 steps on its own corpus: two tokenizers, one per length, by design."""
    write_runs(tmp_path, "adamw", "llama_60m", [(1e-3, None, 0, 30.0)], steps=1000)
    write_runs(tmp_path, "foam2", "llama_60m", [(1e-3, 0.25, 0, 30.0)], steps=10000)
    long_run = tmp_path / "llama_60m" / "foam2" / "lr0.001_alpha0.25_seed0" / "summary.json"
    long_run.write_text(
        json.dumps({**json.loads(long_run.read_text()), "tokenizer": "spm:b.model"})
    )
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    text = (out / "provenance.md").read_text()
    assert "Warning" not in text
    assert (
        "Each run length has its own tokenizer (1,000 steps: spm:a.model; 10,000 steps: "
        "spm:b.model): perplexities compare within a length, not across."
    ) in text


def test_staged_study_layout(tmp_path):
    """search/ chooses, final/ reports; gaps are separate points; ablations pair with FOAM-2."""
    search, final = tmp_path / "search", tmp_path / "final"
    for gap, ppl in ((200, 50.0), (20, 45.0)):
        write_runs(
            search,
            "galore_1_4",
            "llama_2m",
            [(5e-3, 0.25, 0, ppl + 1), (1e-2, 0.25, 0, ppl), (2e-2, 0.25, 0, ppl + 2)],
            gap=gap,
        )
    write_runs(
        final, "galore_1_4", "llama_2m", [(1e-2, 0.25, s, 44.0 + s) for s in range(3)], gap=20
    )
    # the walk bracketed GaLore's lr at full length; AdamW's and the control's it did not
    write_runs(
        final,
        "galore_1_4",
        "llama_2m",
        [
            (5e-3, 0.25, 0, 47.0),
            (2e-2, 0.25, 0, 46.0),
            (1e-2, 0.125, 0, 48.0),
            (1e-2, 0.5, 0, 49.0),
        ],
        gap=20,
    )
    write_runs(search, "apollo_1_4", "llama_2m", [(1e-2, 0.25, 0, 60.0)], gap=20)  # no final yet
    write_runs(final, "foam2", "llama_2m", [(1e-2, 0.25, s, 40.0 + 2 * s) for s in range(3)])
    write_runs(final, "foam2", "llama_2m", [(2e-2, 0.25, 0, 39.0), (5e-3, 0.25, 0, 41.0)])
    write_runs(
        final, "ablation_foam2_no_residual", "llama_2m", [(1e-2, 0.25, s, 50.0) for s in range(3)]
    )
    # FOAM-3's search chose FOAM-2's point: its finals are the FOAM-3 ablation's runs;
    # FOAM-Mini's chose another, so only its ablation_ runs at FOAM-2's point count.
    write_runs(final, "foam3", "llama_2m", [(1e-2, 0.25, s, 43.0 + s) for s in range(3)])
    write_runs(final, "foam_mini", "llama_2m", [(5e-3, 0.5, s, 45.0) for s in range(3)])
    write_runs(final, "ablation_foam_mini", "llama_2m", [(1e-2, 0.25, s, 46.0) for s in range(3)])
    write_runs(final, "adamw", "llama_2m", [(4e-3, 0.5, s, 47.0) for s in range(3)])
    write_runs(final, "adamw", "llama_2m", [(4e-3, 1.0, s, 48.0) for s in range(3)])
    write_runs(final, "adamw", "llama_2m", [(8e-3, 0.5, 0, 49.0), (8e-3, 1.0, 0, 50.0)])
    out = tmp_path / "tables"  # the CPU study's command: the paper's tables and its carry-over
    assert study_tables.main([str(tmp_path), "--out", str(out), "--curves"]) == 0
    assert (out / "ablations_llama_2m.png").stat().st_size > 10_000  # fold level and residual
    table2 = (out / "table2.md").read_text()
    # the 3-seed point wins over a 1-seed neighbour with a lower perplexity, which it flags
    assert "| FOAM-2 | 42.00 ± 2.00 (n=3)†" in table2
    assert "† llama_2m FOAM-2: lr 0.02 did better: -1.00 (n=1)" in table2
    assert "| GaLore-1/4 | 45.00 ± 1.00 (n=3) |" in table2  # gap 20's lr and alpha are interior
    assert "Not yet run in final/ on llama_2m (their runs are in sweep.md): APOLLO-1/4." in table2
    assert "| Full-Adam | 48.00 ± 0.00 (n=3)† |" in table2
    assert "| AdamW, matrices at lr x alpha (module-wise lr) | 47.00 ± 0.00 (n=3)† |" in table2
    assert "† llama_2m Full-Adam: lr on the grid's edge" in table2  # 2e-3 not run at full length
    ablations = (out / "ablations.md").read_text()
    # 50 - (40, 42, 44) = 10, 8, 6: interval 8 -/+ 2.484 x 2; t = 8 sqrt(3) / 2 gives p 0.0202,
    # the smallest of the 3 variants', so Holm triples it
    assert (
        "| llama_2m | FOAM-2 without the residual (rho = 0) | 0.01 | 0.25 | 50.00 ± 0.00 (n=3) "
        "| +8.00 ± 2.00 (n=3) | [+3.03, +12.97] | 0.061 |" in ablations
    )
    assert (
        "| llama_2m | FOAM-3 | 0.01 | 0.25 | 44.00 ± 1.00 (n=3) | +2.00 ± 1.00 (n=3) |" in ablations
    )
    assert "| llama_2m | FOAM-Mini | 0.01 | 0.25 | 46.00 ± 0.00 (n=3) |" in ablations
    assert "| FOAM-Mini | 0.005 |" not in ablations
    # FOAM-2 - GaLore: -4, -3, -2; t(0.975, 2) = 4.303, 4.303 / sqrt(3) = 2.484; the paper's 60M
    # (llama_2m's stand-in): 28.53 - 34.38. Its paired p, 1 - t / sqrt(t^2 + 2) at t = 3 sqrt(3)
    # for 2 degrees of freedom, is 0.0351, the family's smallest (with Full-Adam's), so Holm
    # multiplies it by the 5 comparisons with 3 seeds (APOLLO-1/4 has none).
    assert (
        "| llama_2m | FOAM-2 − GaLore-1/4 | -3.00 ± 1.00 (n=3) | [-5.48, -0.52] | 0.175 | -5.85 "
        "| yes |" in (out / "paired.md").read_text()
    )
    carry = (out / "carry_over.md").read_text()
    assert "| llama_2m | FOAM-2 | 0.01 (chosen) | 0.25 | 40.00 |" in carry
    assert "| llama_2m | FOAM-2 | 0.02 | 0.25 | 39.00 |" in carry
    control = "AdamW, matrices at lr x alpha (module-wise lr)"
    assert f"| llama_2m | {control} | 0.004 (chosen) | 0.5 | 47.00 |" in carry
    assert "| llama_2m | Full-Adam | 0.008 | 1 | 50.00 |" in carry
    sweep_md = (out / "sweep.md").read_text()
    assert (
        "| search | llama_2m | galore_1_4 | 0.01 | 0.25 | 20 | 3 | 20 | 45.00 (n=1) |" in sweep_md
    )


def test_collect_copies_finished_runs_without_their_checkpoints(tmp_path, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results"
    finished = runs / "llama_2m" / "cosine_foam2" / "lr0.01_alpha0.25_seed0"
    running = runs / "llama_2m" / "cosine_foam2" / "lr0.01_alpha0.25_seed1"
    diverged = runs / "llama_2m" / "adamw" / "lr0.1_seed0"
    for run_dir in (finished, running, diverged):
        (run_dir / "checkpoints" / "step_00000100").mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
        (run_dir / "config.yaml").write_text("optim: {}\n")
    (finished / "summary.json").write_text("{}")
    (diverged / "diverged.json").write_text("{}")
    assert sweep.main(["--root", str(runs), "--collect", str(results)]) == 0
    assert "copied 2 finished runs" in capsys.readouterr().out
    kept = sorted(str(p.relative_to(results)) for p in results.rglob("*") if p.is_file())
    assert kept == [
        "llama_2m/adamw/lr0.1_seed0/config.yaml",
        "llama_2m/adamw/lr0.1_seed0/diverged.json",
        "llama_2m/adamw/lr0.1_seed0/metrics.jsonl",
        "llama_2m/cosine_foam2/lr0.01_alpha0.25_seed0/config.yaml",
        "llama_2m/cosine_foam2/lr0.01_alpha0.25_seed0/metrics.jsonl",
        "llama_2m/cosine_foam2/lr0.01_alpha0.25_seed0/summary.json",
    ]


def test_a_dirty_tree_is_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep, "uncommitted_changes", lambda: " M foam/optimizer.py")
    monkeypatch.setattr(sweep, "run_local", lambda commands, jobs: 0)
    args = ["--model", "llama_tiny", "--methods", "adamw", "--lrs", "1e-3", "--seeds", "0"]
    args += ["--root", str(tmp_path)]
    with pytest.raises(SystemExit):
        sweep.main(args)
    err = capsys.readouterr().err
    assert "uncommitted changes" in err and "foam/optimizer.py" in err
    assert sweep.main([*args, "--allow-dirty"]) == 0


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished runs"):
        make_tables.main([str(tmp_path)])


def test_a_real_two_point_sweep_is_picked_up_by_the_tables(tmp_path):
    """Two grid points of the tiny model through torchrun, then the tables from their summaries."""
    command = [
        sys.executable,
        str(ROOT / "scripts" / "sweep.py"),
        "--model",
        "llama_tiny",
        "--methods",
        "foam2",
        "--lrs",
        "1e-3",
        "--alphas",
        "0.25",
        "1.0",
        "--seeds",
        "0",
        "--root",
        str(tmp_path),
        "--jobs",
        "2",
        "--allow-dirty",  # the test must not depend on the developer's tree being committed
        "--",
        "trainer=cpu_debug",
        "logger=none",
        "trainer.max_steps=2",
        "trainer.global_batch_size=2",
        "trainer.micro_batch_size=2",
        "trainer.eval_every=2",
        "trainer.save_every=0",
        "trainer.eval_tokens=500",
        "data.seq_len=32",
    ]
    subprocess.run(command, check=True, cwd=ROOT, timeout=600)
    summaries = sorted(tmp_path.rglob("summary.json"))
    assert len(summaries) == 2
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out), "--curves"]) == 0
    sweep_rows = [r for r in (out / "sweep.md").read_text().splitlines() if "llama_tiny" in r]
    assert len(sweep_rows) == 2 and (out / "curves_llama_tiny.png").stat().st_size > 0
    best = min(json.loads(p.read_text())["final_val_ppl"] for p in summaries)
    assert f"{best:.2f} (n=1)" in (out / "table2.md").read_text()


def test_alpha_table_reads_each_stage_at_each_methods_best_lr(tmp_path):
    """The paper's alpha and module-wise-lr figures: PPL against alpha at the best search lr, and
    at the finals' lr at full length, where the walk stepped alpha."""
    search, final = tmp_path / "search", tmp_path / "final"
    write_runs(
        search,
        "foam2",
        "llama_2m",
        [(5e-3, 0.125, 0, 52.0), (5e-3, 0.25, 0, 50.0), (5e-3, 0.5, 0, 55.0), (1e-2, 0.5, 0, 60.0)],
    )
    # the control's line at its best lr runs through AdamW itself (alpha 1)
    write_runs(search, "adamw", "llama_2m", [(2e-3, 0.25, 0, 58.0), (2e-3, 0.5, 0, 56.0)])
    write_runs(search, "adamw", "llama_2m", [(2e-3, 1.0, 0, 57.0), (4e-3, 1.0, 0, 59.0)])
    # the module-wise Muon is no row of Table 2: its line comes beside the control's
    write_runs(
        search, "muon_modulewise", "llama_2m", [(8e-2, 0.0625, 0, 51.0), (8e-2, 0.125, 0, 53.0)]
    )
    write_runs(final, "foam2", "llama_2m", [(5e-3, 0.25, s, 40.0) for s in range(3)])
    write_runs(final, "foam2", "llama_2m", [(5e-3, 0.5, 0, 39.0), (1e-2, 0.125, 0, 38.0)])
    write_runs(final, "adamw", "llama_2m", [(2e-3, 1.0, s, 45.0) for s in range(3)])  # no line
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out), "--curves"]) == 0
    rows = [line for line in (out / "alpha.md").read_text().splitlines() if "llama_2m" in line]
    control = "AdamW, matrices at lr x alpha (module-wise lr)"
    assert rows == [
        f"| search | llama_2m | {control} | 0.002 | - | 0.25 | 58.00 |",
        f"| search | llama_2m | {control} | 0.002 | - | 0.5 (best) | 56.00 |",
        f"| search | llama_2m | {control} | 0.002 | - | 1 | 57.00 |",
        "| search | llama_2m | Muon, module-wise lr | 0.08 | - | 0.0625 (best) | 51.00 |",
        "| search | llama_2m | Muon, module-wise lr | 0.08 | - | 0.125 | 53.00 |",
        "| search | llama_2m | FOAM-2 | 0.005 | - | 0.125 | 52.00 |",
        "| search | llama_2m | FOAM-2 | 0.005 | - | 0.25 (best) | 50.00 |",
        "| search | llama_2m | FOAM-2 | 0.005 | - | 0.5 | 55.00 |",
        # at the finals' lr; the finals' point (most seeds) is not the best seed-0 run
        "| final | llama_2m | FOAM-2 | 0.005 | - | 0.25 | 40.00 |",
        "| final | llama_2m | FOAM-2 | 0.005 | - | 0.5 (best) | 39.00 |",
    ]
    assert (out / "alpha_llama_2m.png").stat().st_size > 10_000


def test_foam2s_alpha_at_the_papers_lr_is_paired_with_the_papers_alpha(tmp_path):
    """PROTOCOL.md's amendment of 2026-11-28: alpha 0.5 and 1 each against 0.25 at lr 1e-2 (the
    paper's 60M lr, llama_2m's stand-in), Holm over the two; a point at another lr is no part of it."""
    final = tmp_path / "final"
    ppl = {0.25: (50.0, 51.0, 52.0), 0.5: (50.5, 52.5, 51.5), 1.0: (60.0, 62.0, 64.0)}
    write_runs(
        final,
        "foam2",
        "llama_2m",
        [(1e-2, a, s, p) for a, seeds in ppl.items() for s, p in enumerate(seeds)]
        + [(4e-2, 0.0625, s, 40.0 + s) for s in range(3)],
    )
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    text = (out / "alpha.md").read_text()
    section = text[text.index("## FOAM-2's alpha at the paper's lr: llama_2m, lr 0.01") :]
    # differences by seed: alpha 0.5: +0.5, +1.5, -0.5 (mean 0.5, std 1); alpha 1: +10, +11, +12
    # (mean 11, std 1); paired t p: 2 * sf(0.5 * sqrt(3)) and 2 * sf(11 * sqrt(3)), 2 dof; Holm
    # doubles the smaller and keeps the larger (it is larger than twice the smaller)
    p_half = 2 * stats.t.sf(0.5 * math.sqrt(3), 2)
    p_one = 2 * stats.t.sf(11 * math.sqrt(3), 2)
    assert "| 0.25 (the paper's) | 51.00 ± 1.00 (n=3) | 50.00, 51.00, 52.00 |" in section
    assert "| 1 | 62.00 ± 2.00 (n=3) | 60.00, 62.00, 64.00 |" in section
    assert (
        f"| alpha 0.5 − alpha 0.25 | +0.50 ± 1.00 (n=3) | [-1.98, +2.98] | {p_half:.3f} | "
        "unresolved |"
    ) in section
    assert (
        f"| alpha 1 − alpha 0.25 | +11.00 ± 1.00 (n=3) | [+8.52, +13.48] | {2 * p_one:.3f} | "
        "alpha 0.25 better |"
    ) in section
    assert "0.0625" not in section


def test_without_a_search_alpha_is_read_from_the_finals(tmp_path):
    """A results tree holding only finals still gets its alpha line and its edge flags."""
    final = tmp_path / "final"
    write_runs(
        final,
        "foam2",
        "llama_2m",
        [(5e-3, a, s, p) for a, p in ((0.25, 50.0), (0.5, 55.0)) for s in range(3)],
    )
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    assert (
        "| llama_2m | FOAM-2 | 0.005 | - | 0.25 (best) | 50.00 |" in (out / "alpha.md").read_text()
    )
    assert "† llama_2m FOAM-2: alpha on the grid's edge" in (out / "table2.md").read_text()


def test_the_paired_table_compares_foam2_with_every_row_and_the_mini_tier():
    rows = {"foam2", "adamw", "foam_mini", "apollo_mini", CONTROL}
    assert comparisons(rows) == [
        ("foam2", "adamw"),
        ("foam2", CONTROL),
        ("foam2", "apollo_mini"),
        ("foam2", "foam_mini"),
        ("foam_mini", "apollo_mini"),
    ]
    assert comparisons({"foam_mini", "apollo_mini"}) == [("foam_mini", "apollo_mini")]
    assert comparisons({"foam2", "foam_mini"}) == [("foam2", "foam_mini")]


def test_holm_adjusts_step_down_over_the_tested_comparisons_only():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04, kept monotone: 0.04 -> 0.06
    assert paired_stats.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert paired_stats.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert paired_stats.holm([]) == []


def test_the_paired_p_is_the_t_tests():
    # 2 degrees of freedom: two-sided p = 1 - t / sqrt(t^2 + 2), t = 3 / (1 / sqrt(3))
    t = 3 * math.sqrt(3)
    assert paired_stats.paired_p((-3.0, 1.0, 3)) == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert paired_stats.paired_p((-3.0, 1.0, 3)) == paired_stats.paired_p((3.0, 1.0, 3))
    assert paired_stats.paired_p((-3.0, 0.0, 3)) == 0.0  # the same difference on every seed
    assert paired_stats.paired_p((0.0, 0.0, 3)) == 1.0
    assert paired_stats.paired_p((-3.0, None, 1)) is None


def test_an_order_is_read_only_where_the_interval_resolves_it():
    assert agreement((-3.0, -1.0), -0.4, 3) == "yes"
    assert agreement((1.0, 3.0), -0.4, 3) == "no (the other way)"
    assert agreement((-1.0, 3.0), -0.4, 3) == "not resolved (interval holds 0)"
    assert agreement((-3.0, -1.0), -0.4, 2) == "not read (n < 3)"  # the protocol's n
    assert agreement(None, -0.4, 1) == "-"  # one seed
    assert agreement((-3.0, -1.0), None, 3) == "-"  # no paper number (the control)
    assert paired_stats.confidence_interval((-2.0, 1.0, 1)) is None
    low, high = paired_stats.confidence_interval((-2.0, 1.0, 3))
    assert (low, high) == pytest.approx((-2.0 - 2.4841, -2.0 + 2.4841), abs=1e-4)


def test_a_run_sits_at_the_lr_it_records_and_at_its_names_only_where_it_records_none(tmp_path):
    """The tables read a run's lr from its summary; the directory's name is the fallback for a
    record without one (a diverged run's holds only where it stopped)."""
    method = tmp_path / "llama_2m" / "foam2"
    finished, diverged = method / "lr0.01_alpha0.25_seed0", method / "lr0.01_alpha0.25_seed1"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text(json.dumps(summary("llama_2m", 0.02, 0.25, 0, 50.0)))
    diverged.mkdir()
    write_diverged(diverged, 5, "non-finite loss")
    placed = [(p.key.lr, p.key.alpha, p.ppl_by_seed) for p in load_points(tmp_path)]
    assert placed == [(0.01, 0.25, {1: math.inf}), (0.02, 0.25, {0: 50.0})]
