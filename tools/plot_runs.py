"""Compare runs in one picture: training loss, validation perplexity, learning rate and tokens/s.

    python scripts/plot_runs.py runs/adamw60m runs/foam2_60m --out runs/compare.png
    python scripts/plot_runs.py runs/sweep/*/ --out sweep.png --x tokens

Reads each run directory's ``metrics.jsonl`` (one JSON object per logged step, written by
``train/pretrain.py``) and labels the run by optimizer, model and key hyperparameters from its
``summary.json`` (or, for a run still going, its resolved ``config.yaml``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PANELS = (
    ("loss", "training loss", "linear"),
    ("val_ppl", "validation perplexity", "log"),
    ("lr", "learning rate (attention/MLP matrices)", "linear"),
    ("tokens_per_s", "tokens/s", "linear"),
)
X_KEYS = {"steps": "step", "tokens": "tokens"}


@dataclass
class Run:
    path: Path
    label: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def series(self, key: str, x_key: str) -> tuple[list[float], list[float]]:
        """(x, y) of every record that has ``key`` (``lr``: the matrices' group, else the first)."""
        xs, ys = [], []
        for record in self.records:
            value = lr_of(record) if key == "lr" else record.get(key)
            if value is not None and record.get(x_key) is not None:
                xs.append(record[x_key])
                ys.append(value)
        return xs, ys


def lr_of(record: dict[str, Any]) -> float | None:
    if "lr/matrices" in record:
        return record["lr/matrices"]
    return next((v for k, v in record.items() if k.startswith("lr/")), None)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The run's records, the last one per (step, kind) kept (a resumed run rewrites its tail)."""
    by_key: dict[tuple[int, bool], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_key[(record.get("step", 0), "val_loss" in record)] = record
    return [by_key[k] for k in sorted(by_key)]


def describe(run_dir: Path) -> str:
    """``foam2 llama_60m lr=0.01 alpha=0.25``: optimizer, model and the hyperparameters that vary."""
    summary_path, config_path = run_dir / "summary.json", run_dir / "config.yaml"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        optim, model, hp = s.get("optim"), s.get("model"), s.get("hparams") or {}
        seed = s.get("seed")
    elif config_path.is_file():
        cfg = yaml.safe_load(config_path.read_text())
        optim, model = cfg["optim"].get("name"), cfg["model"].get("name")
        hp, seed = cfg["optim"], cfg.get("trainer", {}).get("seed")
    else:
        return run_dir.name
    parts = [str(optim), str(model)]
    parts += [f"{k}={hp[k]:g}" for k in ("lr", "alpha") if isinstance(hp.get(k), int | float)]
    if hp.get("level") is not None and str(hp["level"]) not in str(optim):
        parts.append(f"level={hp['level']}")
    if seed is not None:
        parts.append(f"seed={seed}")
    return " ".join(parts)


def load_runs(run_dirs: list[Path]) -> list[Run]:
    runs = []
    for run_dir in run_dirs:
        metrics = run_dir / "metrics.jsonl"
        if not metrics.is_file():
            raise FileNotFoundError(f"{run_dir} has no metrics.jsonl (not a run directory?)")
        runs.append(Run(run_dir, describe(run_dir), read_records(metrics)))
    labels = [r.label for r in runs]
    for run in runs:  # two runs with the same settings: tell them apart by directory
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({run.path.name})"
    return runs


def plot(runs: list[Run], out: Path, x: str = "steps") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for ax, (key, title, scale) in zip(axes.flat, PANELS, strict=True):
        for run in runs:
            xs, ys = run.series(key, X_KEYS[x])
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, ms=3, label=run.label)
        ax.set(title=title, xlabel=x, yscale=scale)
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(runs), 3))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--x", choices=sorted(X_KEYS), default="steps", help="x axis")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.run_dirs)
    except (FileNotFoundError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {plot(runs, args.out, args.x)}")
    return 0
