"""scripts/sweep.py and scripts/make_tables.py: the paper's grid, a real tiny sweep, the tables."""

import json
import math
import subprocess
import sys
from pathlib import Path

import make_tables
import pytest
import sweep

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_prints_the_papers_full_grid(capsys):
    assert sweep.main(["--model", "llama_60m", "--dry-run"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 3 * 7 + 4 * 4 * 3  # lr-only methods + lr x alpha methods
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


def test_finished_points_are_skipped(tmp_path, capsys):
    point = sweep.grid("llama_tiny", ["foam2"], [1e-3], [0.25], [0])[0]
    done = point.run_dir(tmp_path)
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    sweep.main(
        [
            "--model",
            "llama_tiny",
            "--methods",
            "foam2",
            "--lrs",
            "1e-3",
            "2e-3",
            "--alphas",
            "0.25",
            "--seeds",
            "0",
            "--root",
            str(tmp_path),
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert f"done, skipped: {done}" in out and out.count("pretrain.py") == 1


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


def write_runs(root, method, model, points):
    for lr, alpha, seed, ppl in points:
        run = root / model / method / f"lr{lr}_alpha{alpha}_seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(summary(model, lr, alpha, seed, ppl)))


def test_tables_take_the_best_point_and_average_seeds(tmp_path):
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
        [(1e-2, 0.25, 0, 28.5), (1e-2, 0.25, 1, 28.5), (1e-2, 1.0, 0, 29.0)],
    )
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out), "--table3-steps", "10", "20"]) == 0
    table2 = (out / "table2.md").read_text().splitlines()
    assert table2[0] == "| Method | llama_60m PPL | llama_60m memory |"
    assert table2[2] == "| Full-Adam | 31.00 ± 1.00 | 0.35G |"  # mean +- std of the two seeds
    assert table2[4] == "| FOAM-2 | 28.50 ± 0.00 | 0.27G |"  # block separator between them
    table3 = (out / "table3.md").read_text().splitlines()
    assert table3[2] == "| llama_60m | Full-Adam | 1.00G | 41.00 | 31.00 | 1.000 | 2.0K |"
    assert "\\begin{tabular}" in (out / "table2.tex").read_text()
    assert "| llama_60m | FOAM-2 | 0.01 | 1 | 1 | 29.00 ± 0.00 |" in (out / "sweep.md").read_text()


def test_semantics_table_compares_at_foam2s_best_lr(tmp_path):
    write_runs(tmp_path, "foam2", "llama_60m", [(1e-2, 0.25, 0, 28.0), (5e-3, 0.25, 0, 30.0)])
    for method, ppls in (("foam2_paper_semantics", (27.0, 29.0)), ("foam2_release", (31.0, 35.0))):
        write_runs(tmp_path, method, "llama_60m", [(1e-2, 0.25, s, p) for s, p in enumerate(ppls)])
        write_runs(tmp_path, method, "llama_60m", [(5e-3, 0.25, 0, 20.0)])  # not FOAM-2's best lr
    out = tmp_path / "tables"
    assert make_tables.main([str(tmp_path), "--out", str(out)]) == 0
    assert (out / "semantics.md").read_text().splitlines()[2:] == [
        "| llama_60m | FOAM-2, paper semantics | 0.01 | 0.25 | 2 | 28.00 ± 1.00 |",
        "| llama_60m | FOAM-2, release semantics | 0.01 | 0.25 | 2 | 33.00 ± 2.00 |",
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
    assert f"{best:.2f} ± 0.00" in (out / "table2.md").read_text()
