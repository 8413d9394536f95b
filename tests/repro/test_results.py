"""Committed results regenerate byte for byte from what is committed beside them."""

from pathlib import Path

import pytest

from repro.cpu_study import make_tables
from repro.tables import experiments

RESULTS = Path(__file__).resolve().parents[2] / "results"


def make_v4(args: list[str]) -> int:
    return make_tables.main([*args, "--v4", str(RESULTS / "repro" / "runs")])


@pytest.mark.parametrize(
    ("directory", "make"),
    [("repro", make_tables.main), ("repro/v4", make_v4), ("cosine_cpu", experiments.main)],
    ids=["repro", "repro-v4", "cosine_cpu"],
)
def test_tables_regenerate_byte_for_byte_from_the_committed_runs(directory, make, tmp_path):
    committed = sorted(
        p for p in (RESULTS / directory / "tables").iterdir() if p.suffix in (".md", ".tex")
    )
    assert committed, f"results/{directory}/tables holds no tables"
    assert make([str(RESULTS / directory / "runs"), "--out", str(tmp_path)]) == 0
    for path in committed:
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name
