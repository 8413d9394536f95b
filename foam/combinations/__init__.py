"""FOAM combined with other optimizers: FOAM-Muon, FOAM-Adam-mini and FOAM with 8-bit states.

Each folds the state its base optimizer keeps in full (Muon's momentum, Adam-mini's first moment,
8-bit AdamW's moments) and re-adds the residual; level 0 is the base optimizer. Importing a
module registers its recipe with ``foam.build_optimizer``.
"""

from foam.combinations import foam8bit, foam_adam_mini, foam_muon  # noqa: F401
