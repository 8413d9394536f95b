"""repro/experiments.py through ``sweep.py --experiment``: each of the paper's experiments expands
into its runs with the paper's settings, the memory-matching rule, and tiny runs of every kind."""

import json
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import foam
import models
from repro import experiments, sweep
from repro.memory_estimator import memory_matched, planned_numel
from repro.points import load_points
from repro.tables.experiments import experiment_outputs
from tests.helpers.cli import ENV, TINY
from train.metrics import peak_flops_for_name

ROOT = Path(__file__).resolve().parents[2]
NAMES = [
    "table2",
    "table3",
    "qwen",
    "seq_len",
    "int8",
    "fold_level",
    "residual",
    "overtrain",
    "combinations",
    "alpha",
    "modulewise_adam",
    "gpt2_deberta",
    "cosine",
]


def dry_run(capsys, *argv: str) -> tuple[list[list[str]], list[str]]:
    """The commands (split) and the comment lines of ``sweep.py --dry-run``."""
    assert sweep.main(["--dry-run", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    commands = [shlex.split(line) for line in lines if "pretrain.py" in line]
    return commands, [line for line in lines if line.startswith("#")]


def settings(command: list[str]) -> dict[str, str]:
    """A command's Hydra overrides as key -> value (the last one wins)."""
    pairs = (arg.split("=", 1) for arg in command if "=" in arg and not arg.startswith("--"))
    return {key: value for key, value in pairs}


def test_list_names_every_experiment(capsys):
    assert sweep.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert listed == [*NAMES, "glue", "mmlu"]  # the fine-tuning grids last
    assert list(experiments.EXPERIMENTS) == NAMES


def test_table2_is_the_papers_rows_sizes_and_seeds(capsys):
    commands, comments = dry_run(capsys, "--experiment", "table2")
    runs = Counter((s["+model"], s["+optim"]) for s in map(settings, commands))
    assert len(commands) == 13 * (3 * 3 + 1)
    assert runs[("llama_60m", "foam2")] == 3 and runs[("llama_1b", "foam2")] == 1
    foam2 = settings(next(c for c in commands if "+optim=foam2" in c))
    assert (foam2["optim.lr"], foam2["optim.alpha"]) == ("0.01", "0.25")  # the Appendix table
    adamw_1b = settings(next(c for c in commands if "+optim=adamw" in c and "+model=llama_1b" in c))
    assert adamw_1b["optim.lr"] == "0.0005" and "optim.alpha" not in adamw_1b
    assert "13.11B tokens" in next(c for c in comments if "llama_1b/adamw" in c)


def test_gpu_hours_are_the_flop_count_at_the_stated_mfu(capsys):
    _, comments = dry_run(capsys, "--experiment", "int8", "--mfu", "0.5")
    flops = models.flops_per_token(models.load_model_config("llama_60m"), 256) * 10_000 * 512 * 256
    hours = {gpu: flops / (peak_flops_for_name(gpu) * 0.5) / 3600 for gpu in ("H100", "A100")}
    line = next(c for c in comments if "llama_60m/adamw8bit" in c)
    assert f"{hours['H100']:,.1f} h H100" in line and f"{hours['A100']:,.1f} h A100" in line
    assert comments[-1].startswith("# int8: 9 runs") and "50% MFU" in comments[-1]


def test_the_users_overrides_and_the_experiments_shape_reach_the_token_count(capsys):
    """The plan's tokens come from typed shapes (the seq-len variant's, the user's last), not
    from the command's strings read back: 1000 steps x 256 sequences x 512 tokens = 0.13B."""
    argv = ["--experiment", "seq_len", "--model", "llama_60m", "--methods", "foam2_seq512"]
    commands, comments = dry_run(capsys, *argv, "--", "trainer.max_steps=1000")
    assert settings(commands[0])["data.seq_len"] == "512"
    assert "0.13B tokens" in comments[0]  # 1000 x 256 x 512 = 131,072,000
    _, comments = dry_run(capsys, *argv, "--", "data.seq_len=128", "trainer.max_steps=1000")
    assert "0.03B tokens" in comments[0]  # the user's seq_len wins: 1000 x 256 x 128
    with pytest.raises(SystemExit):
        sweep.main(["--dry-run", *argv, "--", "trainer.max_steps=many"])
    assert "trainer.max_steps takes an integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--dry-run", *argv, "--", "trainer.max_steps=[1"])
    assert "not a Hydra override" in capsys.readouterr().err


def test_table3_qwen_int8_residual_overtrain_combinations_cosine(capsys):
    table3 = [settings(c) for c in dry_run(capsys, "--experiment", "table3")[0]]
    assert len(table3) == 10 and all(s["trainer.grad_checkpointing"] == "true" for s in table3)
    qwen = [settings(c) for c in dry_run(capsys, "--experiment", "qwen")[0]]
    assert {s["+model"] for s in qwen} == {"qwen_60m", "qwen_130m", "qwen_350m"} and len(qwen) == 27
    int8 = {settings(c)["+optim"] for c in dry_run(capsys, "--experiment", "int8")[0]}
    assert int8 == {"adamw8bit", "galore8bit", "foam8bit"}
    residual = [settings(c) for c in dry_run(capsys, "--experiment", "residual")[0]]
    assert sorted(s.get("optim.residual", "on") for s in residual) == ["false", "false", "on", "on"]
    commands, comments = dry_run(capsys, "--experiment", "overtrain")
    assert all(settings(c)["trainer.max_steps"] == "300000" for c in commands)
    assert "39.32B tokens" in comments[0]  # the paper's ~39B, ~300 tokens per parameter
    combinations = [settings(c) for c in dry_run(capsys, "--experiment", "combinations")[0]]
    assert {(s["+model"], s["+optim"]) for s in combinations} == {
        ("llama_130m", m) for m in ("adam_mini", "foam_adam_mini", "muon", "foam_muon")
    }
    by_optim = {s["+optim"]: s for s in combinations}
    for base in ("adam_mini", "muon"):  # FOAM inside a method runs at that method's lr and alpha
        folded = by_optim[f"foam_{base}"]
        assert folded["optim.lr"] == by_optim[base]["optim.lr"]
        assert float(folded["optim.alpha"]) == float(by_optim[base].get("optim.alpha", 1.0))
        assert foam.available_optimizers()[base]["alpha"] == 1.0  # what an absent alpha means
    cosine = [settings(c) for c in dry_run(capsys, "--experiment", "cosine")[0]]
    assert len(cosine) == 5 and all(s["trainer.log_update_cosine"] == "true" for s in cosine)


def test_alpha_runs_foam2_at_the_papers_lr_over_the_appendix_alphas(capsys):
    commands, comments = dry_run(capsys, "--experiment", "alpha")
    runs = [settings(c) for c in commands]
    assert {(s["+model"], s["+optim"]) for s in runs} == {
        ("llama_60m", "foam2"),
        ("llama_130m", "foam2"),
    }
    assert sorted(float(s["optim.alpha"]) for s in runs if s["+model"] == "llama_60m") == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    assert {s["optim.lr"] for s in runs} == {"0.01"}  # FOAM's Appendix lr at 60M and 130M
    for s in runs:  # the alpha names the run directory, so a grid point's run is shared
        assert Path(s["hydra.run.dir"]).name == f"lr0.01_alpha{s['optim.alpha']}_seed42"
    assert comments[-1].startswith("# alpha: 8 runs")


def test_modulewise_adam_gives_adam_foams_lr_and_alpha(capsys):
    commands, _ = dry_run(capsys, "--experiment", "modulewise_adam", "--model", "llama_60m")
    runs = {Path(settings(c)["hydra.run.dir"]).parts[-2:]: settings(c) for c in commands}
    adam = runs[("adamw", "lr0.005_seed42")]  # Adam's own lr, one lr everywhere
    modulewise = runs[("adamw", "lr0.01_alpha0.25_seed42")]
    foam2 = runs[("foam2", "lr0.01_alpha0.25_seed42")]
    assert "optim.alpha" not in adam
    assert (modulewise["optim.lr"], modulewise["optim.alpha"]) == (
        foam2["optim.lr"],
        foam2["optim.alpha"],
    )
    assert len(commands) == 3


def test_gpt2_deberta_sweeps_the_appendix_lrs_for_20k_steps(capsys):
    commands, comments = dry_run(capsys, "--experiment", "gpt2_deberta")
    runs = [settings(c) for c in commands]
    assert {s["+model"] for s in runs} == {"gpt2_base", "deberta_base"}
    assert all(s["trainer.max_steps"] == "20000" for s in runs)
    foam2 = sorted(float(s["optim.lr"]) for s in runs if s["+optim"] == "foam2")
    assert foam2 == [5e-4, 5e-4, 1e-3, 1e-3, 2.5e-3, 2.5e-3, 5e-3, 5e-3, 1e-2, 1e-2]
    assert {s.get("optim.alpha") for s in runs if s["+optim"] == "foam2"} == {"0.25"}
    assert "2.62B tokens" in comments[0]  # the appendix's 2.6B


def test_seq_len_keeps_131k_tokens_per_batch(capsys):
    commands, _ = dry_run(capsys, "--experiment", "seq_len")
    assert len(commands) == 2 * 6 * 3
    for s in map(settings, commands):
        assert int(s["data.seq_len"]) * int(s["trainer.global_batch_size"]) == 512 * 256
        assert int(s["data.seq_len"]) * int(s["trainer.micro_batch_size"]) == 32 * 256
        assert "_seq" + s["data.seq_len"] in s["hydra.run.dir"]


def test_user_choices_and_finished_runs(capsys, tmp_path):
    argv = ["--experiment", "cosine", "--model", "llama_2m", "--seeds", "0", "1", "2"]
    argv += ["--root", str(tmp_path), "--methods", "cosine_adamw", "cosine_foam2"]
    commands, _ = dry_run(capsys, *argv, "--", "trainer.max_steps=1000")
    assert len(commands) == 6 and all(settings(c)["trainer.max_steps"] == "1000" for c in commands)
    done = Path(settings(commands[0])["hydra.run.dir"])
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    commands, comments = dry_run(capsys, *argv)
    assert len(commands) == 5 and comments.count("#   finished") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--experiment", "table9"], "unknown experiment 'table9'"),
        (["--experiment", "int8", "--lrs", "1e-3"], "--lrs"),
        (["--experiment", "int8", "--methods", "adamw"], "not in int8"),
        ([], "give --model"),
        (["--experiment", "int8", "--mfu", "35"], "--mfu is a fraction"),
        (["--experiment", "int8", "--model", "llama_999m"], "model=llama_999m: no such model"),
        (["--model", "lama_60m"], "model=lama_60m: no such model config; did you mean llama_60m?"),
        (["--model", "llama_60m", "--methods", "foam9"], "optim=foam9: no such optim config"),
    ],
)
def test_bad_choices_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        sweep.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("level", "rank", "gwt_level"), [(2, 149, 2), (3, 74, 3), ("mini", 1, 10)])
def test_memory_matched_baselines_on_the_130m_shapes(level, rank, gwt_level):
    """GaLore's and APOLLO's rank and GWT's level whose state is nearest FOAM-l's on LLaMA-130M:
    the neighbouring ranks are farther (the paper's m*r + 2*n*r: about hidden/2.6 per level)."""
    foam = planned_numel("llama_130m", "foam", level=level)
    for method in ("galore", "apollo"):
        assert memory_matched("llama_130m", method, level) == {"rank": rank}
        gap = abs(planned_numel("llama_130m", method, rank=rank) - foam)
        for other in (rank - 1, rank + 1):
            if other >= 1:
                assert gap <= abs(planned_numel("llama_130m", method, rank=other) - foam)
    assert memory_matched("llama_130m", "gwt", level) == {"level": gwt_level}


def test_fold_level_runs_baselines_at_each_levels_memory(capsys):
    commands, _ = dry_run(capsys, "--experiment", "fold_level")
    by_dir = {Path(settings(c)["hydra.run.dir"]).parent.name: settings(c) for c in commands}
    assert len(commands) == 1 + 6 * 4  # Adam, and FOAM + 3 baselines at levels 1-5 and Mini
    assert by_dir["galore_matched_foam3"]["optim.rank"] == "74"
    assert by_dir["apollo_matched_foam_mini"]["optim.rank"] == "1"
    assert by_dir["gwt_matched_foam2"]["optim.level"] == "2"
    assert by_dir["ablation_foam5"]["+optim"] == "foam5" and by_dir["foam2"]["+optim"] == "foam2"


# One tiny run of every experiment kind through the sweep and the trainer, then its table (alpha
# and modulewise_adam are table2's runs at other lrs and alphas: a method is several runs there).
SMOKE = {
    "table2": ("llama_tiny", "foam2"),
    "table3": ("llama_tiny", "galore_1_4"),
    "qwen": ("qwen_tiny", "foam_mini"),
    "seq_len": ("llama_tiny", "foam2_seq512"),
    "int8": ("llama_tiny", "galore8bit"),
    "fold_level": ("llama_tiny", "gwt_matched_foam3"),
    "residual": ("llama_tiny", "ablation_foam2_no_residual"),
    "overtrain": ("llama_tiny", "apollo_1_4_overtrain"),
    "combinations": ("llama_tiny", "foam_muon"),
    "cosine": ("llama_tiny", "cosine_foam2_no_residual"),
}
TABLE_OF = {
    "int8": "int8.md",
    "fold_level": "fold_level.md",
    "qwen": "qwen.md",
    "cosine": "cosine.md",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SMOKE))
def test_tiny_run_of_each_experiment(tmp_path, name):
    model, method = SMOKE[name]
    tiny = [
        o for o in TINY if o != "+model=llama_tiny" and (name != "seq_len" or "seq_len" not in o)
    ]
    if name == "seq_len":  # keep its 512 tokens; the tiny batch still overrides 256 sequences
        tiny = [o for o in tiny if not o.startswith("data.seq_len")]
    argv = ["--experiment", name, "--model", model, "--methods", method, "--seeds", "0"]
    argv += ["--root", str(tmp_path), "--allow-dirty", "--"]
    argv += [*tiny, "trainer.max_steps=2", "trainer.eval_every=1", "trainer.save_every=0"]
    proc = subprocess.run(
        [sys.executable, "scripts/sweep.py", *argv],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary_path,) = tmp_path.rglob("summary.json")
    assert summary_path.parent.parent.name == method
    assert json.loads(summary_path.read_text())["steps"] == 2
    tables = experiment_outputs(load_points(tmp_path), tmp_path)
    if name in TABLE_OF:
        assert "(n=1)" in tables[TABLE_OF[name]] or "layer_0" in tables[TABLE_OF[name]]


def fake_run(root: Path, model: str, method: str, directory: str, ppl: float, metrics=()) -> None:
    """A finished run's summary (and metrics records) where the sweep would have put it."""
    run_dir = root / model / method / directory
    run_dir.mkdir(parents=True)
    history = [{"step": 100, "val_ppl": ppl + 10}, {"step": 200, "val_ppl": ppl}]
    summary = {"final_val_ppl": ppl, "eval_history": history, "steps": 200}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))


def test_tables_put_the_papers_numbers_beside_the_measured(tmp_path):
    fake_run(tmp_path, "llama_60m", "foam8bit", "lr0.01_alpha0.25_seed42", 29.0)
    fake_run(tmp_path, "llama_60m", "foam8bit", "lr0.01_alpha0.25_seed43", 31.0)
    fake_run(tmp_path, "llama_130m", "foam2_seq1024", "lr0.01_alpha0.25_seed42", 25.0)
    cosine = {"step": 200, "update_cosine/layer_0": 0.5, "update_cosine/mean": 0.4}
    fake_run(tmp_path, "llama_2m", "cosine_foam2", "lr0.01_alpha0.25_seed0", 80.0, [cosine])
    fake_run(tmp_path, "llama_2m", "ablation_foam2_no_residual", "lr0.01_alpha0.25_seed0", 95.0)
    fake_run(tmp_path, "llama_2m", "adamw", "lr0.01_alpha0.25_seed0", 70.0)
    fake_run(tmp_path, "llama_2m", "foam2", "lr0.01_alpha0.75_seed0", 75.0)
    tables = experiment_outputs(load_points(tmp_path), tmp_path)
    assert set(tables) == {
        "int8.md",
        "seq_len.md",
        "cosine.md",
        "residual.md",
        "alpha_curves.md",
        "modulewise_adam.md",
    }
    assert "| FOAM-2, alpha 0.75 | 85.00 | 75.00 |" in tables["alpha_curves.md"]
    modulewise = tables["modulewise_adam.md"]
    assert "| AdamW, matrices at lr x alpha (module-wise lr) | 80.00 | 70.00 |" in modulewise
    assert "Full-Adam" not in modulewise  # Adam at its own lr did not run
    int8 = next(line for line in tables["int8.md"].splitlines() if "8-bit FOAM-2" in line)
    # measured mean ± std (n) | the paper's PPL | estimated memory | the paper's memory
    assert "| 30.00 ± 1.41 (n=2) | 28.86 | 0.19G | 0.18G |" in int8
    seq_1024 = tables["seq_len.md"].split("Sequence length 1024")[1]
    assert "| FOAM-2 | 25.00 (n=1) | 24.38 |" in seq_1024
    assert "| layer_0 | 0.500 |" in tables["cosine.md"]
    assert "| FOAM-2 without the residual (rho = 0) | 105.00 | 95.00 |" in tables["residual.md"]


def test_the_cosine_table_reads_the_residual_paired_by_seed(tmp_path):
    """results/cosine_cpu/PROTOCOL.md's readings, on numbers worked by hand: per seed, FOAM-2's
    last cosine minus that of FOAM-2 without the residual, per layer and over the layers."""
    with_r = {0: (0.6, 0.5), 1: (0.7, 0.5), 2: (0.8, 0.5)}  # seed: (layer_0, layer_1)
    without = {0: (0.4, 0.5), 1: (0.4, 0.6), 2: (0.4, 0.7)}
    for method, cosines in (("cosine_foam2", with_r), ("cosine_foam2_no_residual", without)):
        for seed, (layer_0, layer_1) in cosines.items():
            early = {"step": 100, "update_cosine/layer_0": 0.0, "update_cosine/mean": 0.0}
            last = {
                "step": 200,
                "update_cosine/layer_0": layer_0,
                "update_cosine/layer_1": layer_1,
                "update_cosine/mean": (layer_0 + layer_1) / 2,
            }
            directory = f"lr0.01_alpha0.25_seed{seed}"
            fake_run(tmp_path, "llama_2m", method, directory, 80.0, [early, last])
    table = experiment_outputs(load_points(tmp_path), tmp_path)["cosine.md"]
    means, intervals, residual = table.split("llama_2m, ")[1:]
    assert "| layer_0 | 0.700 | 0.400 |" in means  # the last step's, not the first's
    # FOAM-2's layer_0: 0.7 ± 0.1 (n=3), half width t(0.975, 2) 0.1 / sqrt(3) = 0.248
    assert "| layer_0 | [+0.452, +0.948] | [+0.400, +0.400] |" in intervals
    assert "| FOAM-2 |" in residual.splitlines()[2]  # one column: the level run both ways
    assert "| layer_0 | +0.300 ± 0.100 (n=3) [+0.052, +0.548] |" in residual
    assert "| layer_1 | -0.100 ± 0.100 (n=3) [-0.348, +0.148] |" in residual
    assert "| layers' mean | +0.100 ± 0.000 (n=3) [+0.100, +0.100] |" in residual
