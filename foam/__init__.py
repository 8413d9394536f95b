"""FOAM and memory-efficient optimizer baselines for LLM pre-training; imports torch only.

>>> from foam import FOAM, build_optimizer, state_bytes

The FOAM core is ``optimizer.py`` (the optimizer: which path steps what), ``update.py`` (the
arithmetic of a step, eager, and the scalars the kernels of ``fused.py`` read), ``settings.py``
(a group's options, resolved and checked once), ``folding.py`` (the fold plan and the fold and
unfold operations) and ``state.py`` (state accounting and loading); ``baselines/`` holds the
methods the paper compares with, ``combinations/`` FOAM folded into other optimizers, and
``registry.py`` + ``param_groups.py`` build any of them from a model with the paper's split.
"""

# Importing a method's module registers it with build_optimizer.
from foam import baselines, combinations, recipes  # noqa: F401
from foam.errors import OptionError
from foam.optimizer import FOAM, steps_run
from foam.param_groups import ParamSplit, split_params
from foam.registry import available_optimizers, build_optimizer, check_hparams
from foam.settings import fold_axis_of
from foam.state import planned_state_numel, projections_computed, state_bytes

__all__ = [
    "FOAM",
    "OptionError",
    "ParamSplit",
    "available_optimizers",
    "build_optimizer",
    "check_hparams",
    "fold_axis_of",
    "planned_state_numel",
    "projections_computed",
    "split_params",
    "state_bytes",
    "steps_run",
]
