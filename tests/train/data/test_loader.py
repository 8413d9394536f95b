"""train/data/loader.py: the batch format, rank shards, epochs, exact resume, the proof that one
pass fills a micro-batch, and data=c4 as the local pipeline with the hub's arguments."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from tests.helpers.data_pipeline import assert_same, cfg, stream, take
from train.data import corpus, tokenizer
from train.data import loader as data
from train.data.loader import build_train_loader
from train.data.val_batches import build_val_batches
from train.errors import ConfigError, DataSourceError


@pytest.mark.parametrize("pack", [False, True])
def test_batch_format_padding_and_labels(c4_dir, tok, pack):
    c = cfg(path=str(c4_dir), pack=pack)
    loader = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=1, seed=0)
    for batch in take(loader, 6):
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        assert ids.shape == labels.shape == mask.shape == (4, 32)
        assert ids.dtype == labels.dtype == mask.dtype == torch.long
        assert int(ids.max()) < tok.vocab_size
        assert torch.equal(labels[mask == 1], ids[mask == 1])  # aligned, not shifted
        assert bool((labels[mask == 0] == -100).all())
        if pack:
            assert bool((mask == 1).all())
            continue
        lens = mask.sum(1)
        for r in range(4):
            n = int(lens[r])
            assert bool((mask[r, :n] == 1).all()) and bool((ids[r, n:] == tok.pad_token_id).all())
            assert int(ids[r, n - 1]) == tok.eos_token_id  # EOS last, also when truncated
    assert loader.stats["truncated"] > 0 or pack
    assert loader.stats["skipped"] == 0


def test_pack_concatenates_documents_in_order(c4_dir, tok):
    c = cfg(path=str(c4_dir), pack=True, shuffle_buffer=0)
    loader = build_train_loader(c, tok, micro_batch_size=2, rank=0, world_size=1, seed=0)
    rows = torch.cat([b["input_ids"] for b in take(loader, 5)]).flatten().tolist()
    texts = [r["text"] for r in stream(c, rank=0, world_size=1)]
    expected = [i for t in texts for i in tok.encode(t)]
    assert rows == expected[: len(rows)]


@pytest.mark.parametrize(
    "world_size", [2, 3, 4]
)  # 4 files: whole shards for 2 and 4, records for 3
def test_rank_shards_disjoint_and_complete(c4_dir, world_size):
    c = cfg(path=str(c4_dir))
    everything = sorted(r["text"] for r in stream(c, rank=0, world_size=1))
    parts = [
        [r["text"] for r in stream(c, rank=k, world_size=world_size)] for k in range(world_size)
    ]
    flat = [t for p in parts for t in p]
    assert len(flat) == len(set(flat)) == 120  # disjoint
    assert sorted(flat) == everything  # complete
    assert all(len(p) > 0 for p in parts)


def test_rank_loaders_differ(c4_dir, tok):
    c = cfg(path=str(c4_dir))
    first = [
        next(build_train_loader(c, tok, micro_batch_size=4, rank=r, world_size=2, seed=0))
        for r in range(2)
    ]
    assert not torch.equal(first[0]["input_ids"], first[1]["input_ids"])


@pytest.mark.parametrize("world_size", [1, 2])
def test_epochs_restart_and_reshuffle(c4_dir, tok, world_size):
    """Also across ranks: split_dataset_by_node builds a new dataset, which must get the epoch."""
    c = cfg(path=str(c4_dir))
    loader = build_train_loader(c, tok, micro_batch_size=10, rank=0, world_size=world_size, seed=0)
    steps = 12 // world_size  # 120 documents = one epoch, shared by the ranks
    epoch0 = take(loader, steps)
    assert loader.stats["epoch"] == 0 and loader.stats["documents"] == 120 // world_size
    epoch1 = take(loader, steps)
    assert loader.stats["epoch"] == 1
    key = lambda bs: sorted(tuple(r) for b in bs for r in b["input_ids"].tolist())  # noqa: E731
    assert key(epoch0) == key(epoch1)  # same documents...
    assert not torch.equal(epoch0[0]["input_ids"], epoch1[0]["input_ids"])  # ...another order


@pytest.mark.parametrize(("pack", "workers"), [(False, 0), (False, 2), (True, 1)])
def test_resume_equals_uninterrupted(c4_dir, tok, pack, workers):
    c = cfg(path=str(c4_dir), pack=pack, num_workers=workers)
    ref = build_train_loader(c, tok, micro_batch_size=7, rank=1, world_size=2, seed=0)
    take(ref, 6)
    state = pickle.loads(pickle.dumps(ref.state_dict()))  # plain data, checkpointable
    json.dumps(state)
    expected = take(ref, 14)  # crosses an epoch boundary (60 documents per rank)
    resumed = build_train_loader(c, tok, micro_batch_size=7, rank=1, world_size=2, seed=0)
    resumed.load_state_dict(state)
    assert_same(take(resumed, 14), expected)
    assert resumed.stats == ref.stats
    ref.close()
    resumed.close()


def test_resume_refuses_other_settings(c4_dir, tok):
    c = cfg(path=str(c4_dir))
    a = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=2, seed=0)
    next(a)
    b = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=4, seed=0)
    with pytest.raises(ConfigError, match=r"trainer\.resume: .*world_size"):
        b.load_state_dict(a.state_dict())


def test_a_position_saved_before_the_split_mode_was_recorded_resumes(c4_dir, tok):
    """Checkpoints of earlier versions lack the (derived) split mode: same world size resumes."""
    c = cfg(path=str(c4_dir))
    a = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=2, seed=0)
    take(a, 2)
    state = a.state_dict()
    old = {**state, "config": {k: v for k, v in state["config"].items() if k != "split"}}
    b = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=2, seed=0)
    b.load_state_dict(old)
    assert_same(take(b, 3), take(a, 3))
    a.close()
    b.close()


def test_one_pass_must_fill_a_micro_batch_and_the_proof_batch_is_the_first(tmp_path, tok):
    three = tmp_path / "three.jsonl"
    three.write_text("".join(json.dumps({"text": f"document {i} text"}) + "\n" for i in range(3)))
    (tmp_path / "three_val.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    c = cfg(path=str(tmp_path), val_fraction=None)
    loader = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=1, seed=0)
    with pytest.raises(DataSourceError, match="one pass over this rank's training data"):
        loader.check_one_pass_fills()
    proven = build_train_loader(c, tok, micro_batch_size=3, rank=0, world_size=1, seed=0)
    proven.check_one_pass_fills()
    assert proven.state_dict()["records"] == 0  # the proof batch is not handed out yet
    plain = build_train_loader(c, tok, micro_batch_size=3, rank=0, world_size=1, seed=0)
    assert_same(take(proven, 2), take(plain, 2))


class _EosOnly(tokenizer.Tokenizer):
    name, pad_token_id, eos_token_id, unk_token_id, vocab_size = "eos-only", 0, 1, 2, 8

    def _encode_many(self, texts):
        return [[] for _ in texts]


def test_a_validation_set_with_nothing_to_predict_is_refused(tok):
    source = corpus.Source(None, None, "data=x", validation_sample=("a", "b"))
    with pytest.raises(DataSourceError, match="data=x: the first 2 validation documents"):
        data.check_scoreable(source, _EosOnly(), seq_len=32, pack=False)
    data.check_scoreable(source, _EosOnly(), seq_len=32, pack=True)  # packed: one row of 2
    data.check_scoreable(source, tok, seq_len=32, pack=False)


def test_c4_mode_is_local_pipeline_with_hub_arguments(c4_dir, tok, monkeypatch):
    """data=c4 calls load_dataset("allenai/c4", "en", split=..., streaming=True); everything after
    is the local pipeline: fed the same files via the hub's json builder, batches are identical."""
    import datasets

    real_load = datasets.load_dataset
    calls = []

    def fake_load(*args, **kwargs):
        calls.append((args, kwargs))
        split = kwargs["split"]
        files = sorted(str(p) for p in (c4_dir / "en").glob(f"c4-{split}.*.json.gz"))
        return real_load("json", data_files={split: files}, split=split, streaming=True)

    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    for rank in range(2):
        hub = build_train_loader(
            cfg(name="c4"), tok, micro_batch_size=5, rank=rank, world_size=2, seed=0
        )
        loc = build_train_loader(
            cfg(path=str(c4_dir)), tok, micro_batch_size=5, rank=rank, world_size=2, seed=0
        )
        assert_same(take(hub, 8), take(loc, 8))
    hub_val = build_val_batches(
        cfg(name="c4"), tok, micro_batch_size=4, rank=0, world_size=1, max_tokens=300
    )
    loc_val = build_val_batches(
        cfg(path=str(c4_dir)), tok, micro_batch_size=4, rank=0, world_size=1, max_tokens=300
    )
    assert_same(list(hub_val), list(loc_val))
    assert calls[0] == (("allenai/c4", "en"), {"split": "train", "streaming": True})
    assert (("allenai/c4", "en"), {"split": "validation", "streaming": True}) in calls


def test_module_exports():
    """The train loader's module and the evaluation sets' module each name what they export."""
    from train.data import val_batches

    assert set(data.__all__) == {
        "build_train_loader",
        "TrainLoader",
        "prove_data",
    }
    assert all(hasattr(data, name) for name in data.__all__)
    assert callable(val_batches.build_val_batches) and isinstance(val_batches.ValBatches, type)
