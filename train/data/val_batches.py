"""The fixed evaluation sets: one set of rows for every world size, read once by rank 0 and
scattered, then kept in memory so every evaluation scores the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import torch

from train.data.batcher import Batcher, new_stats, produce
from train.data.corpus import Source, describe_skips, open_source, open_sources
from train.data.loader import rank_stream
from train.data.tokenizer import Tokenizer
from train.distributed import failure_stops_every_rank, is_initialized, scatter_from_rank0
from train.errors import DataSourceError
from train.objective import IGNORE_INDEX
from train.schema import PROTOCOL_SEED, DataConfig

logger = logging.getLogger(__name__)


class ValBatches:
    """A fixed validation set: built on first iteration, then re-iterated from memory.

    The set is the same rows for every world size and micro-batch size, so runs on different
    numbers of GPUs are scored on the same tokens: rank 0 reads the whole (unsplit) shuffled
    validation stream, cuts it into rows (one per document, or packed rows of ``seq_len``) until
    ``max_tokens`` non-pad tokens or the end of the split, and sends each rank its rows
    ``rank::world_size``. Rows are stored as int32 ids plus lengths (~50 MB for the protocol's
    10M tokens over all ranks); masks and labels are rebuilt per batch. The last batch may have
    fewer rows, and ranks may hold different numbers of batches: reduce sums of loss and token
    counts once after the loop, not per batch.
    """

    def __init__(
        self,
        records: Callable[[], Iterable[dict]],
        tokenizer: Tokenizer,
        *,
        micro_batch_size: int,
        seq_len: int,
        pack: bool,
        max_tokens: int,
        rank: int = 0,
        world_size: int = 1,
        label: str = "data",
        split: str = "validation",
    ):
        self._records = records
        self._label = label
        self._split = split
        self._tokenizer = tokenizer
        self._batcher = Batcher(tokenizer, micro_batch_size, seq_len, pack)
        self._rows = Batcher(tokenizer, 1, seq_len, pack)  # one row at a time: no batch rounding
        self._max_tokens = max_tokens
        self._rank, self._world_size = rank, world_size
        self._ids: torch.Tensor | None = None
        self._lens: torch.Tensor | None = None
        self.stats: dict[str, int] = new_stats()

    def _read_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole set: every row's ids (padded to ``seq_len``) and its length."""
        state = {"epoch": 0, "records": 0, "carry": [], "stats": self.stats}
        rows: list[list[int]] = []
        tokens = 0
        produced = produce(iter(self._records()), self._tokenizer, self._rows, state)
        for (row,), _ in produced:
            rows.append(row)
            tokens += len(row)
            if tokens >= self._max_tokens:
                break
        else:
            tail = [row for row in state["carry"] if row]  # packing: the last, partial row
            rows += tail
            self.stats["tokens"] += sum(len(row) for row in tail)
        if not rows:
            raise DataSourceError(
                f"{self._label}: no usable {self._split} documents: {describe_skips(self.stats)}"
            )
        if len(rows) < self._world_size:
            raise DataSourceError(
                f"{self._label}: the {self._split} set has {len(rows)} rows, fewer than the "
                f"{self._world_size} ranks that share it; give more {self._split} data"
            )
        ids = torch.full((len(rows), self._batcher.T), self._batcher.pad, dtype=torch.int32)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return ids, torch.tensor([len(row) for row in rows], dtype=torch.int32)

    def _build(self) -> None:
        """Rank 0 reads the set and hands each rank ``r`` its rows ``r::world_size`` (every rank
        at the same evaluation: collective; an error on rank 0 is raised on every rank).

        One reader, so the ranks share one set whatever each of them could read, and the hub
        and the tokenizer serve it once per run instead of once per rank. Without a process
        group (one process, or a rank simulated in a test) the rank reads it itself.
        """
        shares = None
        with failure_stops_every_rank(DataSourceError):
            if self._rank == 0 or not is_initialized():
                ids, lens = self._read_set()
                n, tokens = self._world_size, int(lens.sum())
                shares = [
                    (ids[r::n].clone(), lens[r::n].clone(), len(lens), tokens) for r in range(n)
                ]
        self._ids, self._lens, rows, tokens = scatter_from_rank0(shares, self._rank)
        logger.info(
            "data: %s set of %d sequences, %d tokens; %d sequences, %d tokens on this rank",
            self._split,
            rows,
            tokens,
            len(self._lens),
            int(self._lens.sum()),
        )

    def __len__(self) -> int:
        if self._ids is None:
            self._build()
        return -(-self._ids.shape[0] // self._batcher.B)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._ids is None:
            self._build()
        B, T = self._batcher.B, self._batcher.T
        positions = torch.arange(T)
        for start in range(0, self._ids.shape[0], B):
            ids = self._ids[start : start + B].long()
            mask = (positions[None, :] < self._lens[start : start + B, None]).long()
            yield {
                "input_ids": ids,
                "labels": ids.masked_fill(mask == 0, IGNORE_INDEX),
                "attention_mask": mask,
            }


def build_val_batches(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    max_tokens: int,
    source: Source | None = None,
    split: str = "validation",
) -> ValBatches:
    """This rank's share of a fixed evaluation set of about `max_tokens` non-pad tokens in all,
    from the validation split (every evaluation) or the test split (the final one only, where
    ``trainer.test_tokens`` asks: a split no choice of a study was made on).

    Same shuffle buffer, tokenization and batch format as training, but always the protocol's
    seed (``PROTOCOL_SEED``): runs that train on other orders (``data.shuffle_seed``)
    are scored on the same tokens, and so are runs on other world sizes (``ValBatches``). The
    data is read lazily on first iteration, then kept in memory so every evaluation sees the same
    tokens.
    """
    source = source or open_sources(cfg)
    records = source.validation if split == "validation" else open_source(cfg, split)
    return ValBatches(
        lambda: rank_stream(
            records,
            shuffle_buffer=cfg.shuffle_buffer,
            rank=0,
            world_size=1,
            seed=PROTOCOL_SEED,
        ),
        tokenizer,
        micro_batch_size=micro_batch_size,
        seq_len=cfg.seq_len,
        pack=cfg.pack,
        max_tokens=int(max_tokens),
        rank=rank,
        world_size=world_size,
        label=source.label,
        split=split,
    )
