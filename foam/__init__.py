"""FOAM and memory-efficient optimizer baselines for LLM pre-training; imports torch only.

>>> from foam import FOAM, build_optimizer, state_bytes

The FOAM core is ``optimizer.py`` (the optimizer), ``folding.py`` (the fold plan and the fold and
unfold operations) and ``state.py`` (state accounting and loading); ``baselines/`` holds the
methods the paper compares with, ``combinations/`` FOAM folded into other optimizers, and
``registry.py`` + ``param_groups.py`` build any of them from a model with the paper's split.
"""

# Importing a method's module registers it with build_optimizer.
from foam import baselines, combinations, recipes  # noqa: F401
from foam.optimizer import FOAM
from foam.param_groups import ParamSplit, split_params
from foam.registry import available_optimizers, build_optimizer
from foam.state import planned_state_numel, projections_computed, state_bytes

__all__ = [
    "FOAM",
    "ParamSplit",
    "available_optimizers",
    "build_optimizer",
    "planned_state_numel",
    "projections_computed",
    "split_params",
    "state_bytes",
]
