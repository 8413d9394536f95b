"""train/data/val_batches.py: one validation set, the same rows for any world and micro-batch size,
independent of the training order; read by rank 0 and shared, or refused on every rank."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers.data_pipeline import assert_same, cfg
from train.data import corpus, tokenizer
from train.data.loader import build_train_loader
from train.data.val_batches import build_val_batches
from train.errors import DataSourceError


def val_rows(c: dict, tok, *, micro_batch_size: int, rank: int, world_size: int, max_tokens: int):
    """(rows as tuples of ids without padding, the ValBatches) of one rank."""
    v = build_val_batches(
        c,
        tok,
        micro_batch_size=micro_batch_size,
        rank=rank,
        world_size=world_size,
        max_tokens=max_tokens,
    )
    first, again = list(v), list(v)
    assert_same(first, again)  # re-iterable, fixed
    assert len(v) == len(first)
    rows = []
    for b in first:
        assert b["input_ids"].shape[0] <= micro_batch_size
        assert torch.equal(b["labels"], b["input_ids"].masked_fill(b["attention_mask"] == 0, -100))
        rows += [
            tuple(r[: int(m.sum())])
            for r, m in zip(b["input_ids"].tolist(), b["attention_mask"], strict=True)
        ]
    return rows, v


@pytest.mark.parametrize("pack", [False, True])
def test_the_validation_set_is_the_same_rows_for_any_world_and_micro_batch_size(c4_dir, tok, pack):
    """Rank r scores rows r::W of one set, which stops at the row that reaches the budget, so
    runs on other numbers of GPUs (or with another eval batch size) are scored on the same tokens."""
    c = cfg(path=str(c4_dir), pack=pack)
    whole, _ = val_rows(c, tok, micro_batch_size=3, rank=0, world_size=1, max_tokens=400)
    tokens = sum(len(r) for r in whole)
    assert tokens - len(whole[-1]) < 400 <= tokens  # stops at the row that reaches 400
    assert len(set(whole)) == len(whole)
    for world_size, micro in [(1, 5), (2, 3), (3, 2), (3, 7)]:
        shares = [
            val_rows(c, tok, micro_batch_size=micro, rank=r, world_size=world_size, max_tokens=400)
            for r in range(world_size)
        ]
        for r, (rows, _) in enumerate(shares):
            assert rows == whole[r::world_size]
    # the end of the split: every document, the last packed row partial, nothing dropped
    every, v = val_rows(c, tok, micro_batch_size=3, rank=0, world_size=1, max_tokens=10**9)
    assert v.stats["documents"] == 40
    assert sum(len(r) for r in every) == v.stats["tokens"]
    if pack:
        assert {len(r) for r in every[:-1]} == {32} and 0 < len(every[-1]) <= 32


def test_a_validation_set_smaller_than_the_world_size_is_refused_on_every_rank(c4_dir, tok):
    c = cfg(path=str(c4_dir))
    for rank in range(4):  # one row of at least 1 token: 1 row, 4 ranks
        v = build_val_batches(c, tok, micro_batch_size=2, rank=rank, world_size=4, max_tokens=1)
        with pytest.raises(DataSourceError, match="1 rows, fewer than the 4 ranks"):
            list(v)


def test_the_validation_set_does_not_follow_the_training_order_seed(c4_dir, tok):
    """Seeds that reorder training (data.shuffle_seed) are scored on the same tokens."""

    def val_rows(**over):
        v = build_val_batches(
            cfg(path=str(c4_dir), **over),
            tok,
            micro_batch_size=3,
            rank=0,
            world_size=1,
            max_tokens=300,
        )
        return [r for b in v for r in b["input_ids"].tolist()]

    def train_rows(**over):
        loader = build_train_loader(
            cfg(path=str(c4_dir), **over), tok, micro_batch_size=3, rank=0, world_size=1, seed=7
        )
        return next(iter(loader))["input_ids"].tolist()

    assert val_rows(shuffle_seed=1) == val_rows(shuffle_seed=2) == val_rows(shuffle_seed=None)
    assert train_rows(shuffle_seed=1) != train_rows(shuffle_seed=2)


def _sets_up_the_data(rank: int, store: str, over: list[dict], out: dict) -> None:
    """Rank ``rank`` of 2 opens its data (``cfg(**over[rank])``), builds the tokenizer and reads
    the validation set as the trainer does; ``out[rank]`` is what it raised, or its rows'
    lengths."""
    import torch.distributed as torch_dist

    from train import distributed
    from train.distributed import DistInfo

    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    distributed.init_distributed(DistInfo(rank=rank, world_size=2), torch.device("cpu"))
    try:
        c = cfg(**over[rank])
        source = corpus.open_sources_on_ranks(c, is_main=rank == 0)
        tok = tokenizer.build_tokenizer_on_ranks(c, 32000, source, local_rank=rank)
        val = build_val_batches(
            c, tok, micro_batch_size=2, rank=rank, world_size=2, max_tokens=10**9, source=source
        )
        out[rank] = [int(n) for batch in val for n in batch["attention_mask"].sum(1)]
    except Exception as exc:
        out[rank] = f"{type(exc).__name__}: {exc}"
    finally:
        distributed.shutdown()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("case", "rank_0_gets", "rank_1_gets"),
    [
        ("the same data", "its rows", "its rows"),
        ("rank 1 lacks a validation file", "its rows", "its rows"),  # rank 0 reads the set
        ("rank 1 has no data", r"rank 1 failed: .*node_1", r"DataSourceError: .*node_1"),
        ("rank 1 has no tokenizer", "rank 1 failed: cannot load tokenizer", "cannot load token"),
        # the source's proof on opening it (train/data/corpus.py) finds the unreadable shards first
        (
            "rank 0 has no usable validation text",
            "0 of the first .* hold usable",
            "rank 0 failed: .*usable",
        ),
    ],
)
def test_two_ranks_score_one_validation_set_or_both_stop(
    c4_dir, tok, cache_dir, tmp_path, case, rank_0_gets, rank_1_gets
):
    """Rank 0 reads the validation set and each rank gets its rows r::2, so the ranks score one
    set whatever each could read; and an error on one rank stops both (raised alone, it would
    leave the other waiting in a collective until its timeout)."""
    import shutil

    import torch.multiprocessing as mp

    nodes = [tmp_path / "node_0", tmp_path / "node_1"]
    for node in nodes:
        shutil.copytree(c4_dir, node)
    if case == "rank 1 lacks a validation file":
        next(nodes[1].glob("en/c4-validation.*.json.gz")).unlink()
    if case == "rank 1 has no data":
        shutil.rmtree(nodes[1])
    if case == "rank 0 has no usable validation text":
        for shard in nodes[0].glob("en/c4-validation.*.json.gz"):
            shard.write_bytes(b"not gzip")
    over = [
        {"path": str(node), "tokenizer_cache_dir": str(cache_dir), "tokenizer_fallback": False}
        for node in nodes
    ]
    if case == "rank 1 has no tokenizer":
        over[1]["tokenizer"] = str(tmp_path / "no-such-tokenizer")
    with mp.Manager() as manager:
        out = manager.dict()
        store = f"file://{tmp_path / 'store'}"
        mp.spawn(_sets_up_the_data, args=(store, over, out), nprocs=2, join=True)
        got = dict(out)
    if rank_0_gets == "its rows":
        whole = build_val_batches(
            cfg(path=str(c4_dir)), tok, micro_batch_size=2, rank=0, world_size=1, max_tokens=10**9
        )
        lengths = [int(n) for batch in whole for n in batch["attention_mask"].sum(1)]
        assert got == {0: lengths[0::2], 1: lengths[1::2]}
    else:
        assert re.search(rank_0_gets, str(got[0])), got
        assert re.search(rank_1_gets, str(got[1])), got
