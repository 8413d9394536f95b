"""The finished runs of a sweep or of the CPU study as grid points, each row's best point, and
the order of the rows (Table 2's).

A run's place is read from its path, ``ROOT[/STAGE]/MODEL/METHOD/lr{lr}[_alpha{a}][_gap{g}]_seed{s}``
as ``scripts/sweep.py`` and ``scripts/reproduce_cpu.py`` lay them out (``STAGE`` is ``search`` or
``final`` for the latter), its lr from its summary where the summary records one
(``recorded_lr``). Runs of one point (model, method, lr, alpha, refresh gap) are its seeds:
mean, **sample** standard deviation and n. Every table (``repro/tables/``,
``repro/cpu_study/tables/``) reads runs through this module.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from repro.methods import CONTROL_LABEL, MODULEWISE, TABLE2_BLOCKS, label
from repro.runs import run_dir_fields
from train.summary import DIVERGED_FILE, finished_records

STAGES = ("search", "final", "long")  # "long": the v4 study's 10,000-step runs
CONTROL = "adamw_control"  # Table 2's row for the module-wise-lr AdamW control
EDGE = "†"
NO_ALPHA = -1.0  # the alpha of a point whose method has none (keeps Key sortable and hashable)


@dataclass(frozen=True, order=True)
class Key:
    """Where a run belongs: everything but its seed."""

    stage: str
    model: str
    method: str
    lr: float
    alpha: float
    gap: int

    @property
    def alpha_or_none(self) -> float | None:
        return None if self.alpha == NO_ALPHA else self.alpha


@dataclass
class Point:
    """One grid point and its seeds: ``ppl_by_seed`` (inf: diverged) and their summaries."""

    key: Key
    ppl_by_seed: dict[int, float]
    runs: list[dict]

    @property
    def n(self) -> int:
        return len(self.ppl_by_seed)

    @property
    def mean_ppl(self) -> float:
        return statistics.fmean(self.ppl_by_seed.values())

    @property
    def std_ppl(self) -> float | None:
        """Sample standard deviation (n - 1); None for one seed."""
        values = list(self.ppl_by_seed.values())
        return statistics.stdev(values) if len(values) > 1 else None

    def mean(self, key: str) -> float:
        return statistics.fmean(r[key] for r in self.runs)

    def evaluations(self) -> dict[int, list[dict]]:
        """The seeds' validation records (``eval_history``: step, tokens, val_ppl) by step, for
        the steps every seed logged, in order: a mean over seeds is over all of them or none."""
        by_step: dict[int, list[dict]] = defaultdict(list)
        for run in self.runs:
            for record in run.get("eval_history", []):
                by_step[record["step"]].append(record)
        return {s: by_step[s] for s in sorted(by_step) if len(by_step[s]) == len(self.runs)}

    def ppl_at(self, step: int) -> float | None:
        """Mean over seeds of the validation perplexity logged at ``step`` (None unless every
        seed logged it)."""
        records = self.evaluations().get(step)
        return statistics.fmean(e["val_ppl"] for e in records) if records else None


def recorded_lr(summary: dict | None, named: float) -> float:
    """A run's lr as the run records it (its summary's ``lr``, the optimizer's); ``named``, the lr
    its directory's name gives, only for a run that records none (a diverged run, whose record
    holds only where it stopped, and summaries written before they held the lr)."""
    lr = (summary or {}).get("lr")
    return named if lr is None else float(lr)


def _key(root: Path, run_dir: Path, summary: dict | None) -> tuple[Key, int] | None:
    fields = run_dir_fields(run_dir.name)
    parts = run_dir.relative_to(root).parts
    if fields is None or len(parts) < 3:
        return None
    named_lr, alpha, gap, seed = fields
    stage = parts[0] if parts[0] in STAGES and len(parts) >= 4 else ""
    lr = recorded_lr(summary, named_lr)
    key = Key(stage, parts[-3], parts[-2], lr, NO_ALPHA if alpha is None else alpha, gap or 0)
    return key, seed


def load_points(root: Path, metric: str = "final_val_ppl") -> list[Point]:
    """Every finished (``summary.json``) or diverged (``DIVERGED_FILE``) run under ``root``, each
    seed's perplexity its summary's ``metric`` (the v4 study reads ``final_test_ppl``)."""
    ppls: dict[Key, dict[int, float]] = defaultdict(dict)
    runs: dict[Key, list[dict]] = defaultdict(list)
    for path in finished_records(root):
        summary = None if path.name == DIVERGED_FILE else json.loads(path.read_text())
        located = _key(root, path.parent, summary)
        if located is None:
            continue
        key, seed = located
        if summary is None:
            ppls[key][seed] = math.inf
            continue
        ppl = summary.get(metric)
        ppls[key][seed] = ppl if ppl is not None and math.isfinite(ppl) else math.inf
        runs[key].append(summary)
    return [Point(key, ppls[key], runs[key]) for key in sorted(ppls)]


def row_of(point: Point) -> str:
    """Table 2's row a point can fill: AdamW below alpha 1 is the module-wise-lr control."""
    alpha = point.key.alpha_or_none
    if point.key.method == "adamw" and alpha is not None and alpha != 1.0:
        return CONTROL
    return point.key.method


def row_label(row: str) -> str:
    return CONTROL_LABEL if row == CONTROL else label(row)


def first_stage(points: list[Point], preference: tuple[str, ...]) -> str:
    """The first stage of ``preference`` that has points ("" for runs laid out without stages)."""
    stages = {p.key.stage for p in points}
    return next((s for s in preference if s in stages), "")


def table_stage(points: list[Point]) -> str:
    """The stage Tables 2-3 read: the finals when there are any (else the search: a study in
    progress; its rows say n=1)."""
    return first_stage(points, ("final", "search"))


def stages(points: list[Point]) -> list[str]:
    """The stages present, the search's first ("" for runs laid out without stages)."""
    present = {p.key.stage for p in points}
    return [s for s in ("", *STAGES) if s in present]


def best_points(points: list[Point], stage: str | None = None) -> dict[tuple[str, str], Point]:
    """(model, row) -> the point of ``stage`` (default: ``table_stage``) with the most seeds, then
    the lowest mean perplexity (a point with a diverged seed counts as diverged, not left out).

    The control row competes with AdamW at alpha 1 too (alpha 1 is part of its grid), once it has
    a point of its own at ``stage``: before that, it would only repeat Full-Adam's row.
    """
    stage = table_stage(points) if stage is None else stage
    at_stage = [p for p in points if p.key.stage == stage]
    controls = {p.key.model for p in at_stage if row_of(p) == CONTROL}
    best: dict[tuple[str, str], Point] = {}

    def rank(p: Point) -> tuple:
        return (-p.n, p.mean_ppl, p.key)

    for point in at_stage:
        rows = [row_of(point)]
        if point.key.method == "adamw" and rows[0] != CONTROL and point.key.model in controls:
            rows.append(CONTROL)
        for row in rows:
            key = (point.key.model, row)
            if key not in best or rank(point) < rank(best[key]):
                best[key] = point
    return best


def model_order(name: str) -> tuple[str, float]:
    """llama_60m < llama_130m < llama_1b; unknown sizes (tiny) first."""
    family, _, size = name.partition("_")
    scale = {"m": 1e6, "b": 1e9}.get(size[-1:], 0.0)
    try:
        return family, float(size[:-1]) * scale
    except ValueError:
        return family, 0.0


def fmt_ppl(point: Point | None, latex: bool, flag: bool = False) -> str:
    if point is None:
        return "-"
    mark = EDGE if flag else ""
    if not math.isfinite(point.mean_ppl):
        diverged = sum(not math.isfinite(v) for v in point.ppl_by_seed.values())
        return f"diverged ({diverged} of {point.n} seeds){mark}"
    std = point.std_ppl
    if latex:
        spread = "" if std is None else f"_{{\\pm {std:.2f}}}"
        return f"${point.mean_ppl:.2f}{spread}$" + ("$^\\dagger$" if flag else "")
    spread = "" if std is None else f" ± {std:.2f}"
    return f"{point.mean_ppl:.2f}{spread} (n={point.n}){mark}"


def fmt_gb(gb: float | None) -> str:
    """Decimal GB as the paper prints them; models under 0.1 GB in MB, to stay readable."""
    if gb is None:
        return "-"
    return f"{gb:.2f}G" if gb >= 0.1 else f"{gb * 1e3:.2f}M"


def method_rows(rows_seen: set[str], beside_control: Iterable[str] = ()) -> list[str | None]:
    """Table 2's rows present in the data, in the paper's order (None: a block separator); the
    control and any of ``beside_control`` present close the first block."""
    rows: list[str | None] = []
    for index, block in enumerate(TABLE2_BLOCKS):
        present = [m.name for m in block if m.name in rows_seen]
        if index == 0:
            present += [row for row in (CONTROL, *beside_control) if row in rows_seen]
        if present:
            rows += [None, *present] if rows else present
    return rows


def ordered(keys: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(model, row) keys by model size, then in Table 2's order, with the study's module-wise
    Muon and Adam-mini (not Table 2's rows) beside the control."""
    keys = set(keys)
    modulewise = [m.name for m in MODULEWISE]
    return [
        (model, row)
        for model in sorted({m for m, _ in keys}, key=model_order)
        for row in method_rows({r for m, r in keys if m == model}, beside_control=modulewise)
        if row is not None
    ]
