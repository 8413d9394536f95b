"""The data pipeline's fixtures, built once per process: C4-layout json.gz shards, the project's
SentencePiece model trained on them, and tiny Shakespeare where the shared data folder has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.data_pipeline import cfg, shakespeare_or_skip, write_c4
from train.data.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def c4_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("c4")
    write_c4(root, "train", n_files=4, n_docs=30)
    write_c4(root, "validation", n_files=2, n_docs=20)
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("foam-cache")


@pytest.fixture(scope="session")
def tok(c4_dir, cache_dir):
    """The project SentencePiece model trained on the C4 fixture (small and fast)."""
    return build_tokenizer(cfg(path=str(c4_dir), tokenizer_cache_dir=str(cache_dir)), 32000)


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    return shakespeare_or_skip()
