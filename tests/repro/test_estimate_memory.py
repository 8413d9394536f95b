"""repro/memory_estimator.py against every memory entry the FOAM paper prints, and
scripts/estimate_memory.py's output.

Each entry must be reproduced within 0.02 GB, or be listed in ``PAPER_ERRATA`` with the
arithmetic, in which case it must really be off (so a stale erratum fails too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro import paper_memory
from repro.memory_estimator import GB, appendix_pair, estimate, table2_gb
from repro.tables import memory as estimate_memory

TOL = 0.02
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _check(table: str, method: str, model: str, paper: float, ours: float) -> None:
    why = paper_memory.erratum(table, method, model)
    if why is None:
        assert ours == pytest.approx(paper, abs=TOL), f"{table} {method} {model}"
    else:
        assert abs(ours - paper) > TOL, f"erratum listed but reproduced: {table} {method} {model}"


@pytest.mark.parametrize("method", list(paper_memory.PAPER_TABLE2))
def test_table2_memory_column(method: str) -> None:
    for model, printed in zip(
        paper_memory.PAPER_MODELS, paper_memory.PAPER_TABLE2[method], strict=True
    ):
        _check("table2", method, model, printed, table2_gb(estimate(model, method)))


@pytest.mark.parametrize("method", list(paper_memory.PAPER_APPENDIX))
def test_appendix_estimate_table(method: str) -> None:
    pairs = paper_memory.PAPER_APPENDIX[method]
    for model, (pw, ps) in zip(paper_memory.PAPER_MODELS, pairs, strict=True):
        w, s = appendix_pair(estimate(model, method))
        _check("appendix_weights", method, model, pw, w)
        _check("appendix_states", method, model, ps, s)


@pytest.mark.parametrize("method", list(paper_memory.PAPER_TABLE3))
def test_table3_7b_optimizer_states(method: str) -> None:
    """Table 3's 7B "Memory" is the optimizer-state estimate (3B: see results/memory_estimate.md)."""
    ours = estimate("llama_7b", method).optimizer_bytes / GB
    assert ours == pytest.approx(paper_memory.PAPER_TABLE3[method][1], abs=0.05)  # printed to 0.1 G


def test_the_papers_worked_example_for_foam2_60m() -> None:
    """Appendix: 25.3M x 2 B x 2/4 + 32.77M x 2 B x 2 + 116.14 MB = 272.52 MB."""
    e = estimate("llama_60m", "foam2")
    assert e.weights_bytes / 1e6 == pytest.approx(116.14, abs=0.01)
    assert e.optimizer_bytes / 1e6 == pytest.approx(25.3 + 131.08, abs=0.03)
    assert e.total_bytes / 1e6 == pytest.approx(272.52, abs=0.05)


def test_an_fp32_run_doubles_weights_and_states_but_not_8bit_states() -> None:
    """FOAM-2 on 60M in fp32 (what gpu_check's CPU runs hold): 4 bytes a value where the paper's
    bf16 has 2; an 8-bit state stays 1 byte."""
    bf16, fp32 = estimate("llama_60m", "foam2"), estimate("llama_60m", "foam2", 4)
    assert (fp32.weights_bytes, fp32.optimizer_bytes) == (
        2 * bf16.weights_bytes,
        2 * bf16.optimizer_bytes,
    )
    int8, int8_fp32 = estimate("llama_60m", "adamw8bit"), estimate("llama_60m", "adamw8bit", 4)
    assert int8_fp32.optimizer_bytes == int8.optimizer_bytes
    assert int8_fp32.weights_bytes == 2 * int8.weights_bytes


def test_units_are_decimal_gb_and_appendix_mixes_gib() -> None:
    e = estimate("llama_350m", "adamw")
    assert e.as_json()["weights_gb"] == pytest.approx(367_969_280 * 2 / 1e9)
    w, s = appendix_pair(e)
    assert w == pytest.approx(367_969_280 * 2 / 2**30)
    assert w + s == pytest.approx(e.total_bytes / 1e9)


def test_planned_equals_allocated_after_a_step() -> None:
    """The estimate is what the optimizer really holds (bf16 llama_tiny, one real step)."""
    import foam
    import models

    torch.manual_seed(0)
    model = models.build_model(models.load_model_config("llama_tiny"), dtype=torch.bfloat16)
    optimizer = foam.build_optimizer("foam", model, level=3)
    ids = torch.randint(2, 32000, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    held = sum(  # state_bytes also counts the step counters, which the estimate leaves out
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for key, t in state.items()
        if key != "step" and isinstance(t, torch.Tensor)
    )
    assert held == estimate("llama_tiny", "foam3").optimizer_bytes
    assert foam.state_bytes(optimizer) - held < 8 * len(optimizer.state)  # counters only


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--json", "--models", "llama_60m", "qwen_60m", "--methods", "adamw", "foam_mini"]
    assert estimate_memory.main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["method"]) for r in rows] == [
        ("llama_60m", "adamw"),
        ("llama_60m", "foam_mini"),
        ("qwen_60m", "adamw"),
        ("qwen_60m", "foam_mini"),
    ]
    for r in rows:
        assert set(r) == {"model", "method", "weights_gb", "optimizer_gb", "total_gb"}
        assert r["total_gb"] == pytest.approx(r["weights_gb"] + r["optimizer_gb"])
    assert rows[0]["optimizer_gb"] == pytest.approx(2 * rows[0]["weights_gb"])


def test_json_lists_table2s_methods(capsys: pytest.CaptureFixture[str]) -> None:
    estimate_memory.main(["--json", "--models", "llama_60m"])
    methods = [r["method"] for r in json.loads(capsys.readouterr().out)]
    assert methods == list(
        paper_memory.PAPER_TABLE2
    )  # every row of the paper's Table 2, in its order


def test_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert estimate_memory.main(["--compare"]) == 0
    out = capsys.readouterr().out
    assert "| Full-Adam | 0.35G (0.34) | 0.80G (0.80) | 2.21G (2.20) | 8.03G (8.03) |" in out
    assert "UNEXPLAINED" not in out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--methods", "foam_mni"],
            "optim=foam_mni: no such optim config; did you mean foam_mini?",
        ),
        (["--models", "lama_7b"], "model=lama_7b: no such model config; did you mean llama_7b?"),
    ],
)
def test_an_unknown_name_is_one_line_before_any_output(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        estimate_memory.main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and f"error: {line}" in err


def test_the_models_asked_for_get_the_every_size_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert estimate_memory.main(["--models", "qwen_7b", "--methods", "foam2"]) == 0
    every_size = capsys.readouterr().out.split("### Every size (decimal GB)")[1]
    rows = [line for line in every_size.splitlines() if line.startswith("| qwen")]
    assert [row.split(" | ")[:2] for row in rows] == [["| qwen_7b", "foam2"]]


def test_the_comparison_opens_with_the_report_and_fits_a_terminal():
    """Run as a user does: no library's start-up message first, no row over 120 characters
    (reasons shared by several errata are notes under the table, each given once)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "estimate_memory.py"), "--compare"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    lines = proc.stdout.splitlines()
    assert proc.stderr == "" and lines[0].startswith("Cells: ours (paper)")
    assert max(len(line) for line in lines) <= 120
    reasons = {why for *_, why in estimate_memory.deviations() if why}
    notes = [line for line in lines if line.startswith("[")]
    assert len(notes) == len(reasons)
