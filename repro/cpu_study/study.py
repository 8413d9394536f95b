"""The scaled-down CPU reproduction of Table 2 and the FOAM ablations (results/repro/PROTOCOL.md).

Three stages, each a pure function of the finished runs under ``--root``, so an interrupted study
resumes where it stopped (finished points are skipped, an interrupted point resumes from its last
checkpoint):

1. **Search** (``search/``, seed 0, ``SEARCH_STEPS``): per method, a coordinate search over its
   axes (lr and alpha on factor-2 grids from their starting points, and the diagonal that moves
   only the non-matrix lr; GaLore/APOLLO's refresh gap) that stops when the best point's
   neighbours along every axis have all been run and are worse, so the best lr and alpha are
   strictly inside their grids by construction.
2. **Full-length walk** (``final/``, seed 0, ``FINAL_STEPS``): the same search along the lr and
   alpha alone, from the search's best point, at the finals' length. Methods (and one method's
   lrs and alphas) rank differently at the two lengths, so the search only picks the refresh gap
   and where this walk starts; the lr and alpha the finals use are bracketed at full length.
3. **Finals** (``final/``, seeds 0-2): every method at the walk's best point (seed 0 is the walk's
   own run there).
4. **Ablations** (``final/``, seeds 0-2): FOAM-2's variants at FOAM-2's finals' point; a variant
   that is a Table 2 method whose walk ended at the same point reuses that method's finals.
5. **Two views** (PROTOCOL.md, amendment of 2026-11-27): "equal freedom", where Muon and
   Adam-mini also get the module-wise lr (``*_modulewise``), and "as the paper tunes", the same
   stages with alpha kept on the paper's grid (``PAPER_VIEW``); and FOAM-2 at the paper's lr at
   each alpha of the paper's grid, 3 seeds each (the paper's alpha figure).

Points run ``--jobs`` at a time (two single-thread runs on the 2-core machine), the runs later
runs wait on first (``run_priority``); a run that diverges (the trainer then writes
``diverged.json``, ``train/summary.py``) counts as infinitely bad and is not retried.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from repro.cpu_study.environment import VOCAB
from repro.cpu_study.scheduler import PrioritySlots
from repro.experiments import PAPER_SEQ_LEN, paper_lr
from repro.methods import ABLATIONS, PAPER_ALPHA_GRID, Ablation, paper_alpha_range
from repro.paper_perplexity import STAND_INS
from repro.runs import REPO, Point, hparam, run_dir_fields, train_command
from train.summary import DIVERGED_FILE

MODEL = "llama_2m"
SEARCH_STEPS = 500
FINAL_STEPS = 1000
SEEDS = (0, 1, 2)
GAPS = (200, FINAL_STEPS // 50)  # the paper's interval, and the paper's ~50 refreshes per run
LOOKUP_SECONDS = 5  # ample for Study.all to look up every finished run (~0.1 s for 122)
EVAL_TOKENS = 300_000  # more than the mirror's 279,124 validation tokens: the whole split


def protocol(data: Path, steps: int, seed: int) -> list[str]:
    """The Hydra overrides every run of the study shares (PROTOCOL.md explains each)."""
    return [
        "trainer=cpu_debug",
        "logger=none",
        f"trainer.max_steps={steps}",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=16",
        "trainer.precision=fp32",
        "trainer.grad_clip=0.0",
        "trainer.eval_every=100",
        f"trainer.eval_tokens={EVAL_TOKENS}",
        "trainer.log_every=10",
        "trainer.save_every=100",
        "trainer.keep_last=1",
        "data=local",
        f"data.path={data}",
        f"data.spm_vocab_size={VOCAB}",
        "data.pack=true",
        f"data.seq_len={PAPER_SEQ_LEN}",
        "data.num_workers=1",
        f"data.shuffle_seed={seed}",
    ]


@dataclass(frozen=True)
class Method:
    """One row of Table 2 (or the module-wise-lr control): an optim config and its search axes."""

    name: str  # run directory and table key
    optim: str
    start_lr: float
    start_alpha: float | None = None  # None keeps the config's alpha
    searches_alpha: bool = False  # alpha is a search axis (factor 2, like the lr)
    gaps: tuple[int, ...] = ()  # GaLore / APOLLO update_proj_gap candidates
    start_gap: int | None = None  # None: the first of ``gaps``
    overrides: tuple[str, ...] = ()
    alpha_range: tuple[float, float] | None = None
    """Where set, alpha stays inside it (both ends included): the "as the paper tunes" view."""

    def start(self) -> Setting:
        gap = self.start_gap or (self.gaps[0] if self.gaps else None)
        return Setting(self.start_lr, self.start_alpha, gap)

    def allows(self, setting: Setting) -> bool:
        """Whether ``setting`` is in this method's search space (its alpha range)."""
        if self.alpha_range is None or setting.alpha is None:
            return True
        low, high = self.alpha_range
        return low <= setting.alpha <= high


# Start points: the best points the withdrawn first corpus's search found (PROTOCOL.md,
# "Restart on a pinned corpus"); the search still runs every neighbour of wherever it ends.
METHODS = (
    # AdamW is the module-wise-lr control at alpha 1: both read the same runs.
    Method("adamw", "adamw", 2.5e-3, start_alpha=1.0),
    Method("adamw", "adamw", 5e-3, start_alpha=0.25, searches_alpha=True),
    Method("muon", "muon", 1e-2),
    Method("adam_mini", "adam_mini", 1.25e-3),
    Method("galore_1_4", "galore_1_4", 2e-2, start_alpha=0.25, searches_alpha=True, gaps=GAPS),
    Method("apollo_1_4", "apollo_1_4", 1e-2, start_alpha=1.0, searches_alpha=True, gaps=GAPS),
    Method("foam2", "foam2", 5e-3, start_alpha=0.25, searches_alpha=True),
    Method("foam3", "foam3", 5e-3, start_alpha=0.25, searches_alpha=True),
    Method(
        "apollo_mini",
        "apollo_mini",
        5e-3,
        start_alpha=64.0,
        searches_alpha=True,
        gaps=GAPS,
        start_gap=FINAL_STEPS // 50,
    ),
    Method("foam_mini", "foam_mini", 5e-3, start_alpha=0.25, searches_alpha=True),
    # Equal freedom (PROTOCOL.md, amendment of 2026-11-27): Muon and Adam-mini with the two lrs
    # the control gives AdamW, starting at the non-matrix lr where every module-wise walk ended
    # and the matrices at the lr of the method's own one-lr search.
    Method("muon_modulewise", "muon", 4e-2, start_alpha=0.25, searches_alpha=True),
    Method("adam_mini_modulewise", "adam_mini", 4e-2, start_alpha=0.03125, searches_alpha=True),
)
CONTROL = METHODS[1]  # the module-wise-lr AdamW control
FOAM2 = next(m for m in METHODS if m.name == "foam2")  # its finals' point is the ablations'
PAPER_VIEW = tuple(
    replace(m, alpha_range=paper_alpha_range(m.name))
    for m in METHODS
    if m.searches_alpha and not m.name.endswith("_modulewise")
)
"""The "as the paper tunes" view (amendment of 2026-11-27): each method with an alpha searched
and walked the same way, with alpha kept on the paper's grid. Runs share the methods' directories;
Full-Adam, Muon and Adam-mini are in this view with their one lr."""


def twin_method(optim: str, overrides: tuple[str, ...]) -> Method | None:
    """The Table 2 method an ablation is identical to (FOAM-3, FOAM-Mini), or None.

    Where that method's own search also chose FOAM-2's best point, its finals are exactly the
    ablation's runs (same command, same seeds), so they are not run twice; make_tables.py reads
    the method's finals for that ablation row.
    """
    return next((m for m in METHODS if (m.optim, m.overrides) == (optim, overrides)), None)


@dataclass(frozen=True, order=True)
class Setting:
    """A point of a method's search space."""

    lr: float
    alpha: float | None
    gap: int | None

    def __post_init__(self) -> None:
        # A run gets its lr and alpha, and its directory its name, as ``hparam`` writes them, so a
        # point is the value run: a setting computed by halving equals the one read back from
        # its directory's name.
        object.__setattr__(self, "lr", float(hparam(self.lr)))
        if self.alpha is not None:
            object.__setattr__(self, "alpha", float(hparam(self.alpha)))

    def walk_neighbours(self, method: Method) -> list[Setting]:
        """The full-length walk's steps: the lr, and alpha where the method searches it.

        Neither ranking carries over from 500 steps. Muon's best lr moved; and FOAM-2 at lr 1e-2
        with alpha 0.25 was 50 PPL behind alpha 0.125 at 500 steps, a cliff gone at 1,000 steps
        (3.3 PPL from its best there so far; PROTOCOL.md's amendments).
        """
        around = [
            Setting(self.lr / 2, self.alpha, self.gap),
            Setting(self.lr * 2, self.alpha, self.gap),
        ]
        if method.searches_alpha:
            around += [
                Setting(self.lr, self.alpha / 2, self.gap),
                Setting(self.lr, self.alpha * 2, self.gap),
            ]
        return [s for s in around if method.allows(s)]

    def neighbours(self, method: Method) -> list[Setting]:
        """The walk's lr and alpha steps, GaLore/APOLLO's other gaps, and, where alpha is
        searched, the two diagonal steps that keep the matrices' lr (lr x alpha) and move only
        the lr of the embeddings, head and norms.

        Without the diagonal a point can be bracketed along lr and alpha but not in the two lrs
        the method really has: the module-wise-lr control went from 135.2 to 120.8 (500 steps)
        by doubling the embeddings' lr at the same matrix lr, a move FOAM-2's search never tried.
        """
        around = self.walk_neighbours(method)
        if method.searches_alpha:
            around += [
                Setting(self.lr * 2, self.alpha / 2, self.gap),
                Setting(self.lr / 2, self.alpha * 2, self.gap),
            ]
        around += [Setting(self.lr, self.alpha, gap) for gap in method.gaps if gap != self.gap]
        return [s for s in around if method.allows(s)]


def run_priority(stage: str, seed: int) -> tuple[int, int]:
    """The lowest first: seed 0's search runs, then its full-length walk, then the other seeds.

    Seeds 1-2 have no runs waiting on them, while each search or walk step decides the next; run
    first, the search and walk leave the seeds to fill the cores at the end, instead of the last
    walk steps running one at a time with a core idle.
    """
    return seed, stage != "search"


def walk_front(
    seen: Mapping[Setting, float],
    start: Setting,
    neighbours: Callable[[Setting, Method], list[Setting]],
    method: Method,
) -> tuple[Setting, list[Setting]]:
    """Where a coordinate walk stands: its best point so far (``start`` before any run) and the
    runs it waits on there, the point and those of its ``neighbours`` not run yet; none left
    means the point is bracketed (every neighbour run, none better)."""
    best = min(seen, key=lambda s: (seen[s], s), default=start)
    return best, [s for s in (best, *neighbours(best, method)) if s not in seen]


@dataclass
class Study:
    data: Path
    root: Path
    jobs: int
    dry_run: bool = False
    finished: Path | None = None
    """Where earlier sessions' finished runs were committed (``--collect``): they count as done."""
    slots: PrioritySlots = field(init=False)
    planned: dict[Path, list[str]] = field(default_factory=dict)
    """A dry run's runs that can start now, each with its command."""
    _locks: dict[Path, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.slots = PrioritySlots(self.jobs, self.lane_limits(), self.handover_seconds())

    def handover_seconds(self) -> float:
        """How long a freed slot waits for the runs its run leads to (``PrioritySlots``): not at
        all here (v3's order is by stage and seed, not by row); a later study's driver may."""
        return 0.0

    def lane_limits(self) -> dict[str, int]:
        """The most slots a stage's runs hold while another stage's wait (``PrioritySlots``):
        none here; a later study's driver may limit its long runs."""
        return {}

    def lock(self, run_dir: Path) -> threading.Lock:
        """One lock per run directory: AdamW and its control may ask for the same point."""
        with self._guard:
            return self._locks.setdefault(run_dir, threading.Lock())

    # -- one run -----------------------------------------------------------------------------

    def protocol(self, stage: str, seed: int) -> list[str]:
        """The overrides every run of ``stage`` shares (a later study's driver adds its own)."""
        return protocol(self.data, SEARCH_STEPS if stage == "search" else FINAL_STEPS, seed)

    def priority(self, stage: str, seed: int, name: str, setting: Setting) -> tuple[int, ...]:
        """The slots' order for a run (lowest first); a later study may rank its rows too."""
        return run_priority(stage, seed)

    def run_dir(self, stage: str, name: str, setting: Setting, seed: int) -> Path:
        point = Point(MODEL, name, setting.lr, setting.alpha, seed, name, setting.gap)
        return point.run_dir(self.root / stage)

    def result(self, run_dir: Path) -> float | None:
        """Final validation perplexity; inf if it diverged; None if not run yet."""
        places = [run_dir]
        if self.finished is not None:
            places.append(self.finished / run_dir.relative_to(self.root))
        for place in places:
            if (place / "summary.json").exists():
                return json.loads((place / "summary.json").read_text())["final_val_ppl"]
            if (place / DIVERGED_FILE).exists():
                return math.inf
        return None

    def run(
        self,
        stage: str,
        name: str,
        optim: str,
        setting: Setting,
        seed: int,
        overrides: tuple[str, ...] = (),
    ) -> float | None:
        run_dir = self.run_dir(stage, name, setting, seed)
        with self.lock(run_dir):
            return self._run(run_dir, stage, name, optim, setting, seed, overrides)

    def _run(
        self,
        run_dir: Path,
        stage: str,
        name: str,
        optim: str,
        setting: Setting,
        seed: int,
        overrides: tuple[str, ...],
    ) -> float | None:
        done = self.result(run_dir)
        if done is not None:
            return done
        extra = [*self.protocol(stage, seed), *overrides]
        if setting.gap is not None:
            extra.append(f"optim.update_proj_gap={setting.gap}")
        cmd = train_command(
            Point(MODEL, optim, setting.lr, setting.alpha, seed, name), run_dir, 1, extra
        )
        if self.dry_run:
            self.planned.setdefault(run_dir, cmd)
            return None
        with self.slots.hold(self.priority(stage, seed, name, setting), lane=stage):
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "train.log", "a") as log:
                code = subprocess.run(
                    cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
                ).returncode
        done = self.result(run_dir)  # the trainer's summary, or its record of a divergence
        if done is None:
            raise RuntimeError(f"{run_dir}: exit status {code}, see {run_dir / 'train.log'}")
        return done

    # -- the stages --------------------------------------------------------------------------

    def descend(
        self,
        stage: str,
        method: Method,
        start: Setting,
        neighbours: Callable[[Setting, Method], list[Setting]],
        seen: dict[Setting, float] | None = None,
        one_at_a_time: bool = False,
    ) -> Setting | None:
        """Coordinate search (seed 0) from the best of ``start`` and the points already ``seen``
        until the best point's ``neighbours`` have all been run and are worse; None in a dry run,
        where the rest depends on results.

        By default it runs every neighbour of the best point at once (a round) and moves when the
        round has ended. ``one_at_a_time`` runs only the first of them and moves as soon as a run
        is better: the walk a restarted driver makes too, for runs so long that a session's end
        cuts every round (PROTOCOL.md v4, "Walk note")."""
        seen = dict(seen or {})
        while True:
            best, todo = walk_front(seen, start, neighbours, method)
            if not todo:
                return best
            if one_at_a_time:
                todo = todo[:1]
            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                results = pool.map(
                    lambda s: self.run(stage, method.name, method.optim, s, 0, method.overrides),
                    todo,
                )
                for setting, ppl in zip(todo, results, strict=True):
                    if ppl is None:
                        return None
                    seen[setting] = ppl

    def search(self, method: Method) -> Setting | None:
        """The best point of every axis at the search's length.

        It goes on from the best search run of the method so far, so that a neighbour added to
        the protocol (the diagonal) is run around that point, not along the path that led to it.
        """
        return self.descend(
            "search", method, method.start(), Setting.neighbours, self.seed0_runs("search", method)
        )

    def seed0_runs(self, stage: str, method: Method) -> dict[Setting, float]:
        """The method's finished seed-0 runs of ``stage``, here or committed by an earlier
        session."""
        bases = [self.root, *([self.finished] if self.finished else [])]
        done: dict[Setting, float] = {}
        for base in bases:
            for run_dir in sorted((base / stage / MODEL / method.name).glob("*_seed0")):
                fields = run_dir_fields(run_dir.name)
                if fields is None:
                    continue
                lr, alpha, gap, _ = fields
                if not method.searches_alpha and alpha != method.start_alpha:
                    continue  # AdamW's directory also holds its module-wise-lr control's runs
                setting = Setting(lr, alpha, gap)
                ppl = self.result(self.root / run_dir.relative_to(base))
                if ppl is not None and method.allows(setting):
                    done[setting] = ppl
        return done

    def best_at_full_length(self, method: Method) -> Setting | None:
        """The search's gap, with the lr and alpha walked on to their optimum at full length.

        At 1,000 steps Muon's optimum was one lr step below the one its 500-step search chose, by
        twice its seed std (PROTOCOL.md, the amendments under "Why the search carries over").
        The walk runs the search's point at full length, then goes on from the best of it and
        every full-length run of the method at the search's gap, as the search goes on from its
        best run: a full-length point measured before the search moved away still counts.
        """
        searched = self.search(method)
        if searched is None:
            return None
        ppl = self.run("final", method.name, method.optim, searched, 0, method.overrides)
        if ppl is None:
            return None
        walked = {
            s: p for s, p in self.seed0_runs("final", method).items() if s.gap == searched.gap
        }
        walked[searched] = ppl
        return self.descend("final", method, searched, Setting.walk_neighbours, walked)

    def finals(self, name: str, optim: str, best: Setting, overrides: tuple[str, ...] = ()) -> None:
        with ThreadPoolExecutor(max_workers=len(SEEDS)) as pool:
            list(
                pool.map(lambda seed: self.run("final", name, optim, best, seed, overrides), SEEDS)
            )

    def method_pipeline(self, method: Method, ablations: bool = False) -> None:
        """Search, the full-length walk, 3 finals and (for FOAM-2) the ablations there."""
        best = self.best_at_full_length(method)
        if best is None:
            return
        self.finals(method.name, method.optim, best, method.overrides)
        if ablations:
            self.ablations(best)

    def ablations(self, best: Setting) -> None:
        def one(ablation: Ablation) -> None:
            twin = twin_method(ablation.optim, ablation.overrides)
            if twin is not None:
                twin_best = self.best_at_full_length(twin)
                if twin_best is None:  # dry run: depends on the twin's walk
                    return
                if twin_best == best:  # the twin's finals are this variant's runs
                    return
            self.finals(ablation.name, ablation.optim, best, ablation.overrides)

        with ThreadPoolExecutor(max_workers=len(ABLATIONS)) as pool:
            list(pool.map(one, ABLATIONS))

    def all(self) -> None:
        foam2_paper_lr = paper_lr("foam2", STAND_INS[MODEL])  # the 60M model's, configs/paper_lr
        with ThreadPoolExecutor(
            max_workers=len(METHODS) + len(PAPER_VIEW) + len(PAPER_ALPHA_GRID)
        ) as pool:
            # The slots wait while the finished runs are looked up, so the first runs to start
            # are the most urgent of all that can, not the first asked for.
            with self.slots.paused():
                futures = [
                    pool.submit(self.method_pipeline, m, ablations=m is FOAM2)
                    for m in (*METHODS, *PAPER_VIEW)
                ]
                # The paper's alpha figure at the paper's lr: FOAM-2 at each alpha of its grid.
                futures += [
                    pool.submit(self.finals, "foam2", "foam2", Setting(foam2_paper_lr, alpha, None))
                    for alpha in PAPER_ALPHA_GRID
                ]
                time.sleep(0 if self.dry_run else LOOKUP_SECONDS)
            for future in futures:
                future.result()
