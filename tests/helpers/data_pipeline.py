"""What the data pipeline's tests share: a small data config, C4-layout fixtures written on the
spot, and readers of a loader's batches (tests/train/data/, tests/e2e/test_data_errors.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from train.data import corpus
from train.data.loader import rank_stream
from train.schema import DataConfig

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO.parent / "shared/data/tinyshakespeare.txt"
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "this",
    "are",
]


def cfg(**over) -> DataConfig:
    base = DataConfig(
        name="local",
        path=None,
        seq_len=32,
        pack=False,
        tokenizer="spm",
        tokenizer_fallback=True,
        tokenizer_cache_dir=None,
        spm_vocab_size=8192,
        allow_small_tokenizer=True,  # the pipeline's tests tokenize small corpora for 32000 ids
        val_fraction=0.1,
        shuffle_seed=42,
        shuffle_buffer=16,
        num_workers=0,
    )
    return dataclasses.replace(base, **over)


def doc_text(f: int, i: int) -> str:
    n = 5 + (f * 31 + i * 17) % 60  # varied lengths: some truncated at seq_len 32, most padded
    return f"doc{f}x{i} " + " ".join(WORDS[(f + i * k) % len(WORDS)] for k in range(n))


def write_c4(root: Path, split: str, n_files: int, n_docs: int) -> list[str]:
    """C4-layout json.gz shards (`en/c4-<split>.0000k-of-0000n.json.gz`); returns the texts."""
    (root / "en").mkdir(parents=True, exist_ok=True)
    texts = []
    for f in range(n_files):
        rows = []
        for i in range(n_docs):
            text = doc_text(f + (100 if split == "validation" else 0), i)
            texts.append(text)
            rows.append(
                json.dumps({"text": text, "timestamp": "2019-04-25T12:00:00Z", "url": f"u{f}/{i}"})
            )
        name = f"c4-{split}.{f:05d}-of-{n_files:05d}.json.gz"
        with gzip.open(root / "en" / name, "wt", encoding="utf-8") as fh:
            fh.write("\n".join(rows) + "\n")
    return texts


def stream(c: dict, *, rank: int, world_size: int) -> list[dict]:
    """This rank's shuffled training records (the protocol's seed 42)."""
    split = corpus.open_source(c, "train")
    return list(
        rank_stream(
            split, shuffle_buffer=c.shuffle_buffer, rank=rank, world_size=world_size, seed=42
        )
    )


def take(loader, n: int) -> list[dict]:
    return [next(loader) for _ in range(n)]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def random_bytes_file(path: Path, size: int = 200_000) -> Path:
    path.write_bytes(random.Random(0).randbytes(size))
    return path


def shakespeare_or_skip() -> Path:
    """Tiny Shakespeare from the shared data folder, or a skip where it is not mounted."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"{SHAKESPEARE} is absent (the shared data folder is not mounted)")
    return SHAKESPEARE
