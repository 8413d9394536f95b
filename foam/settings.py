"""A FOAM parameter group resolved and checked once, when it is added: :class:`FoamSettings`.

``FoamSettings.of_group`` fills the options a group leaves at ``None`` from its ``semantics``
(:data:`SEMANTICS`), checks every value (an :class:`foam.errors.OptionError` naming the key) and
returns the typed view the eager step, the fused kernels and the sharded fold read. The numbers
an LR schedule may change between steps (``lr``, ``betas``, ``eps``, ``weight_decay``) are read
from the group at each step (:class:`foam.update.StepScalars`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from foam.errors import OptionError, require_choice
from foam.folding import PAPER_FOLD_AXIS, PAPER_TAIL_BLOCK, FoldSettings, validate_fold_settings
from foam.hparams import validate_adam_hparams
from foam.numerics import resolve_dtype
from foam.update import BIAS_CORRECTIONS, DECAYS, SECOND_MOMENTS, kernels_compute

DEFAULT_SEMANTICS = "paper"
# The options a ``semantics`` sets, for each semantics. An option passed explicitly (not None)
# overrides its semantics' value, which is how ablations mix the two. Betas are not included:
# the paper uses (0.9, 0.95) and the release class defaults to (0.9, 0.999).
SEMANTICS: dict[str, dict[str, Any]] = {
    "paper": {
        "fold_axis": PAPER_FOLD_AXIS,
        "second_moment": "square_of_mean",
        "bias_correction": True,
        "tail_block": PAPER_TAIL_BLOCK,
        "decay": "before_update",
    },
    "release": {
        "fold_axis": "last",
        "second_moment": "mean_of_squares",
        "bias_correction": "step_size",
        "tail_block": "zero_pad",
        "decay": "after_update",
    },
}
IMPLEMENTATIONS = ("auto", "fused", "eager")


def semantics_options(semantics: str | None) -> dict[str, Any]:
    """The options ``semantics`` sets (``None``: the default semantics')."""
    semantics = DEFAULT_SEMANTICS if semantics is None else semantics
    require_choice("semantics", semantics, SEMANTICS)
    return SEMANTICS[semantics]


def resolve_semantics(group: MutableMapping[str, Any]) -> None:
    """Fill the options a group leaves at ``None`` (or lacks) from its ``semantics``."""
    options = semantics_options(group.setdefault("semantics", DEFAULT_SEMANTICS))
    for key, value in options.items():
        if group.get(key) is None:
            group[key] = value


def fold_axis_of(options: Mapping[str, Any]) -> str:
    """The fold axis FOAM takes with ``options`` (a group, or the trainer's optim config): its
    ``fold_axis``, else its ``semantics``'; methods without either fold nothing, so the paper's
    axis suits them as well as any."""
    return options.get("fold_axis") or semantics_options(options.get("semantics"))["fold_axis"]


def require_paper_semantics(method: str, semantics: str) -> None:
    """Refuse ``semantics="release"`` for a combination the authors' release does not have.

    The release semantics is a statement about the release's FOAM class (an Adam step); its
    bias-correction, second-moment and decay choices have no counterpart in Muon or Adam-mini, so
    FOAM's combinations keep the paper's (their ``fold_axis`` option is still there).
    """
    if semantics != "paper":
        raise OptionError(
            "semantics",
            f"{method} supports semantics='paper' only, got {semantics!r}: the authors' release "
            "has no such combination (release semantics is defined for FOAM's Adam step)",
        )


@dataclass(frozen=True)
class FoamSettings:
    """The options of one FOAM group that decide which path steps it, resolved from its semantics
    and checked; the arithmetic's numbers are :class:`foam.update.StepScalars`."""

    fold: FoldSettings
    bias_correction: bool | str
    decay: str
    state_dtype: torch.dtype | None
    """``None``: each parameter's own dtype."""
    fused_adamw: bool
    implementation: str

    @classmethod
    def of_group(cls, group: dict[str, Any]) -> FoamSettings:
        """Resolve ``group``'s semantics into it and check every option, once."""
        resolve_semantics(group)
        validate_adam_hparams(group)
        fold = validate_fold_settings(group)
        for key, choices in (
            ("second_moment", SECOND_MOMENTS),
            ("bias_correction", BIAS_CORRECTIONS),
            ("decay", DECAYS),
            ("implementation", IMPLEMENTATIONS),
        ):
            require_choice(key, group[key], choices)
        state_dtype = group["state_dtype"]
        return cls(
            fold=fold,
            bias_correction=group["bias_correction"],
            decay=group["decay"],
            state_dtype=None if state_dtype is None else resolve_dtype(state_dtype, torch.float32),
            fused_adamw=group["fused_adamw"],
            implementation=group["implementation"],
        )

    @property
    def kernels_compute(self) -> bool:
        """Whether the fused kernels compute this group's update (the paper's)."""
        return kernels_compute(self.bias_correction, self.fold.tail_block, self.decay)

    def state_dtype_for(self, p: torch.Tensor) -> torch.dtype:
        """The dtype of ``p``'s moments."""
        return p.dtype if self.state_dtype is None else self.state_dtype
