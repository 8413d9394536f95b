"""Training and validation batches: the benchmark protocol's C4 pipeline, resumable and robust.

Pipeline (the same code for `data=c4`, `data=local` and `data=embedded`; only the source differs,
see `train/data/corpus.py`):

    source -> .shuffle(seed=data.shuffle_seed (42; validation: always 42),
                       buffer_size=data.shuffle_buffer (1000))
           -> split_dataset_by_node(rank, world_size) -> tokenize -> batch

* Default (`data.pack=false`), as the protocol: each document is tokenized alone with EOS
  appended, truncated to `seq_len` (EOS kept last, like HF `truncation=True` for T5) and
  right-padded with the pad id.
* `data.pack=true`: documents (each ending in EOS) are concatenated and cut into rows of `seq_len`
  with no padding; documents are not truncated.

Batches are dicts of LongTensor[B, T]: `input_ids`; `attention_mask` (1 for real tokens);
`labels` = `input_ids` with padding set to `IGNORE_INDEX` (-100, `train/objective.py`). Labels
are **not shifted**: position t holds token t, and the trainer shifts (logits[:, :-1] predict
labels[:, 1:]), as HF's causal-LM loss does.
Right padding is what lets the trainer leave the mask out (``train.step.to_device``): in a causal
LM no real token sees the padding after it.

Ranks see disjoint training data: `split_dataset_by_node` gives whole shards (files) to ranks
when the shard count divides the world size, otherwise every rank keeps one record in
`world_size`. The validation set is the same rows for every world size: rank 0 reads the whole
validation stream and each rank scores rows `rank::world_size` (`train/data/val_batches.py`).

Proven before step 1 (``prove_data``): the training split fills one micro-batch in a single pass
(the loader reads its first batch at start-up and hands it out first), and some validation
document has a token to predict; otherwise the run stops with one line (a config error).

Records become rows in `train/data/batcher.py`. Resume: the train loader's position is (epoch, raw
records consumed from this rank's stream, tokens carried into the next batch; carried to another
world size by `train/data/position.py`). `load_state_dict` rebuilds the stream of that epoch and
skips the consumed records without tokenizing them, so the following batches are exactly those
of an uninterrupted run. Finite data restarts a new epoch via `IterableDataset.set_epoch`, which
reshuffles deterministically.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from train.data.batcher import Batcher, new_stats, produce, snapshot
from train.data.corpus import Source, describe_skips, open_sources
from train.data.position import DERIVED_FINGERPRINT_KEYS, STATE_VERSION, rederive_position
from train.data.tokenizer import Tokenizer
from train.distributed import failure_stops_every_rank
from train.errors import ConfigError, DataSourceError
from train.schema import DataConfig

__all__ = ["TrainLoader", "build_train_loader", "prove_data"]

logger = logging.getLogger(__name__)


def split_mode(split: Any, world_size: int) -> str:
    """How ``split_dataset_by_node`` shares a split among ranks: ``"shards"`` (whole files, when
    their count divides the world size) or ``"records"`` (one record in ``world_size``)."""
    shards = getattr(split, "n_shards", 1)
    return "shards" if world_size > 1 and shards % world_size == 0 else "records"


def rank_stream(
    split: Any, *, shuffle_buffer: int, rank: int, world_size: int, seed: int, epoch: int = 0
) -> Iterable[dict]:
    """This rank's shuffled record stream of one opened split (a `Source` attribute) and epoch:
    the protocol's steps 1-3. The split itself is left untouched, so it serves every epoch."""
    from datasets.distributed import split_dataset_by_node

    ds = split
    if shuffle_buffer > 0:
        ds = ds.shuffle(seed=seed, buffer_size=shuffle_buffer)
    if world_size > 1:
        ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
    ds.set_epoch(epoch)  # after the split, which builds a new dataset at epoch 0
    return ds


class TrainLoader:
    """Infinite iterator of training batches for one rank, with an exact, resumable position.

    `num_workers` > 0 runs the reading and tokenizing in one background thread (tokenizers use
    `num_workers` threads for batch encoding); the batch order is the same as with 0. The state
    returned by `state_dict()` is the position after the last batch handed out, not after what
    the background thread has read ahead.
    """

    def __init__(
        self,
        open_stream: Callable[[int], Iterable[dict]],
        tokenizer: Tokenizer,
        *,
        micro_batch_size: int,
        seq_len: int,
        pack: bool,
        num_workers: int = 0,
        prefetch: int = 4,
        fingerprint: dict | None = None,
        label: str = "data",
    ):
        self._open_stream = open_stream
        self._label = label
        self.tokenizer = tokenizer
        self._batcher = Batcher(tokenizer, micro_batch_size, seq_len, pack)
        self._threaded = num_workers > 0
        self._prefetch = max(1, prefetch)
        self._fingerprint = fingerprint or {}
        self._state = {"epoch": 0, "records": 0, "carry": [], "stats": new_stats()}
        self._first: tuple[list[list[int]], dict] | None = None  # read by check_one_pass_fills
        self._gen: Iterator[tuple[list[list[int]], dict]] | None = None
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def stats(self) -> dict[str, int]:
        """Counters up to the last batch handed out (records, documents, skipped, tokens...)."""
        return self._state["stats"]

    def __iter__(self) -> TrainLoader:
        return self

    def _epochs(self, start: dict) -> Iterator[tuple[list[list[int]], dict]]:
        """Batches from `start` on, across epochs; the first epoch skips consumed records."""
        state = snapshot(start)
        while True:
            stream = iter(self._open_stream(state["epoch"]))
            skipped = sum(1 for _ in itertools.islice(stream, state["records"]))
            if skipped < state["records"]:
                raise RuntimeError(
                    f"cannot resume: epoch {state['epoch']} has {skipped} records on this rank, "
                    f"the checkpoint consumed {state['records']} (did the data change?)"
                )
            before = state["stats"]["documents"]
            yield from produce(stream, self.tokenizer, self._batcher, state)
            if skipped == 0 and state["stats"]["documents"] == before:
                raise DataSourceError(
                    f"{self._label}: no usable training documents on this rank: "
                    f"{describe_skips(state['stats'])}"
                )
            state["epoch"] += 1
            state["stats"]["epoch"] = state["epoch"]
            state["records"] = 0
            logger.info("data: epoch %d begins (finite data restarts, reshuffled)", state["epoch"])

    def _worker(self, gen: Iterator, q: queue.Queue, stop: threading.Event) -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # surface errors in the consumer thread
            q.put(exc)

    def _start(self) -> None:
        gen = self._epochs(self._state)
        if not self._threaded:
            self._gen = gen
            return
        self._queue = queue.Queue(maxsize=self._prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._worker, args=(gen, self._queue, self._stop), daemon=True, name="foam-data"
        )
        self._thread.start()

    def _read(self) -> tuple[list[list[int]], dict]:
        """The next batch's rows and the position after them."""
        if self._first is not None:
            item, self._first = self._first, None
            return item
        if self._gen is None and self._thread is None:
            self._start()
        if not self._threaded:
            return next(self._gen)
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def __next__(self) -> dict[str, torch.Tensor]:
        rows, self._state = self._read()
        return self._batcher.tensors(rows)

    def check_one_pass_fills(self) -> None:
        """Read the next batch now (``next`` still returns it) and refuse a split that cannot fill
        it in one pass: cycling a few documents through many "epochs" is not training on them."""
        if self._first is None:
            self._first = self._read()
        _, after = self._first
        if after["epoch"] > self._state["epoch"]:
            B, T, packed = self._batcher.B, self._batcher.T, self._batcher.pack
            raise DataSourceError(
                f"{self._label}: one pass over this rank's training data does not fill one "
                f"micro-batch ({B} {'packed rows' if packed else 'documents'} of up to {T} "
                f"tokens; {describe_skips(after['stats'])}); give more data or lower "
                "trainer.micro_batch_size"
            )

    def state_dict(self) -> dict:
        """Position after the last batch returned: plain ints and lists (torch.save / JSON)."""
        return {
            "version": STATE_VERSION,
            "config": dict(self._fingerprint),
            **snapshot(self._state),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the batch at which `state` was taken."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported data state version {state.get('version')}")
        saved = state.get("config", {})
        diff = {
            k: (saved.get(k), v)
            for k, v in self._fingerprint.items()
            if saved.get(k) != v and not (k in DERIVED_FINGERPRINT_KEYS and k not in saved)
        }
        if diff:
            raise ConfigError(
                "trainer.resume: the data checkpoint was taken with different settings (saved, "
                f"now): {diff}; resume with the same data config, batch size and world size"
            )
        self.close()
        stats = new_stats()
        stats.update(state["stats"])
        self._state = {
            "epoch": int(state["epoch"]),
            "records": int(state["records"]),
            "carry": [list(c) for c in state["carry"]],
            "stats": stats,
        }

    def load_positions(self, positions: list[dict]) -> None:
        """Continue from a checkpoint's positions of all its ranks: this rank's own when the world
        size is the same, else re-derived (``rederive_position``, which says why it cannot)."""
        rank, world_size = self._fingerprint["rank"], self._fingerprint["world_size"]
        if len(positions) == world_size:
            self.load_state_dict(positions[rank])
        else:
            self.load_state_dict(rederive_position(positions, self._fingerprint))

    def close(self) -> None:
        """Stop the background thread (if any); the next `next()` restarts from the state."""
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._queue.get(timeout=0.05)
            self._thread.join()
        self._gen, self._queue, self._stop, self._thread = None, None, None, None
        self._first = None  # read ahead of the state too

    def __del__(self) -> None:
        try:
            if self._stop is not None:
                self._stop.set()
        except Exception:
            pass


def _shuffle_seed(cfg: DataConfig, seed: int) -> int:
    """The protocol's fixed shuffle seed whatever the run's seed; ``shuffle_seed: null``: ``seed``."""
    return seed if cfg.shuffle_seed is None else cfg.shuffle_seed


def _fingerprint(cfg: DataConfig, tokenizer: Tokenizer, **extra: Any) -> dict:
    keys = ("name", "seq_len", "pack", "val_fraction", "shuffle_buffer")
    fp = {k: getattr(cfg, k) for k in keys}
    fp.update(tokenizer=tokenizer.name, **extra)
    return {
        k: (str(v) if v is not None and not isinstance(v, int | float | bool) else v)
        for k, v in fp.items()
    }


def build_train_loader(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    source: Source | None = None,
) -> TrainLoader:
    """The infinite training loader of this rank (see the module docstring for the format).

    ``source`` is the run's opened source; without it the source is opened here, so a missing
    path or an unreachable hub fails at start-up either way.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    source = source or open_sources(cfg)
    shuffle_seed = _shuffle_seed(cfg, seed)

    def open_stream(epoch: int) -> Iterable[dict]:
        return rank_stream(
            source.train,
            shuffle_buffer=cfg.shuffle_buffer,
            rank=rank,
            world_size=world_size,
            seed=shuffle_seed,
            epoch=epoch,
        )

    return TrainLoader(
        open_stream,
        tokenizer,
        micro_batch_size=micro_batch_size,
        seq_len=cfg.seq_len,
        pack=cfg.pack,
        num_workers=cfg.num_workers,
        fingerprint=_fingerprint(
            cfg,
            tokenizer,
            micro_batch_size=micro_batch_size,
            rank=rank,
            world_size=world_size,
            shuffle_seed=shuffle_seed,
            split=split_mode(source.train, world_size),
        ),
        label=source.label,
    )


def check_scoreable(source: Source, tokenizer: Tokenizer, seq_len: int, pack: bool) -> None:
    """Refuse a validation split none of whose first usable documents (``Source.validation_sample``)
    has a token to predict once tokenized and cut to ``seq_len``: its perplexity would be 0/0."""
    lengths = [min(len(ids), seq_len) for ids in tokenizer.encode_batch(source.validation_sample)]
    rows = [min(sum(lengths), seq_len)] if pack else lengths
    if not any(n >= 2 for n in rows):
        raise DataSourceError(
            f"{source.label}: the first {len(lengths)} validation documents tokenize to a single "
            f"token each ({tokenizer.name}): nothing to score"
        )


def prove_data(
    source: Source, tokenizer: Tokenizer, train_loader: TrainLoader, cfg: DataConfig
) -> None:
    """Before step 1, on every rank (collective): the training split fills a micro-batch in one
    pass and the validation split can be scored; else a config error stops every rank."""
    with failure_stops_every_rank(DataSourceError):
        check_scoreable(source, tokenizer, cfg.seq_len, cfg.pack)
        train_loader.check_one_pass_fills()
