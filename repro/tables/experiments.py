"""The paper's other experiments laid out as the paper does (``repro.make_tables`` calls this).

Tables 2 and 3 are ``repro.tables.table2``/``table3``'s; here are the Qwen, sequence-length and 8-bit tables
(measured mean ± std (n) beside the paper's printed numbers, and for 8-bit the estimated memory
beside the paper's), and the figures as tables: fold level (final PPL of FOAM-l and of each
baseline at FOAM-l's memory), residual and overtraining (validation PPL over the steps), and the
update cosine (per layer and module type, at the last measured step; ``cosine.png`` with
``--curves``). Each experiment's rows are its variants (``repro/experiments.py``) on the models
found under the root, so a CPU-scale run of an experiment (``--model llama_2m``) is laid out as
the paper-scale one; the paper's number is shown where the model is one of the paper's (or stands
in for one, ``paper_perplexity.STAND_INS``).
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from repro.experiments import (
    EXPERIMENTS,
    INT8_METHODS,
    LLAMA_SMALL,
    NO_RESIDUAL,
    QWEN,
    QWEN_METHODS,
    SEQ_LEN_METHODS,
    SEQ_LENS,
    Run,
    fold_levels,
    is_paper_size,
)
from repro.memory_estimator import estimate, table2_gb
from repro.methods import Variant, label
from repro.paired_stats import confidence_interval, fmt_diff, fmt_interval, spread
from repro.paper_perplexity import STAND_INS
from repro.points import fmt_gb, fmt_ppl, load_points, model_order
from repro.runs import run_dir_fields
from repro.tables.figures import save_figure
from repro.tables.finetune import finetune_outputs
from train.update_cosine import PREFIX

# The paper's printed numbers (paper/foam_paper.tex), at 60M, 130M and 350M.
PAPER_QWEN_PPL: dict[str, tuple[float, float, float]] = {
    "adamw": (29.71, 22.82, 16.97),
    "adam_mini": (30.04, 24.12, 17.55),
    "muon": (28.93, 22.16, 16.78),
    "galore_1_4": (33.22, 25.63, 19.58),
    "apollo_1_4": (30.00, 23.43, 16.83),
    "foam2": (28.57, 21.25, 15.80),
    "apollo_mini": (32.05, 23.34, 16.97),
    "gwt_mini": (31.88, 23.31, 17.60),
    "foam_mini": (27.98, 21.75, 15.99),
}
"""``tab:validation_qwen_60m_350m``."""
PAPER_SEQ_LEN_PPL: dict[int, dict[str, tuple[float, float, float]]] = {
    512: {
        "adamw": (31.54, 23.77, 17.98),
        "muon": (30.36, 23.48, 17.62),
        "adam_mini": (31.91, 24.77, 18.91),
        "galore_1_4": (35.25, 27.19, 19.92),
        "apollo_1_4": (32.02, 24.04, 17.26),
        "foam2": (29.26, 22.47, 16.34),
    },
    1024: {
        "adamw": (35.07, 26.34, 20.72),
        "muon": (33.21, 26.11, 19.60),
        "adam_mini": (36.30, 28.41, 21.47),
        "galore_1_4": (38.09, 29.51, 21.73),
        "apollo_1_4": (34.04, 25.93, 18.77),
        "foam2": (31.69, 24.38, 17.75),
    },
}
"""``tab:validation_llama_60m_350m_seq_length``."""
PAPER_INT8: dict[str, tuple[tuple[float, float], ...]] = {
    "adamw8bit": ((30.78, 0.22), (23.30, 0.53), (17.99, 1.46)),
    "galore8bit": ((34.88, 0.18), (25.53, 0.38), (19.79, 0.92)),
    "foam8bit": ((28.86, 0.18), (22.66, 0.36), (16.02, 0.86)),
}
"""``tab:validation_llama_60m-350m_int8``: (PPL, memory in GB)."""
OUTPUT_FILES = {"alpha": "alpha_curves.md"}
"""Experiments whose table file is not ``NAME.md`` (``alpha.md`` is ``make_tables``' own)."""
CURVE_COLUMNS = 6  # evaluation steps a curve is shown at (evenly spaced, the last included)


def paper_index(model: str, sizes: Sequence[str]) -> int | None:
    """The column of ``model`` (or the paper model it stands in for) in a table over ``sizes``."""
    name = STAND_INS.get(model, model)
    return sizes.index(name) if name in sizes else None


class Found:
    """The finished runs under a root, by (model, method directory), from repro.points' points."""

    def __init__(self, points: Iterable[Any], root: Path) -> None:
        self.root = root
        self.by_dir: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for point in points:
            if not point.key.stage:
                self.by_dir[(point.key.model, point.key.method)].append(point)
        self.models = sorted({model for model, _ in self.by_dir}, key=model_order)

    def point(self, run: Run) -> Any | None:
        """The grid point of ``run`` (its lr and alpha; every seed found), if any ran."""
        for point in self.by_dir.get((run.point.model, run.point.name), []):
            if point.key.lr == run.point.lr and point.key.alpha_or_none == run.point.alpha:
                return point
        return None

    def runs(self, experiment: str) -> list[tuple[Run, Any]]:
        """One run per (model, variant) of ``experiment`` and its point (``None``: not run), on
        the models found that are the experiment's, stand in for one, or are no paper size.
        Variants that share a method directory differ in their lr or alpha."""
        sizes = EXPERIMENTS[experiment].models
        chosen = [
            m
            for m in self.models
            if STAND_INS.get(m, m) in sizes or m in sizes or not is_paper_size(m)
        ]
        seen, out = set(), []
        for run in EXPERIMENTS[experiment].runs(chosen, seeds=[0]) if chosen else []:
            key = (run.point.model, run.point.name, run.point.lr, run.point.alpha)
            if key not in seen:
                seen.add(key)
                out.append((run, self.point(run)))
        return out

    def cells(self, experiment: str) -> dict[tuple[str, str], Any]:
        """The points that ran, by (model, method directory)."""
        return {(r.point.model, r.point.name): p for r, p in self.runs(experiment) if p is not None}

    def metrics(self, point: Any) -> dict[int, list[dict[str, Any]]]:
        """Each seed's ``metrics.jsonl`` records of ``point``, by seed."""
        key = point.key
        method_dir = self.root / key.model / key.method
        out = {}
        for run_dir in sorted(method_dir.iterdir()):
            fields, path = run_dir_fields(run_dir.name), run_dir / "metrics.jsonl"
            if fields and fields[:2] == (key.lr, key.alpha_or_none) and path.exists():
                out[fields[3]] = [json.loads(line) for line in path.read_text().splitlines()]
        return out


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def paper_fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ppl_table(
    found: Found,
    experiment: str,
    sizes: Sequence[str],
    paper: dict[str, tuple[float, ...]],
    rows: Sequence[str],
) -> str:
    """Rows x models: measured PPL | the paper's (where it prints one)."""
    cells = found.cells(experiment)
    models = sorted({m for m, _ in cells}, key=model_order)
    header = ["method", *(f"{m} {what}" for m in models for what in ("measured", "paper"))]
    body = []
    for method in rows:
        row = [label(method)]
        for model in models:
            index = paper_index(model, sizes)
            printed = paper.get(method)
            row += [
                fmt_ppl(cells.get((model, method)), latex=False),
                paper_fmt(None if index is None or printed is None else printed[index]),
            ]
        body.append(row)
    return markdown(header, body)


def seq_len_table(found: Found) -> str:
    """The sequence-length table: per length, the methods x models."""
    parts = []
    for seq_len in SEQ_LENS:
        cells = found.cells("seq_len")
        models = sorted(
            {m for m, name in cells if name.endswith(f"_seq{seq_len}")}, key=model_order
        )
        header = ["method", *(f"{m} {what}" for m in models for what in ("measured", "paper"))]
        body = []
        for method in SEQ_LEN_METHODS:
            row = [label(method)]
            for model in models:
                index = paper_index(model, LLAMA_SMALL)
                printed = PAPER_SEQ_LEN_PPL[seq_len][method]
                row += [
                    fmt_ppl(cells.get((model, f"{method}_seq{seq_len}")), latex=False),
                    paper_fmt(None if index is None else printed[index]),
                ]
            body.append(row)
        parts.append(f"Sequence length {seq_len}:\n\n" + markdown(header, body))
    return "\n".join(parts)


def int8_table(found: Found) -> str:
    """The 8-bit table: PPL measured | paper, memory estimated | paper (GB)."""
    cells = found.cells("int8")
    models = sorted({m for m, _ in cells}, key=model_order)
    what = ("PPL", "paper PPL", "est. memory", "paper memory")
    header = ["method", *(f"{m} {w}" for m in models for w in what)]
    body = []
    for method in INT8_METHODS:
        row = [label(method)]
        for model in models:
            index = paper_index(model, LLAMA_SMALL)
            ppl, memory = (None, None) if index is None else PAPER_INT8[method][index]
            row += [
                fmt_ppl(cells.get((model, method)), latex=False),
                paper_fmt(ppl),
                fmt_gb(table2_gb(estimate(model, method))),
                "-" if memory is None else f"{memory:.2f}G",
            ]
        body.append(row)
    return markdown(header, body)


def fold_level_table(found: Found) -> str:
    """Final PPL per FOAM level: FOAM-l and each baseline sized to FOAM-l's state; Adam's line."""
    cells = {(r.point.model, r.variant.name): (r, p) for r, p in found.runs("fold_level")}
    parts = []
    for model in sorted({m for m, _ in cells}, key=model_order):
        adam = cells.get((model, "adamw"), (None, None))[1]
        header = ["level", "FOAM", "GaLore", "APOLLO", "GWT"]
        body = []
        for level, variant in fold_levels():
            row = [str(level), fmt_ppl(cells.get((model, variant.name), (None, None))[1], False)]
            for method in ("galore", "apollo", "gwt"):
                run, point = cells.get((model, f"{method}_matched_{variant.optim}"), (None, None))
                knob = "" if run is None else " (" + " ".join(run.variant.overrides) + ")"
                row.append(fmt_ppl(point, latex=False) + knob)
            body.append(row)
        parts.append(
            f"{model} (Full-Adam: {fmt_ppl(adam, latex=False)}):\n\n" + markdown(header, body)
        )
    return "\n".join(parts)


def curve_table(found: Found, experiment: str) -> str:
    """Validation PPL over the steps (mean over seeds), per model: the paper's curves as rows."""
    parts = []
    by_model: dict[str, list[tuple[Variant, Any]]] = defaultdict(list)
    for run, point in found.runs(experiment):
        if point is not None:
            by_model[run.point.model].append((run.variant, point))
    for model, curves in by_model.items():
        steps = sorted({step for _, p in curves for step in p.evaluations()})
        shown = steps[:: max(1, -(-len(steps) // CURVE_COLUMNS))][: CURVE_COLUMNS - 1] + steps[-1:]
        body = []
        for variant, point in curves:
            row = [variant.label]
            for step in shown:
                ppl = point.ppl_at(step)
                row.append("-" if ppl is None else f"{ppl:.2f}")
            body.append(row)
        header = ["method", *(f"step {s}" for s in shown)]
        parts.append(f"{model}:\n\n" + markdown(header, body))
    return "\n".join(parts)


CosinesBySeed = dict[int, dict[str, float]]
"""Each seed's update-cosine record at the last measured step (keys without ``PREFIX``)."""


def last_cosines(found: Found, point: Any) -> CosinesBySeed:
    """The update-cosine record of the last measured step, by seed."""
    out = {}
    for seed, records in found.metrics(point).items():
        logged = [r for r in records if f"{PREFIX}mean" in r]
        if logged:
            out[seed] = {
                k.removeprefix(PREFIX): v for k, v in logged[-1].items() if k.startswith(PREFIX)
            }
    return out


def seed_mean(by_seed: CosinesBySeed) -> dict[str, float]:
    keys = {k for record in by_seed.values() for k in record}
    return {k: statistics.fmean(r[k] for r in by_seed.values() if k in r) for k in keys}


def layers_mean(record: dict[str, float]) -> float:
    """The mean of a record's per-layer cosines (each layer weighs the same)."""
    return statistics.fmean(v for k, v in record.items() if k.startswith("layer_"))


def cosine_rows(found: Found) -> dict[str, list[tuple[Variant, CosinesBySeed]]]:
    out: dict[str, list[tuple[Variant, CosinesBySeed]]] = defaultdict(list)
    for run, point in found.runs("cosine"):
        if point is not None:
            out[run.point.model].append((run.variant, last_cosines(found, point)))
    return out


def _layer_order(key: str) -> tuple[int, int | str]:
    if key.startswith("layer_"):
        return 0, int(key.removeprefix("layer_"))
    return (2, key) if key == "mean" else (1, key)


def cosine_table(found: Found) -> str:
    """Cosine with Adam's step at the last measured step: the seeds' mean per layer (the appendix
    figure's axis), per module type and overall; each layer's 95% interval over the seeds; and
    the residual's effect paired by seed (with minus without, per layer and over the layers), the
    readings of results/cosine_cpu/PROTOCOL.md."""
    parts = []
    for model, columns in cosine_rows(found).items():
        header = ["", *(variant.label for variant, _ in columns)]
        means = [seed_mean(by_seed) for _, by_seed in columns]
        keys = sorted({k for m in means for k in m}, key=_layer_order)
        body = [[key, *(f"{m[key]:.3f}" if key in m else "-" for m in means)] for key in keys]
        parts.append(f"{model}, the seeds' mean:\n\n" + markdown(header, body))
        layers = [k for k in keys if k.startswith("layer_")]
        body = [
            [layer, *(_interval([r[layer] for r in c.values() if layer in r]) for _, c in columns)]
            for layer in layers
        ]
        parts.append(f"{model}, 95% t interval over the seeds:\n\n" + markdown(header, body))
        residual = residual_table(columns, layers)
        if residual:
            parts.append(
                f"{model}, with the residual minus without, paired by seed: mean ± std (n) "
                "[95% t interval]:\n\n" + residual
            )
    return "\n".join(parts)


def _interval(values: list[float]) -> str:
    return fmt_interval(confidence_interval(spread(values)), 3)


def residual_table(columns: list[tuple[Variant, CosinesBySeed]], layers: list[str]) -> str:
    """For each FOAM level run with and without the residual, the paired difference of their
    cosines per layer and over the layers ("" when no level has both)."""
    by_name = {variant.name: (variant, by_seed) for variant, by_seed in columns}
    pairs = [
        (by_name[name.removesuffix(NO_RESIDUAL)], (variant, by_seed))
        for name, (variant, by_seed) in by_name.items()
        if name.endswith(NO_RESIDUAL) and name.removesuffix(NO_RESIDUAL) in by_name
    ]
    if not pairs:
        return ""

    def cell(with_r: CosinesBySeed, without: CosinesBySeed, of: Callable) -> str:
        seeds = sorted(set(with_r) & set(without))
        diff = spread([of(with_r[s]) - of(without[s]) for s in seeds])
        return f"{fmt_diff(diff, 3)} {fmt_interval(confidence_interval(diff), 3)}"

    rows = [(layer, operator.itemgetter(layer)) for layer in layers]
    rows.append(("layers' mean", layers_mean))
    body = [[name, *(cell(w[1], wo[1], of) for w, wo in pairs)] for name, of in rows]
    return markdown(["", *(w[0].label for w, _ in pairs)], body)


def plot_cosine(found: Found, out: Path) -> list[Path]:
    """``cosine_MODEL.png``: the cosine with Adam's step per layer (the seeds' mean at the last
    measured step), one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for model, columns in cosine_rows(found).items():
        fig, ax = plt.subplots(figsize=(6, 4))
        ticks: set[int] = set()
        for variant, by_seed in columns:
            layers = sorted(
                (int(k.removeprefix("layer_")), v)
                for k, v in seed_mean(by_seed).items()
                if k.startswith("layer_")
            )
            ticks.update(i for i, _ in layers)
            ax.plot([i for i, _ in layers], [v for _, v in layers], marker="o", label=variant.label)
        ax.set_xticks(sorted(ticks))  # whole layers
        ax.set_xlabel("layer")
        ax.set_ylabel("cosine with Adam's update")
        ax.set_title(f"{model}: update cosine with Adam")
        ax.legend(fontsize=8)
        paths.append(save_figure(fig, out / f"cosine_{model}.png", ax))
    return paths


def experiment_outputs(
    points: Iterable[Any], root: Path, figures: Path | None = None
) -> dict[str, str]:
    """The experiments' tables (markdown) by file name, those with runs only; with ``figures``,
    the cosine figure is drawn there too."""
    found = Found(points, root)
    tables = {
        "qwen": lambda: ppl_table(found, "qwen", QWEN, PAPER_QWEN_PPL, QWEN_METHODS),
        "seq_len": lambda: seq_len_table(found),
        "int8": lambda: int8_table(found),
        "fold_level": lambda: fold_level_table(found),
        "residual": lambda: curve_table(found, "residual"),
        "overtrain": lambda: curve_table(found, "overtrain"),
        "combinations": lambda: curve_table(found, "combinations"),
        "alpha": lambda: curve_table(found, "alpha"),
        "modulewise_adam": lambda: curve_table(found, "modulewise_adam"),
        "gpt2_deberta": lambda: curve_table(found, "gpt2_deberta"),
        "cosine": lambda: cosine_table(found),
    }
    if figures is not None:
        figures.mkdir(parents=True, exist_ok=True)
        plot_cosine(found, figures)
    outputs = {
        OUTPUT_FILES.get(name, f"{name}.md"): make()
        for name, make in tables.items()
        if found.cells(name)
    }
    return {**outputs, **finetune_outputs(root)}


def main(argv: list[str] | None = None) -> int:
    """The experiments' tables alone, for a root that has no Table 2 runs (``make_tables.py``
    needs those and adds these tables to its own)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory searched for summary.json files")
    parser.add_argument(
        "--out", type=Path, default=None, help="write the tables (and figures) here"
    )
    parser.add_argument("--curves", action="store_true", help="also draw the cosine figure (PNG)")
    args = parser.parse_args(argv)
    outputs = experiment_outputs(
        load_points(args.root), args.root, args.out if args.curves else None
    )
    if not outputs:
        raise SystemExit(f"no finished runs of the experiments under {args.root}")
    for name, text in outputs.items():
        if args.out is None:
            print(f"## {name}\n\n{text}")
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / name).write_text(text)
    if args.out is not None:
        print(f"wrote {', '.join(sorted(outputs))} to {args.out}")
    return 0
