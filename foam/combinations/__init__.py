"""Methods combined with other optimizers: FOAM-Muon, FOAM-Adam-mini, FOAM and GaLore with 8-bit
states.

The FOAM ones fold the state their base optimizer keeps in full (Muon's momentum, Adam-mini's first
moment, 8-bit AdamW's moments) and re-add the residual; level 0 is the base optimizer. GaLore8bit
joins two baselines (GaLore's projection, 8-bit states), which do not import each other. Importing
a module registers its recipe with ``foam.build_optimizer``.
"""

from foam.combinations import foam8bit, foam_adam_mini, foam_muon, galore8bit  # noqa: F401
