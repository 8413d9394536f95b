"""A sweep point's run: its directory (``ROOT/MODEL/METHOD/lr{lr}[_alpha{a}][_gap{g}]_seed{s}``),
the name that directory's fields are read back from, and the torchrun command that trains it.

``repro.sweep`` plans grids of points and launches them, ``repro.cpu_study.study`` walks the CPU
study's points, and the tables (``repro.points``) read the directories back: all through
this module, so a point is named one way.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from train.preemption import STOP_SIGNALS
from train.summary import finished_records

REPO = Path(__file__).resolve().parents[1]

# torchrun's own defaults plus the stop signals, which it then forwards to every worker.
TORCHRUN_SIGNALS = ",".join(
    dict.fromkeys(["SIGINT", "SIGHUP", "SIGQUIT", *(sig.name for sig in STOP_SIGNALS)])
)


def hparam(value: float) -> str:
    """An lr or alpha as a run's command and directory name write it: exactly, for every value a
    factor-2 grid reaches from a round start (``0.25 / 2**7 = 0.001953125`` has 7 digits, which
    ``:g`` rounds, so that doubling it again missed 0.00390625)."""
    return f"{value:.10g}"


RUN_DIR = re.compile(
    r"lr(?P<lr>[^_]+)(_alpha(?P<alpha>[^_]+))?(_gap(?P<gap>\d+))?_seed(?P<seed>-?\d+)$"
)
"""The name of a run directory, as ``Point.run_dir`` writes it."""


def run_dir_fields(name: str) -> tuple[float, float | None, int | None, int] | None:
    """lr, alpha, refresh gap and seed of a run directory's name (None: not a run directory)."""
    match = RUN_DIR.match(name)
    if match is None:
        return None
    alpha = float(match["alpha"]) if match["alpha"] else None
    gap = int(match["gap"]) if match["gap"] else None
    return float(match["lr"]), alpha, gap, int(match["seed"])


SHAPE_KEYS = {
    "seq_len": "data.seq_len",
    "global_batch_size": "trainer.global_batch_size",
    "micro_batch_size": "trainer.micro_batch_size",
    "max_steps": "trainer.max_steps",
}
"""Each field of ``Shape`` by the config key it sets."""


@dataclass(frozen=True)
class Shape:
    """A run's length and batch where it is not its config's (``None``: the config's): typed, so
    that what a run trains on is read from here, never back from its command's strings, and
    rendered to Hydra overrides in one place (``overrides``)."""

    seq_len: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    max_steps: int | None = None

    def overrides(self) -> tuple[str, ...]:
        return tuple(
            f"{SHAPE_KEYS[f.name]}={value}"
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None
        )

    def then(self, later: Shape) -> Shape:
        """This shape with what ``later`` sets (a later override wins, as on Hydra's command
        line)."""
        return replace(self, **{k: v for k, v in vars(later).items() if v is not None})

    @classmethod
    def of_overrides(cls, overrides: Sequence[str]) -> Shape:
        """What a user's Hydra overrides set of a run's shape, read by Hydra's own parser."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import OverrideParseException

        try:
            parsed = OverridesParser.create().parse_overrides(list(overrides))
        except OverrideParseException as e:
            raise ValueError(f"not a Hydra override: {str(e).splitlines()[0]}") from None
        by_key = {key: name for name, key in SHAPE_KEYS.items()}
        values = {}
        for override in parsed:
            if (name := by_key.get(override.key_or_group)) is not None:
                value = override.value()
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(
                        f"{override.input_line}: {override.key_or_group} takes an integer"
                    )
                values[name] = value
        return cls(**values)


AS_CONFIGURED = Shape()
"""A run whose length and batch are its config's."""


@dataclass(frozen=True)
class Point:
    model: str
    optim: str
    lr: float
    alpha: float | None
    seed: int
    name: str  # the method directory: the optim config, or a variant's name (ablations)
    gap: int | None = None  # GaLore/APOLLO update_proj_gap, when the study tunes it

    def run_dir(self, root: Path) -> Path:
        """``lr{lr}[_alpha{a}][_gap{g}]_seed{s}``: the layout ``run_dir_fields`` reads."""
        alpha = "" if self.alpha is None else f"_alpha{hparam(self.alpha)}"
        gap = "" if self.gap is None else f"_gap{self.gap}"
        return root / self.model / self.name / f"lr{hparam(self.lr)}{alpha}{gap}_seed{self.seed}"


def train_command(point: Point, run_dir: Path, nproc: int, overrides: list[str]) -> list[str]:
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--signals-to-handle={TORCHRUN_SIGNALS}",
    ]
    args = [
        *launcher,
        f"--nproc_per_node={nproc}",
        str(REPO / "train" / "pretrain.py"),
        f"+model={point.model}",
        f"+optim={point.optim}",
        f"optim.lr={hparam(point.lr)}",
        f"trainer.seed={point.seed}",
        f"hydra.run.dir={run_dir}",
        "trainer.resume=auto",
    ]
    if point.alpha is not None:
        args.append(f"optim.alpha={hparam(point.alpha)}")
    return args + overrides


def collect(root: Path, dest: Path, files: tuple[str, ...] = ("config.yaml",)) -> int:
    """Copy each finished run's record (``summary.json`` or ``diverged.json``) and its ``files``
    from ``root`` to ``dest``, same layout: what a results directory commits of its runs (the
    checkpoints and the exported model stay behind). Returns the number of runs copied."""
    copied = 0
    for done in finished_records(root):
        target = dest / done.parent.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for name in (done.name, *files):
            if (done.parent / name).exists():
                shutil.copy2(done.parent / name, target / name)
        copied += 1
    return copied
