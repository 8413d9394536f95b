"""The FOAM paper's printed final validation perplexities (Table 2), which a reproduction is read
against.

The values are those of ``paper/foam_paper.tex`` (``tab:validation_llama_60m-1b``: mean and the
printed ± over 3 runs for 60M-350M, one run for 1.3B), by method name (``repro/methods.py``) and
in the model order of ``paper_memory.PAPER_MODELS``. ``tests/repro/test_paper_perplexity.py``
checks each entry against the paper's source where it is present.
"""

from __future__ import annotations

from repro.paper_memory import PAPER_MODELS

PAPER_TABLE2_PPL: dict[str, tuple[tuple[float, float], ...]] = {
    # (mean, ±) at 60M, 130M, 350M, 1.3B.
    "adamw": ((29.57, 0.02), (22.86, 0.00), (17.33, 0.00), (14.51, 0.00)),
    "muon": ((28.93, 0.03), (22.75, 0.01), (16.96, 0.01), (14.28, 0.00)),
    "adam_mini": ((29.63, 0.05), (23.73, 0.01), (17.83, 0.01), (15.10, 0.00)),
    "ldadamw": ((29.27, 0.07), (22.86, 0.02), (17.53, 0.01), (14.88, 0.00)),
    "galore_1_4": ((34.38, 0.03), (26.47, 0.01), (19.36, 0.02), (15.66, 0.00)),
    "apollo_1_4": ((31.18, 0.09), (23.35, 0.21), (16.73, 0.05), (14.20, 0.00)),
    "foam2": ((28.53, 0.01), (22.51, 0.00), (15.87, 0.00), (13.13, 0.00)),
    "galore_1_8": ((39.94, 1.24), (30.02, 0.39), (21.59, 0.23), (17.52, 0.00)),
    "apollo_1_8": ((31.53, 0.06), (23.74, 0.17), (16.98, 0.10), (14.32, 0.00)),
    "foam3": ((28.79, 0.05), (22.58, 0.03), (15.94, 0.02), (13.19, 0.00)),
    "apollo_mini": ((31.58, 0.09), (23.83, 0.07), (17.17, 0.06), (14.18, 0.00)),
    "gwt_mini": ((32.94, 0.06), (23.84, 0.05), (18.12, 0.03), (14.99, 0.00)),
    "foam_mini": ((29.71, 0.04), (23.10, 0.05), (16.53, 0.03), (13.43, 0.00)),
}

STAND_INS = {"llama_2m": "llama_60m"}
"""Scaled-down models and the paper's model each stands in for: the CPU study's llama_2m keeps
the 60M model's ratio of matrix parameters to the rest (``results/repro/PROTOCOL.md``, Model)."""


def paper_ppl(model: str, method: str) -> float | None:
    """The paper's mean perplexity of ``method`` on ``model`` (or the model it stands in for)."""
    paper_model = STAND_INS.get(model, model)
    if paper_model not in PAPER_MODELS or method not in PAPER_TABLE2_PPL:
        return None
    return PAPER_TABLE2_PPL[method][PAPER_MODELS.index(paper_model)][0]
