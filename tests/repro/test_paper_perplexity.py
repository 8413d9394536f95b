"""repro/paper_perplexity.py: the paper's Table 2 perplexities, as its source prints them."""

import re
from pathlib import Path

import pytest

from repro.methods import TABLE2, label
from repro.paper_memory import PAPER_MODELS
from repro.paper_perplexity import PAPER_TABLE2_PPL, paper_ppl

PAPER = Path(__file__).resolve().parents[3] / "shared" / "paper" / "foam_paper.tex"
if not PAPER.exists():
    PAPER = Path("/work/shared/paper/foam_paper.tex")


def printed_table2() -> dict[str, list[tuple[float, float]]]:
    """Label -> (mean, ±) per model, read from the paper's LaTeX source of Table 2."""
    if not PAPER.exists():
        pytest.skip(f"the paper's source is not at {PAPER} (the shared folder is not mounted)")
    text = PAPER.read_text()
    start = text.index(r"\label{tab:validation_llama_60m-1b}")
    table = text[start : text.index(r"\end{tabular}", start)]
    rows = {}
    for line in table.splitlines():
        numbers = re.findall(r"([\d.]+)\}?_\{\\pm ([\d.]+)\}", line)
        if not numbers:
            continue
        name = line.split("&")[0].strip().replace(r"\namec", "FOAM-Mini").replace(r"\name", "FOAM")
        rows[name] = [(float(m), float(s)) for m, s in numbers]
    return rows


def test_every_entry_is_the_papers():
    printed = printed_table2()
    assert {m.name for m in TABLE2} == set(PAPER_TABLE2_PPL)
    for method in TABLE2:
        assert printed[label(method.name)] == list(PAPER_TABLE2_PPL[method.name]), method.name
        assert len(PAPER_TABLE2_PPL[method.name]) == len(PAPER_MODELS)


def test_a_stand_in_reads_the_model_it_stands_in_for():
    assert paper_ppl("llama_60m", "foam2") == 28.53
    assert paper_ppl("llama_2m", "foam2") == 28.53  # the CPU study's scaled-down 60M
    assert paper_ppl("llama_1b", "adamw") == 14.51
    assert paper_ppl("llama_tiny", "foam2") is None
    assert paper_ppl("llama_60m", "adamw_control") is None
