"""The CPU study's v4 (results/repro/PROTOCOL.md, amendment "v4"): three questions, each read on a
test split that no choice was made on.

* **Q1** (``Q1_ROWS``): FOAM-2, Muon (module-wise), APOLLO-1/4 and the control at their v3
  points, bracketed at full length in all eight factor-2 directions of (lr, alpha), then 8 seeds.
* **Q2** (``Q2_ROWS``): every row's embeddings, head and norms at one AdamW lr (``SHARED_LR``),
  its matrices' lr (alpha) walked to a bracketed optimum at full length, then 3 seeds.
* **Q3** (``Q3_ROWS``, in priority order): 10,000 steps on a second corpus (about 22 tokens per
  parameter), each row bracketed in both of its lrs at that length, then 3 seeds, on the corpus
  pinned here (``LONG_CORPUS``); stopped on the budget at its first three rows
  (``Q3.stopped_after``).

The machinery is v3's (``repro.cpu_study.study.Study``: resumable runs, the coordinate walk, the
slots); v4 adds the test split to every run, its own directories (``--root``, committed under
``results/repro/v4/runs``), and reads v3's full-length seed-0 runs as walk data, which the
amendment allows because the v4 trainer reproduces their validation numbers digit for digit.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from repro.cpu_study.make_corpus import corpus_digest
from repro.cpu_study.study import (
    CONTROL,
    FINAL_STEPS,
    LOOKUP_SECONDS,
    METHODS,
    MODEL,
    Method,
    Setting,
    Study,
)
from repro.cpu_study.study import protocol as v3_protocol
from repro.runs import REPO, run_dir_fields

V3_RUNS = REPO / "results" / "repro" / "runs"  # v3's committed runs: walk data for Q1 and Q2
V4_RUNS = REPO / "results" / "repro" / "v4" / "runs"
V3_EVAL_TOKENS = 278_528  # the 1,088 validation rows the v3 trainer scored (PROTOCOL.md, v4)
TEST_TOKENS = 400_000  # more than the mirror's 393,814 test tokens: the whole split
HANDOVER_SECONDS = 10  # ample for a finished run's walk to ask for its next runs (~0.1 s)
# make_corpus.py's test split of the study's mirror (repro/cpu_study/corpora.py
# STUDY_TEST_PACKAGES), pinned by the amendment.
TEST_DIGEST = "24bca6d9f2a40b7b7bc896fa7160fb27a9bdf97b29867aea8274e3c6a416a8b6"
Q1_SEEDS = tuple(range(8))
SEEDS = (0, 1, 2)
SHARED_LR = 0.04  # Q2: the non-matrix lr of the control's v3 equal-freedom point
LONG_STEPS = 10_000
LONG_EVAL_EVERY = 500
LONG_EVAL_TOKENS = 10_000_000  # every split of the Q3 corpus is smaller: the whole split
FULL = "final"  # 1,000-step runs (Q1, Q2); the directory name v3's full-length runs have
LONG = "long"  # 10,000-step runs (Q3)


@dataclass(frozen=True)
class LongCorpus:
    """The Q3 corpus, pinned by the dated note that must precede any Q3 run (PROTOCOL.md, v4)."""

    digest: str  # corpus_digest of its train and validation splits
    test_digest: str


LONG_CORPUS = LongCorpus(  # PROTOCOL.md v4, "Pin note" (2026-11-28)
    digest="f228d6aed08aa422ca216ae08633770d0c91a3c9a6658539458b5f22da3444ad",
    test_digest="69514f9e8aebf9e0fef163161f55a4525fbfc3b7bc1bea4a95fd26c7fa5bfd65",
)


def method(name: str, *, searches_alpha: bool = True) -> Method:
    return next(m for m in METHODS if m.name == name and m.searches_alpha == searches_alpha)


@dataclass(frozen=True)
class Row:
    """A v4 row: a v3 method and where its walk starts (its v3 point)."""

    method: Method
    start: Setting


Q1_ROWS = (
    Row(method("foam2"), Setting(0.04, 0.0625, None)),
    Row(method("muon_modulewise"), Setting(0.08, 0.03125, None)),
    Row(method("apollo_1_4"), Setting(0.04, 0.25, 20)),
    Row(CONTROL, Setting(0.04, 0.0625, None)),
)
Q2_ROWS = (
    Row(CONTROL, Setting(SHARED_LR, 0.0625, None)),
    Row(method("muon_modulewise"), Setting(SHARED_LR, 0.0625, None)),
    Row(method("galore_1_4"), Setting(SHARED_LR, 0.5, 20)),
    Row(method("apollo_1_4"), Setting(SHARED_LR, 0.25, 20)),
    Row(method("foam2"), Setting(SHARED_LR, 0.0625, None)),
    Row(method("foam3"), Setting(SHARED_LR, 0.03125, None)),
    Row(method("apollo_mini"), Setting(SHARED_LR, 4.0, 20)),
    Row(method("foam_mini"), Setting(SHARED_LR, 0.03125, None)),
)
Q3_ROWS = (  # priority order: a row starts only after every row before it has started
    Row(method("foam2"), Setting(0.04, 0.0625, None)),
    Row(CONTROL, Setting(0.04, 0.0625, None)),
    Row(method("muon_modulewise"), Setting(0.08, 0.03125, None)),
    Row(method("apollo_1_4"), Setting(0.04, 0.25, 200)),  # 50 refreshes in 10,000 steps
    Row(method("foam_mini"), Setting(0.04, 0.03125, None)),
    Row(method("adamw", searches_alpha=False), Setting(2.5e-3, 1.0, None)),
)


def q3_rank(name: str, setting: Setting) -> int:
    """A Q3 run's row in ``Q3_ROWS``; the control and Full-Adam share AdamW's directory, and a
    run at alpha 1 is Full-Adam's (the control at alpha 1 is the same run)."""
    full_adam = name == "adamw" and setting.alpha == 1.0
    return next(
        i
        for i, row in enumerate(Q3_ROWS)
        if row.method.name == name and (row.method.searches_alpha != full_adam)
    )


def scaled(s: Setting, lr: float, alpha: float) -> Setting:
    return Setting(s.lr * lr, None if s.alpha is None else s.alpha * alpha, s.gap)


def eight_directions(s: Setting, m: Method) -> list[Setting]:
    """Q1: every factor-2 step of lr, alpha or both, either way."""
    alphas = (0.5, 1.0, 2.0) if m.searches_alpha else (1.0,)
    steps = [(f, g) for f in (0.5, 1.0, 2.0) for g in alphas if (f, g) != (1.0, 1.0)]
    return [scaled(s, f, g) for f, g in steps]


def matrices_only(s: Setting, m: Method) -> list[Setting]:
    """Q2: the matrices' lr alone (alpha at the shared lr)."""
    return [scaled(s, 1.0, 0.5), scaled(s, 1.0, 2.0)]


def two_lrs(s: Setting, m: Method) -> list[Setting]:
    """Q3: each of the two lrs one at a time (the non-matrix lr with the matrices' lr kept, and
    the matrices' lr), or the one lr of a method without alpha."""
    if not m.searches_alpha:
        return [scaled(s, 0.5, 1.0), scaled(s, 2.0, 1.0)]
    return [scaled(s, 0.5, 2.0), scaled(s, 2.0, 0.5), scaled(s, 1.0, 0.5), scaled(s, 1.0, 2.0)]


def everywhere(setting: Setting) -> bool:
    return True


def at_shared_lr(setting: Setting) -> bool:
    return setting.lr == SHARED_LR


@dataclass(frozen=True)
class Question:
    """One of v4's questions as its driver runs it and its tables read it: the rows, the
    neighbours each walk brackets its point in, the points it may walk to (``keep``), and the
    seeds run at the walked point."""

    name: str
    stage: str
    rows: tuple[Row, ...]
    neighbours: Callable[[Setting, Method], list[Setting]]
    seeds: tuple[int, ...]
    keep: Callable[[Setting], bool] = everywhere
    one_at_a_time: bool = False
    """The walk takes one run at a time, moving at the first better one (``Study.descend``)."""
    stopped_after: int | None = None
    """The study stopped with this many of ``rows`` (in their order) run and cut the rest: the
    driver starts none of their runs and the tables say they were cut."""

    def cut(self, row: Row) -> bool:
        return self.stopped_after is not None and self.rows.index(row) >= self.stopped_after


Q1 = Question("Q1", FULL, Q1_ROWS, eight_directions, Q1_SEEDS)
Q2 = Question("Q2", FULL, Q2_ROWS, matrices_only, SEEDS, at_shared_lr)
# Stopped on the budget at its first three rows (PROTOCOL.md v4, "Stop note").
Q3 = Question("Q3", LONG, Q3_ROWS, two_lrs, SEEDS, one_at_a_time=True, stopped_after=3)


class StudyV4(Study):
    """v3's ``Study`` with v4's runs: the test split scored, v3's validation set, Q3's length.
    ``v3_runs``: v3's committed runs, read as walk data (``v3_seed0_runs``)."""

    def __init__(
        self, *args, long_data: Path | None = None, v3_runs: Path = V3_RUNS, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.long_data = long_data
        self.v3_runs = v3_runs

    def lane_limits(self) -> dict[str, int]:
        """Q3's runs take 2-3 h each: while a 1,000-step run waits, they hold one slot, so that
        every working session moves Q1 and Q2 as well as Q3 (PROTOCOL.md v4, "Schedule note")."""
        return {LONG: max(1, self.jobs - 1)}

    def protocol(self, stage: str, seed: int) -> list[str]:
        if stage == LONG:
            base = v3_protocol(self.long_data, LONG_STEPS, seed)
            evaluation = [
                f"trainer.eval_every={LONG_EVAL_EVERY}",
                f"trainer.eval_tokens={LONG_EVAL_TOKENS}",
                f"trainer.test_tokens={LONG_EVAL_TOKENS}",
            ]
        else:
            base = v3_protocol(self.data, FINAL_STEPS, seed)
            evaluation = [
                f"trainer.eval_tokens={V3_EVAL_TOKENS}",
                f"trainer.test_tokens={TEST_TOKENS}",
            ]
        keys = {override.split("=", 1)[0] for override in evaluation}
        return [o for o in base if o.split("=", 1)[0] not in keys] + evaluation

    def handover_seconds(self) -> float:
        """A freed slot waits for the runs its run leads to, so that a Q3 row's seeds, asked for
        when its walk's last run ends, start before the next row's walk (``priority``)."""
        return HANDOVER_SECONDS

    def priority(self, stage: str, seed: int, name: str, setting: Setting) -> tuple[int, ...]:
        """The 1,000-step questions' runs first, their seed-0 walk runs (each decides the next)
        before their seeds; then Q3's rows in their order (``q3_rank``), each row's seeds before
        the next row's walk, so that the rows finish in that order (PROTOCOL.md v4, "Second
        schedule note"): a row takes a slot only when no row before it has a run waiting."""
        if stage == LONG:
            return 1, q3_rank(name, setting), int(seed > 0)
        return 0, 0, int(seed > 0)

    def walk_data(
        self, stage: str, row: Row, keep: Callable[[Setting], bool]
    ) -> dict[Setting, float]:
        """The row's finished seed-0 runs at ``stage`` that ``keep`` admits: v4's, and for the
        1,000-step questions v3's full-length ones (the same validation numbers)."""
        done = {
            s: p for s, p in self.seed0_runs(stage, row.method).items() if s.gap == row.start.gap
        }
        if stage == FULL:
            done = {**v3_seed0_runs(self.v3_runs, row), **done}
        return {s: p for s, p in done.items() if keep(s)}

    def walk(self, question: Question, row: Row) -> Setting | None:
        seen = self.walk_data(question.stage, row, question.keep)
        return self.descend(
            question.stage,
            row.method,
            row.start,
            question.neighbours,
            seen,
            one_at_a_time=question.one_at_a_time,
        )

    def seeds(self, stage: str, row: Row, point: Setting, seeds: tuple[int, ...]) -> None:
        m = row.method
        with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
            list(
                pool.map(
                    lambda seed: self.run(stage, m.name, m.optim, point, seed, m.overrides), seeds
                )
            )

    def question(self, question: Question, row: Row) -> None:
        point = self.walk(question, row)
        if point is not None:
            self.seeds(question.stage, row, point, question.seeds)

    def all(self) -> None:
        questions = (Q1, Q2, *([Q3] if self.long_data is not None else []))
        jobs = [(q, row) for q in questions for row in q.rows if not q.cut(row)]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            # The slots wait while the finished runs are looked up, so the first runs to start
            # are the most urgent of all that can (Q3's rows in their order), not the first asked.
            with self.slots.paused():
                futures = [pool.submit(self.question, *job) for job in jobs]
                time.sleep(0 if self.dry_run else LOOKUP_SECONDS)
            for future in futures:
                future.result()


def v3_seed0_runs(v3_runs: Path, row: Row) -> dict[Setting, float]:
    """v3's committed full-length seed-0 runs (under ``v3_runs``) of the row's method at its gap."""
    done: dict[Setting, float] = {}
    for run_dir in sorted((v3_runs / FULL / MODEL / row.method.name).glob("*_seed0")):
        fields = run_dir_fields(run_dir.name)
        if fields is None or fields[2] != row.start.gap:
            continue
        if not row.method.searches_alpha and fields[1] != row.start.alpha:
            continue  # AdamW's directory also holds the control's runs
        summary = run_dir / "summary.json"
        ppl = json.loads(summary.read_text())["final_val_ppl"] if summary.exists() else math.inf
        done[Setting(fields[0], fields[1], fields[2])] = ppl
    return done


def test_split_mismatch(data: Path) -> str | None:
    digest = corpus_digest(data, ("test",))
    if digest != TEST_DIGEST:
        return (
            f"--data {data}: test split digest {digest[:16]}... is not v4's {TEST_DIGEST[:16]}...; "
            "rebuild the mirror with scripts/make_corpus.py (it writes the test split)"
        )
    return None


def long_corpus_mismatch(data: Path) -> str | None:
    for digest, pinned in (
        (corpus_digest(data), LONG_CORPUS.digest),
        (corpus_digest(data, ("test",)), LONG_CORPUS.test_digest),
    ):
        if digest != pinned:
            return f"--long-data {data}: digest {digest[:16]}... is not the pinned {pinned[:16]}..."
    return None
