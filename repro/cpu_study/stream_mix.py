"""What a run's training stream is made of, window by window: each source's share of the words.

Reads the training stream the trainer reads with ``data=local data.path=DIR`` (its files, shuffle
buffer and ``data.shuffle_seed``) and attributes each document to the host of its ``url`` in the
mirror's records (``unknown`` for records without one). A corpus whose files are each a random
sample of it shows steady shares from the first window on; files written in source order do not,
because ``datasets`` streams the files interleaved, first records first, and the shuffle buffer
cannot mix what it has not read (``results/repro/PROTOCOL.md``, "Second restart").
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

from train.data.corpus import list_local_files, open_sources
from train.data.loader import rank_stream
from train.schema import DataConfig


def source_of_text(path: Path) -> dict[str, str]:
    """Document text -> the host of its URL, read from the mirror's JSON-lines training files
    (the trainer keeps only the text)."""
    train = list_local_files(path).train
    hosts: dict[str, str] = {}
    for file in (f for f in train if ".json" in f.name):
        opener = gzip.open if file.suffix == ".gz" else open
        with opener(file, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line) if line.strip() else {}
                if isinstance(row.get("text"), str):
                    hosts[row["text"]] = urlparse(row.get("url") or "").netloc or "unknown"
    return hosts


def window_shares(
    path: Path, seed: int, shuffle_buffer: int, window_words: int, windows: int
) -> list[dict[str, float]]:
    """Each window's share of the words by source, in stream order."""
    hosts = source_of_text(path)
    cfg = DataConfig(name="local", path=str(path))  # the source; the shuffle is rank_stream's
    stream = rank_stream(
        open_sources(cfg).train, shuffle_buffer=shuffle_buffer, rank=0, world_size=1, seed=seed
    )
    shares: list[dict[str, float]] = []
    words: Counter[str] = Counter()
    for record in stream:
        if record["text"] is None:
            continue
        words[hosts.get(record["text"], "unknown")] += len(record["text"].split())
        total = sum(words.values())
        if total >= window_words:
            shares.append({host: n / total for host, n in sorted(words.items())})
            words.clear()
            if len(shares) == windows:
                break
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a local C4-format mirror (scripts/make_corpus.py)")
    parser.add_argument("--seed", type=int, default=42, help="data.shuffle_seed")
    parser.add_argument("--shuffle-buffer", type=int, default=DataConfig.shuffle_buffer)
    parser.add_argument("--window-words", type=int, default=250_000)
    parser.add_argument("--windows", type=int, default=10)
    args = parser.parse_args(argv)
    if not args.path.exists():
        parser.error(f"{args.path} does not exist")
    shares = window_shares(
        args.path, args.seed, args.shuffle_buffer, args.window_words, args.windows
    )
    hosts = sorted({host for window in shares for host in window})
    print("window  " + "  ".join(f"{host:>20}" for host in hosts))
    for i, window in enumerate(shares):
        print(f"{i:>6}  " + "  ".join(f"{window.get(host, 0.0):>20.2f}" for host in hosts))
    return 0
