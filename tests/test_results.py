"""Committed results regenerate byte for byte from what is committed beside them."""

from pathlib import Path

from repro import make_tables

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "results" / "repro"


def test_repro_tables_regenerate_byte_for_byte_from_the_committed_summaries(tmp_path):
    committed = sorted(p for p in (REPRO / "tables").iterdir() if p.suffix in (".md", ".tex"))
    assert committed, "results/repro/tables holds no tables"
    assert make_tables.main([str(REPRO / "runs"), "--out", str(tmp_path)]) == 0
    for path in committed:
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name
