"""The baselines the paper compares FOAM with, each a ``torch.optim.Optimizer`` and a recipe.

AdamW, GaLore, APOLLO (and APOLLO-Mini), Muon, Adam-mini, 8-bit AdamW, LDAdamW and GWT (and
GWT-Mini). Importing a module registers its recipe with ``foam.build_optimizer``. The baselines do
not import each other: what they share lives in the modules that own it (``foam.lowrank``,
``foam.numerics``, ``foam.hparams``).
"""

from foam.baselines import adam_mini, adamw, apollo, galore, gwt, ldadam, muon, quantized  # noqa: F401
