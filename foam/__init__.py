"""FOAM and memory-efficient optimizer baselines for LLM pre-training; imports torch only.

>>> from foam import FOAM, build_optimizer, state_bytes
"""

# Importing a method's module registers it with build_optimizer.
from foam import adam_mini, apollo, galore, gwt, ldadam, muon, quantized, recipes  # noqa: F401
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
