"""The paper's methods, named once: the name of each and its printed label.

A method's name is its optim config (``configs/optim/NAME.yaml``), the method directory of
``scripts/sweep.py``'s runs, and its row in ``scripts/estimate_memory.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.runs import AS_CONFIGURED, Shape


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    """As the paper prints it."""
    sweeps_alpha: bool = True
    """Whether the paper's grid (Appendix, Hyperparameters) sweeps alpha besides the lr."""


TABLE2_BLOCKS: tuple[tuple[Method, ...], ...] = (
    (
        Method("adamw", "Full-Adam", sweeps_alpha=False),
        Method("muon", "Muon", sweeps_alpha=False),
        Method("adam_mini", "Adam-Mini", sweeps_alpha=False),
        Method("ldadamw", "LDAdamW"),
    ),
    (
        Method("galore_1_4", "GaLore-1/4"),
        Method("apollo_1_4", "APOLLO-1/4"),
        Method("foam2", "FOAM-2"),
    ),
    (
        Method("galore_1_8", "GaLore-1/8"),
        Method("apollo_1_8", "APOLLO-1/8"),
        Method("foam3", "FOAM-3"),
    ),
    (
        Method("apollo_mini", "APOLLO-Mini"),
        Method("gwt_mini", "GWT-Mini"),
        Method("foam_mini", "FOAM-Mini"),
    ),
)
"""Table 2's rows in the paper's order, in its blocks (similar memory per block)."""

TABLE2: tuple[Method, ...] = tuple(m for block in TABLE2_BLOCKS for m in block)

TABLE3_ONLY: tuple[Method, ...] = (Method("adamw8bit", "8-bit Adam"),)

MODULEWISE: tuple[Method, ...] = (
    Method("muon_modulewise", "Muon, module-wise lr"),
    Method("adam_mini_modulewise", "Adam-Mini, module-wise lr"),
)
"""The CPU study's Muon and Adam-mini with the two lrs the control gives AdamW (lr for the
embeddings, head and norms, lr x alpha for the matrices): ``results/repro/PROTOCOL.md``, v3."""

PAPER_ALPHA_GRID: tuple[float, ...] = (0.25, 0.5, 1.0)
"""The alphas the paper's grid sweeps (Appendix, Hyperparameters)."""
PAPER_ALPHA_RANGES: dict[str, tuple[float, float]] = {"apollo_mini": (64.0, 256.0)}
"""Methods whose alpha lives on another scale: APOLLO-Mini around the paper's 128."""


def paper_alpha_range(name: str) -> tuple[float, float]:
    """The alphas (both ends included) "as the paper tunes" allows ``name``."""
    return PAPER_ALPHA_RANGES.get(name, (PAPER_ALPHA_GRID[0], PAPER_ALPHA_GRID[-1]))


TABLE3: tuple[str, ...] = ("adamw8bit", "muon", "galore_1_4", "apollo_1_4", "foam2")
"""Table 3's rows (3B and 7B)."""

INT8_ONLY: tuple[Method, ...] = (
    Method("galore8bit", "8-bit GaLore"),
    Method("foam8bit", "8-bit FOAM-2"),
)
"""The int8 table's rows besides 8-bit Adam."""

PAPER_SWEEP: tuple[str, ...] = (
    "adamw",
    "muon",
    "adam_mini",
    "galore_1_4",
    "apollo_1_4",
    "foam2",
    "foam_mini",
)
"""The methods whose grids the paper gives (Appendix, Hyperparameters): the default sweep."""


@dataclass(frozen=True)
class Variant:
    """One row or curve of an experiment: an optim config with overrides, in its own directory."""

    name: str
    """The method directory; the optim config's name when the run is that config as it is."""
    optim: str
    label: str
    overrides: tuple[str, ...] = ()
    alpha: float | None = None
    """The run's alpha where it is not the config's (a figure over alpha); it names the run
    directory, so runs of one method at other alphas share the method directory."""
    lr: float | None = None
    """The run's lr where it is not the config's paper lr (an lr grid, Adam at FOAM's lr)."""
    shape: Shape = AS_CONFIGURED
    """The run's sequence length and batch where they are not the config's."""


@dataclass(frozen=True)
class Ablation(Variant):
    """One of FOAM-2's variants, in a method directory ``ablation_...``."""

    figure: str | None = None
    """The paper's ablation figure it belongs to (``FOLD_LEVEL`` or ``RESIDUAL``), if any."""


FOLD_LEVEL = "fold level"  # the paper's figure "FOAM with varying level l"
RESIDUAL = "residual"  # the paper's figure "Validation PPL with or without residual"

ABLATIONS: tuple[Ablation, ...] = (
    Ablation("ablation_foam1", "foam1", "FOAM-1", figure=FOLD_LEVEL),
    Ablation("ablation_foam3", "foam3", "FOAM-3", figure=FOLD_LEVEL),
    Ablation("ablation_foam4", "foam4", "FOAM-4", figure=FOLD_LEVEL),
    Ablation("ablation_foam5", "foam5", "FOAM-5", figure=FOLD_LEVEL),
    Ablation("ablation_foam_mini", "foam_mini", "FOAM-Mini", figure=FOLD_LEVEL),
    Ablation(
        "ablation_foam2_no_residual",
        "foam2",
        "FOAM-2 without the residual (rho = 0)",
        ("optim.residual=false",),
        figure=RESIDUAL,
    ),
    Ablation(
        "ablation_foam2_no_residual_in_v",
        "foam2",
        "FOAM-2 without R^2 in the second moment",
        ("optim.residual_in_second_moment=false",),
        figure=RESIDUAL,
    ),
    Ablation(
        "ablation_foam2_mean_of_squares",
        "foam2",
        "FOAM-2, second moment from the mean of squares",
        ("optim.second_moment=mean_of_squares",),
    ),
    Ablation(
        "ablation_foam2_fold_last",
        "foam2",
        "FOAM-2 folding the last dim (the release's axis)",
        ("optim.fold_axis=last",),
    ),
    Ablation(
        "ablation_foam2_release",
        "foam2_release",
        "FOAM-2 with the authors' release semantics",
    ),
)
"""FOAM-2's variants (the paper's fold-level and residual figures, the release's choices), each run
at FOAM-2's best lr and alpha."""
ABLATION_PREFIX = "ablation_"

CONTROL_LABEL = "AdamW, matrices at lr x alpha (module-wise lr)"
"""The paper's control for FOAM's alpha (Appendix): the ``adamw`` runs with ``alpha`` below 1."""

BY_NAME: dict[str, Method] = {m.name: m for m in (*TABLE2, *TABLE3_ONLY, *MODULEWISE, *INT8_ONLY)}


def label(name: str) -> str:
    """The label of a method in the paper's tables (its name for the others)."""
    return BY_NAME[name].label if name in BY_NAME else name


def sweeps_alpha(name: str) -> bool:
    """Whether the sweep crosses ``name``'s lrs with alphas (methods the paper does not list do)."""
    return BY_NAME[name].sweeps_alpha if name in BY_NAME else True
