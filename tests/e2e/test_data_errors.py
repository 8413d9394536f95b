"""Data that cannot train stops the trainer's CLI before step 1 with one line: a file of random
bytes, and a paper-size model with the fallback tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import command, one_line_error, run
from tests.helpers.data_pipeline import random_bytes_file, shakespeare_or_skip


@pytest.fixture
def shakespeare() -> Path:
    return shakespeare_or_skip()


def test_a_file_of_random_bytes_stops_the_run_before_step_1(tmp_path):
    """Through the CLI: one line with the counts, exit 2, no tokenizer trained, no step run."""

    garbage = random_bytes_file(tmp_path / "garbage.txt")
    cache = tmp_path / "cache"
    overrides = ("data=local", f"data.path={garbage}", f"data.tokenizer_cache_dir={cache}")
    proc = run(command(tmp_path / "run", *overrides), expect_rc=2)
    line = one_line_error(proc)
    assert line.startswith(f"error: data.path={garbage}: ") and "bad_utf8: " in line
    assert proc.stderr.strip() == line
    assert not cache.exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_paper_size_model_with_the_fallback_tokenizer_is_refused_before_it_is_built(
    tmp_path, shakespeare
):
    """The issue's ``+model=llama_350m`` offline: a SentencePiece model of a few thousand pieces
    for 32000 ids stops the run with one line, before the 350M model is built."""

    overrides = (
        "+model=llama_350m",
        "logger=none",
        "data=local",
        f"data.path={shakespeare}",
        f"data.tokenizer_cache_dir={tmp_path / 'cache'}",
    )
    proc = run(command(tmp_path / "run", *overrides, tiny=False), expect_rc=2)
    assert one_line_error(proc).startswith("error: data.allow_small_tokenizer: tokenizer spm:")
    assert "model llama_350m" not in proc.stdout  # refused before the model was built
