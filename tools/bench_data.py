"""Throughput of the data pipeline alone (read, shuffle, split, tokenize, batch), in tokens/s.

Two sources: the embedded corpus, and a generated C4-format json.gz mirror (`en/c4-train.*`)
of synthetic documents with C4's length profile. Prints one line per case: non-pad tokens/s
(what training consumes) and token slots/s (batch rows x seq_len).

    python scripts/bench_data.py                       # both sources, default settings
    python scripts/bench_data.py --tokenizer t5-base --num-workers 4 --pack
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
import tempfile
import time
from pathlib import Path

from train.data.corpus import embedded_documents
from train.data.loader import build_train_loader
from train.data.tokenizer import build_tokenizer
from train.schema import DataConfig


def write_c4_mirror(root: Path, n_files: int, docs_per_file: int, seed: int = 0) -> None:
    """Synthetic C4 shards: words from the embedded corpus, ~2200 characters per document."""
    rng = random.Random(seed)
    words = " ".join(text for _, text in embedded_documents()).split()
    (root / "en").mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        rows = []
        for i in range(docs_per_file):
            n = max(20, int(rng.lognormvariate(5.6, 0.8)))  # median ~270 words, mean ~370
            start = rng.randrange(len(words) - n)
            text = " ".join(words[start : start + n])
            rows.append(
                json.dumps(
                    {"text": text, "timestamp": "2019-04-25T12:00:00Z", "url": f"https://x/{f}/{i}"}
                )
            )
        with gzip.open(root / "en" / f"c4-train.{f:05d}-of-{n_files:05d}.json.gz", "wt") as fh:
            fh.write("\n".join(rows) + "\n")


def bench(data_cfg: DataConfig, tokenizer, batch_size: int, batches: int, warmup: int) -> dict:
    loader = build_train_loader(
        data_cfg, tokenizer, micro_batch_size=batch_size, rank=0, world_size=1, seed=0
    )
    for _ in range(warmup):
        next(loader)
    tokens = slots = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(loader)
        tokens += int(batch["attention_mask"].sum())
        slots += batch["input_ids"].numel()
    dt = time.perf_counter() - t0
    loader.close()
    return {
        "tokens_per_s": tokens / dt,
        "slots_per_s": slots / dt,
        "seconds": dt,
        "skipped": loader.stats["skipped"],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tokenizer", default="spm", help="spm (project SentencePiece), t5-base, or a path"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--pack", action="store_true")
    p.add_argument("--c4-files", type=int, default=4)
    p.add_argument("--c4-docs-per-file", type=int, default=1500)
    p.add_argument("--cache-dir", default=None, help="tokenizer cache (default ~/.cache/foam)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("train.data.loader").setLevel(logging.WARNING)  # no per-epoch lines

    common = dict(
        seq_len=args.seq_len,
        pack=args.pack,
        tokenizer=args.tokenizer,
        tokenizer_fallback=True,
        tokenizer_cache_dir=args.cache_dir,
        spm_vocab_size=8192,
        shuffle_seed=42,
        shuffle_buffer=1000,
        num_workers=args.num_workers,
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_c4_mirror(Path(tmp), args.c4_files, args.c4_docs_per_file)
        print(
            f"generated C4-format mirror: {args.c4_files} x {args.c4_docs_per_file} docs in {time.perf_counter() - t0:.1f} s"
        )
        cases = {
            "embedded": DataConfig(**common, name="embedded", path=None, val_fraction=0.1),
            "c4-json.gz": DataConfig(**common, name="local", path=tmp, val_fraction=0.01),
        }
        for name, cfg in cases.items():
            t0 = time.perf_counter()
            tok = build_tokenizer(cfg, 32000)
            setup = time.perf_counter() - t0
            r = bench(cfg, tok, args.batch_size, args.batches, args.warmup)
            print(
                f"{name:>11}: {r['tokens_per_s']:>10,.0f} tokens/s  {r['slots_per_s']:>10,.0f} slots/s  "
                f"(tokenizer {tok.name}, setup {setup:.1f} s, B={args.batch_size} T={args.seq_len} "
                f"pack={args.pack} workers={args.num_workers}, {args.batches} batches in {r['seconds']:.1f} s)"
            )
