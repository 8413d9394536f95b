"""Records to fixed-shape rows, shared by the train loader (``train/data/loader.py``) and the validation
set (``train/data/val_batches.py``): records are tokenized in chunks, each document truncated to
``seq_len`` and right-padded (``data.pack=false``, the protocol) or concatenated into full rows
(``data.pack=true``), and unusable records counted by reason. The position attached to each batch
counts only the records up to it, so a restore at any batch boundary is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from train.data.corpus import SKIP_REASONS, count_skip
from train.data.tokenizer import Tokenizer
from train.objective import IGNORE_INDEX

READ_CHUNK = 256  # raw records tokenized together (batch encoding is much faster per document)


def new_stats() -> dict[str, int]:
    """Zeroed counters of a loader: records, documents, tokens, and skipped records by reason."""
    stats = {"epoch": 0, "records": 0, "documents": 0, "truncated": 0, "tokens": 0, "skipped": 0}
    stats.update({f"skipped_{r}": 0 for r in SKIP_REASONS})
    return stats


class Batcher:
    """Turns tokenized documents into fixed-shape batches (truncate+pad, or pack)."""

    def __init__(self, tokenizer: Tokenizer, batch_size: int, seq_len: int, pack: bool):
        self.B, self.T, self.pack = batch_size, seq_len, pack
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def add(self, carry: list[list[int]], ids: list[int], stats: dict) -> list[list[list[int]]]:
        """Add one document to `carry` (in place); return the completed batches' rows."""
        T, B = self.T, self.B
        if not self.pack:
            if len(ids) > T:
                ids = [*ids[: T - 1], self.eos]
                stats["truncated"] += 1
            carry.append(ids)
            if len(carry) < B:
                return []
            rows = carry[:]
            carry.clear()
            return [rows]
        if not carry:
            carry.append([])
        buf = carry[0]
        buf.extend(ids)
        out = []
        while len(buf) >= B * T:
            out.append([buf[i * T : (i + 1) * T] for i in range(B)])
            del buf[: B * T]
        return out

    def tensors(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        ids = torch.full((len(rows), self.T), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), self.T), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def produce(
    records: Iterator[dict],
    tokenizer: Tokenizer,
    batcher: Batcher,
    state: dict,
) -> Iterator[tuple[list[list[int]], dict]]:
    """Yield (rows, state after these rows) over `records`, updating `state` as it goes.

    `state["records"]` counts raw records (good or bad) consumed in this epoch; `state["carry"]`
    holds tokens of consumed documents not yet in a batch. Records are read and tokenized in
    chunks, but the state attached to a batch counts only the records up to that batch, so a
    restore at any batch boundary is exact.
    """
    stats = state["stats"]
    while True:
        chunk = list(itertools.islice(records, READ_CHUNK))
        if not chunk:
            return
        texts = [r.get("text") for r in chunk]
        good = [t for t in texts if isinstance(t, str) and t.strip()]
        encoded = iter(tokenizer.encode_batch(good) if good else [])
        for rec, text in zip(chunk, texts, strict=True):
            state["records"] += 1
            stats["records"] += 1
            if not (isinstance(text, str) and text.strip()):
                count_skip(stats, rec)
                continue
            ids = next(encoded)
            stats["documents"] += 1
            for rows in batcher.add(state["carry"], ids, stats):
                stats["tokens"] += sum(len(r) for r in rows)
                yield rows, snapshot(state)


def snapshot(state: dict) -> dict:
    """A copy of a loader's position that later reading does not change."""
    return {
        "epoch": state["epoch"],
        "records": state["records"],
        "carry": [list(c) for c in state["carry"]],
        "stats": dict(state["stats"]),
    }
