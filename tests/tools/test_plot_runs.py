"""tools/plot_runs.py: one PNG of loss, val PPL, lr and tokens/s for any set of run directories."""

import json
import math
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
plot_runs = runpy.run_path(str(REPO / "tools" / "plot_runs.py"))


def fake_run(path: Path, optim: str, lr: float, steps: int = 6, summary: bool = True) -> Path:
    path.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        lines.append(
            {
                "step": step,
                "tokens": 100 * step,
                "loss": 5 - step / 2,
                "lr/matrices": lr * step,
                "lr/others": lr,
                "tokens_per_s": 1000.0 + step,
            }
        )
        if step % 2 == 0:
            lines.append(
                {"step": step, "tokens": 100 * step, "val_loss": 4.0, "val_ppl": math.e**4}
            )
    lines.append({**lines[-2], "loss": 0.5})  # a resumed run rewrites the last step
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if summary:
        hp = {"lr": lr, "alpha": 0.25, "level": 2}
        (path / "summary.json").write_text(
            json.dumps({"optim": optim, "model": "llama_tiny", "hparams": hp, "seed": 0})
        )
    else:
        cfg = (
            "model:\n  name: llama_tiny\noptim:\n  name: adamw\n  lr: 0.001\ntrainer:\n  seed: 1\n"
        )
        (path / "config.yaml").write_text(cfg)
    return path


def test_runs_are_labelled_and_read_as_logged(tmp_path):
    runs = plot_runs["load_runs"](
        [
            fake_run(tmp_path / "a", "foam2", 0.01),
            fake_run(tmp_path / "b", "foam2", 0.01),
            fake_run(tmp_path / "c", "adamw", 0.001, summary=False),
        ]
    )
    assert [r.label for r in runs] == [
        "foam2 llama_tiny lr=0.01 alpha=0.25 seed=0 (a)",
        "foam2 llama_tiny lr=0.01 alpha=0.25 seed=0 (b)",
        "adamw llama_tiny lr=0.001 seed=1",
    ]
    xs, ys = runs[0].series("loss", "step")
    assert xs == [1, 2, 3, 4, 5, 6] and ys[-1] == 0.5  # the rewritten step wins
    assert runs[0].series("val_ppl", "tokens") == ([200, 400, 600], [math.e**4] * 3)
    assert runs[0].series("lr", "step")[1][:2] == [0.01, 0.02]  # the matrices' group


def test_main_writes_one_png(tmp_path, capsys):
    runs = [fake_run(tmp_path / "a", "foam2", 0.01), fake_run(tmp_path / "b", "adamw", 0.001)]
    out = tmp_path / "plots" / "compare.png"
    assert plot_runs["main"]([*map(str, runs), "--out", str(out), "--x", "tokens"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert str(out) in capsys.readouterr().out


def test_a_directory_without_metrics_is_a_one_line_error(tmp_path, capsys):
    assert plot_runs["main"]([str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
