"""Data pipeline: batch format, rank shards, exact resume, bad input, tokenizers, hub arguments.

Offline: tiny Shakespeare from the shared data folder and C4-format json.gz fixtures written here.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf.errors import ConfigKeyError

from train.data import corpus, tokenizer
from train.data import loader as data
from train.data.loader import build_train_loader, rank_stream
from train.data.tokenizer import build_tokenizer
from train.data.val_batches import build_val_batches
from train.errors import ConfigError, DataSourceError
from train.schema import DataConfig, data_config, register_configs

REPO = Path(__file__).resolve().parents[3]
SHAKESPEARE = Path(__file__).resolve().parents[4] / "shared/data/tinyshakespeare.txt"
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
    if not SHAKESPEARE.is_file():
        pytest.skip(f"{SHAKESPEARE} is absent (the shared data folder is not mounted)")
    return SHAKESPEARE


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


# ------------------------------------------------------------------------------------- format


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


# ------------------------------------------------------------------------------------- shards


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


# ------------------------------------------------------------------------------------- resume


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


# ------------------------------------------------------------------------------------- bad input


def test_corrupt_input_is_skipped_and_counted(tmp_path, tok):
    root = tmp_path / "bad"
    write_c4(root, "train", n_files=2, n_docs=10)
    good = [
        json.dumps({"text": f"a good validation document number {i}"}).encode() for i in range(15)
    ]
    lines = [
        *good[5:],  # most records are usable, or the split is refused (check_usable)
        good[0],
        b"{not json",
        json.dumps({"url": "no text field"}).encode(),
        json.dumps({"text": "   "}).encode(),
        json.dumps({"text": None}).encode(),
        good[1],
        b'{"text": "caf\xe9 latin-1 bytes"}',
        b"[1, 2, 3]",
        b"",
        good[2],
    ]
    with gzip.open(root / "en" / "c4-validation.00000-of-00004.json.gz", "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    with gzip.open(root / "en" / "c4-validation.00001-of-00004.json.gz", "wb") as fh:
        fh.write(b"")  # empty after decompression
    (root / "en" / "c4-validation.00002-of-00004.json").write_bytes(b"")  # empty file
    blob = gzip.compress(b"\n".join(good[3:]) + b"\n")
    (root / "en" / "c4-validation.00003-of-00004.json.gz").write_bytes(blob[: len(blob) // 2])
    c = cfg(path=str(root))
    val = build_val_batches(c, tok, micro_batch_size=2, rank=0, world_size=1, max_tokens=10**9)
    n_rows = sum(b["input_ids"].shape[0] for b in val)
    s = val.stats
    assert n_rows == s["documents"] == 13
    assert s["skipped_bad_json"] == 2 and s["skipped_no_text"] == 3 and s["skipped_bad_utf8"] == 1
    assert s["skipped_empty_file"] == 2 and s["skipped_bad_file"] == 1
    assert s["skipped"] == 9
    # training data next to it is unaffected
    loader = build_train_loader(c, tok, micro_batch_size=4, rank=0, world_size=1, seed=0)
    take(loader, 3)
    assert loader.stats["skipped"] == 0


def test_a_file_without_one_usable_record_names_the_path_and_the_skips(tmp_path, tok):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n" * 5 + json.dumps({"url": "no text"}) + "\n")
    c = cfg(path=str(bad))
    # 6 bad records, of which val_fraction=0.1 holds some out for validation
    message = rf"data\.path={re.escape(str(bad))}: 0 of the first \d train records hold usable "
    message += r"text \(\d records skipped \(bad_json: \d"
    with pytest.raises(DataSourceError, match=message):
        build_train_loader(c, tok, micro_batch_size=2, rank=0, world_size=1, seed=0)
    with pytest.raises(DataSourceError, match=message):
        build_tokenizer(cfg(path=str(bad), tokenizer="spm"), 32000)


def test_missing_path_and_unreachable_hub_fail_at_startup(tmp_path, tok, monkeypatch):
    with pytest.raises(DataSourceError, match="data=embedded"):
        build_train_loader(
            cfg(path=str(tmp_path / "nope")), tok, micro_batch_size=2, rank=0, world_size=1, seed=0
        )
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataSourceError, match=r"data=local data\.path=DIR"):
        build_train_loader(cfg(name="c4"), tok, micro_batch_size=2, rank=0, world_size=1, seed=0)

    def refuse(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/c4' on the Hub")

    import datasets

    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", refuse)
    with pytest.raises(DataSourceError, match="data=embedded"):
        build_val_batches(
            cfg(name="c4"), tok, micro_batch_size=2, rank=0, world_size=1, max_tokens=10
        )


def random_bytes_file(path: Path, size: int = 200_000) -> Path:
    path.write_bytes(random.Random(0).randbytes(size))
    return path


def test_a_corpus_of_mostly_undecodable_records_is_refused_with_the_counts(tmp_path):
    """Random bytes: a few lines decode by chance (usable on their own), most do not."""
    garbage = random_bytes_file(tmp_path / "garbage.txt")
    train = corpus.open_source(cfg(path=str(garbage)), "train")
    usable = sum(corpus.is_usable(r["text"]) for r in train)
    assert usable > 0  # which is why a check of "any usable text" would let it through
    with pytest.raises(DataSourceError) as err:
        corpus.open_sources(cfg(path=str(garbage)))
    message = str(err.value)
    assert re.match(rf"data\.path={re.escape(str(garbage))}: \d+ of the first \d+ train", message)
    assert "bad_utf8: " in message and "at least 50% must" in message


def test_a_split_half_usable_passes_and_yields_its_first_usable_texts(tmp_path):
    records = [{"text": "kept"}, {"text": None, "error": "bad_json"}, {"text": "also kept"}]
    assert corpus.check_usable(records * 2, "x", "validation") == ("kept", "also kept") * 2
    with pytest.raises(DataSourceError, match="1 of the first 3 train records"):
        corpus.check_usable([records[0], records[1], records[1]], "x", "train")


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


# ------------------------------------------------------------------------------------- c4 == local


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


# ------------------------------------------------------------------------------------- validation


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


def test_shakespeare_txt_with_held_out_fraction(shakespeare, tok):
    c = cfg(path=str(shakespeare), val_fraction=0.1)
    train = [r["text"] for r in corpus.open_source(c, "train")]
    val = [r["text"] for r in corpus.open_source(c, "validation")]
    assert 0.07 < len(val) / (len(train) + len(val)) < 0.13
    assert len(train) + len(val) > 5000
    everything = [r["text"] for r in corpus.read_file_records(shakespeare)]
    assert Counter(train) + Counter(val) == Counter(everything)  # a partition of the records
    loader = build_train_loader(c, tok, micro_batch_size=8, rank=0, world_size=1, seed=0)
    assert next(loader)["input_ids"].shape == (8, 32)


def test_embedded_corpus_is_deterministic_and_split():
    docs = corpus.embedded_documents()
    assert len(docs) > 300 and docs == corpus.embedded_documents()
    c = cfg(name="embedded")
    train = [r["text"] for r in corpus.open_source(c, "train")]
    val = [r["text"] for r in corpus.open_source(c, "validation")]
    assert val and Counter(train) + Counter(val) == Counter(text for _, text in docs)


# ------------------------------------------------------------------------------------- tokenizers


def test_sentencepiece_fallback_trains_caches_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda timeout=3.0: False)

    def no_hf(name, local_only):
        raise OSError(f"{name} is not cached")

    monkeypatch.setattr(tokenizer, "_load_hf", no_hf)
    c = cfg(name="embedded", tokenizer="t5-base", tokenizer_cache_dir=str(tmp_path / "a"))
    t0 = time.perf_counter()
    tok = build_tokenizer(c, 32000)
    assert time.perf_counter() - t0 < 30
    assert tok.name.startswith("spm:") and tok.vocab_size <= 8192
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)  # the T5 layout
    text = (
        "Comparisons can be chained arbitrarily, e.g. x < y <= z is equivalent to x < y and y <= z."
    )
    ids = tok.encode(text)
    assert ids[-1] == tok.eos_token_id and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    model = next((tmp_path / "a" / "tokenizers").glob("*.model"))
    # deterministic: a second training elsewhere gives the same bytes; a rebuild hits the cache
    again = build_tokenizer(dataclasses.replace(c, tokenizer_cache_dir=str(tmp_path / "b")), 32000)
    assert next((tmp_path / "b" / "tokenizers").glob("*.model")).read_bytes() == model.read_bytes()
    assert again.encode(text) == ids
    with pytest.raises(DataSourceError, match="tokenizer=spm"):
        build_tokenizer(dataclasses.replace(c, tokenizer_fallback=False), 32000)


def test_a_tokenizer_far_smaller_than_the_vocabulary_is_refused_unless_allowed(cache_dir):
    """The embedded text fills a few thousand pieces: enough for llama_2m's 4096, not for 32000."""
    c = cfg(name="embedded", tokenizer_cache_dir=str(cache_dir), allow_small_tokenizer=False)
    with pytest.raises(DataSourceError, match=r"data\.allow_small_tokenizer: tokenizer "):
        build_tokenizer(c, 32000)
    assert build_tokenizer(c, 4096).vocab_size > 4096 * tokenizer.SMALL_TOKENIZER_SHARE
    assert (
        build_tokenizer(dataclasses.replace(c, allow_small_tokenizer=True), 32000).vocab_size
        < 16000
    )


@pytest.mark.parametrize(("pieces", "reason"), [(16, "smaller than required_chars"), (0, "> (0)")])
def test_a_piece_count_sentencepiece_cannot_train_is_a_config_error(cache_dir, pieces, reason):
    """Fewer pieces than the text has characters (or none) is one line naming the key, not
    SentencePiece's RuntimeError."""
    c = cfg(name="embedded", tokenizer_cache_dir=str(cache_dir), spm_vocab_size=pieces)
    with pytest.raises(
        DataSourceError, match=rf"data\.spm_vocab_size={pieces}: .*{re.escape(reason)}"
    ):
        build_tokenizer(c, 4096)


def test_spm_round_trips_shakespeare(shakespeare, cache_dir):
    tok = build_tokenizer(cfg(path=str(shakespeare), tokenizer_cache_dir=str(cache_dir)), 32000)
    text = shakespeare.read_text(encoding="utf-8")[:2000]
    for para in text.split("\n\n"):
        if para.strip():
            assert " ".join(tok.decode(tok.encode(para)).split()) == " ".join(para.split())


class _StubHF:
    """Looks like a T5 tokenizer to HFTokenizer: 32000 text ids + 100 sentinel ids."""

    def __init__(self, size: int, added: range):
        self.size, self.added_tokens_decoder = size, {i: f"<extra_id_{i}>" for i in added}
        self.eos_token_id, self.pad_token_id, self.unk_token_id = 1, 0, 2

    def __len__(self) -> int:
        return self.size

    def __call__(self, texts, add_special_tokens=True, truncation=False):
        return {"input_ids": [[5, 32000, 32099, 7, 1] for _ in texts]}


def test_t5_sentinel_ids_map_to_unk_and_big_vocab_is_refused():
    t5 = tokenizer.HFTokenizer(_StubHF(32100, range(32000, 32100)), "stub-t5", 32000)
    assert t5.vocab_size == 32000
    assert t5.encode("x <extra_id_0> <extra_id_99> y") == [5, 2, 2, 7, 1]
    assert (
        tokenizer.HFTokenizer(_StubHF(32100, range(32000, 32100)), "t5", 32100).vocab_size == 32100
    )
    with pytest.raises(ValueError, match="vocab_size"):
        tokenizer.HFTokenizer(_StubHF(50257, range(50256, 50257)), "gpt2-like", 32000)


# ------------------------------------------------------------------------------------- configs


def test_data_options_compose_onto_the_schema_defaults(c4_dir, tok):
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        composed = {
            name: compose("config", overrides=[f"data={name}", f"data.path={c4_dir}"]).data
            for name in ("c4", "local", "embedded")
        }
    for name, c in composed.items():
        assert (REPO / "configs/data" / f"{name}.yaml").read_text().startswith("# @package data")
        assert c.name == name
        assert (c.seq_len, c.pack, c.tokenizer, c.shuffle_seed) == (256, False, "t5-base", 42)
    assert (composed["embedded"].val_fraction, composed["local"].val_fraction) == (0.1, 0.01)
    c = data_config(composed["local"])
    c.seq_len, c.num_workers = 32, 0
    loader = build_train_loader(c, tok, micro_batch_size=2, rank=0, world_size=1, seed=0)
    assert next(loader)["input_ids"].shape == (2, 32)
    with pytest.raises(ConfigKeyError, match="seqlen"):
        data_config({**dataclasses.asdict(c), "seqlen": 32})
    assert DataConfig(name="local").shuffle_buffer == 1000


def test_each_data_option_is_one_entry_of_the_sources_table_and_nothing_else_is_known():
    """``SOURCES`` is the one home of what a ``data.name`` means: each configs/data option has
    exactly one entry, and every reader of the name refuses one that has none in the same line."""
    from train.data.fingerprint import fingerprint

    options = sorted(p.stem for p in (REPO / "configs/data").glob("*.yaml"))
    assert sorted(corpus.SOURCES) == options == ["c4", "embedded", "local"]
    assert [n for n, k in corpus.SOURCES.items() if k.has_test] == ["local"]
    unknown = DataConfig(name="hub2", path="x")
    readers = (
        lambda: corpus.open_source(unknown, "train"),
        lambda: corpus.describe_source(unknown),
        lambda: corpus.open_sources_on_ranks(unknown, is_main=True),
        lambda: fingerprint(unknown),
    )
    for read in readers:
        with pytest.raises(DataSourceError) as err:
            read()
        assert str(err.value) == "data.name='hub2' is unknown: use c4, local or embedded"
    with pytest.raises(DataSourceError, match=r"^data=embedded has no test split: .* data=local "):
        corpus.open_source(DataConfig(name="embedded", val_fraction=0.1), "test")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+model=llama_60m"], "c4"),  # the paper's sizes train on C4 unless told otherwise
        (["+model=qwen_350m", "trainer=single_gpu"], "c4"),
        (["+model=llama_7b"], "c4"),
        (["+model=llama_tiny", "trainer=cpu_debug"], "embedded"),  # the CPU preset names its data
        (["+model=llama_tiny", "trainer=cpu_debug", "data=local"], "local"),  # the command wins
        (["+model=llama_tiny", "data=local", "trainer=cpu_debug"], "local"),
    ],
)
def test_the_data_a_command_trains_on(overrides, expected):
    from hydra import compose, initialize_config_dir

    from train.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        composed = compose("config", overrides=["+optim=foam2", *overrides])
    assert composed.data.name == expected
    assert composed.data.allow_small_tokenizer == (expected == "embedded")


def test_a_file_of_random_bytes_stops_the_run_before_step_1(tmp_path):
    """Through the CLI: one line with the counts, exit 2, no tokenizer trained, no step run."""
    from tests.e2e.test_train_cli import command, one_line_error, run

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
    from tests.e2e.test_train_cli import command, one_line_error, run

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


def _position(rank: int, world_size: int, records: int, carry: list | None = None) -> dict:
    config = {"seq_len": 8, "rank": rank, "world_size": world_size, "split": "records"}
    return {"version": 1, "config": config, "epoch": 0, "records": records, "carry": carry or []}


def test_rederive_position_two_ranks_to_one_and_back():
    from train.data.position import rederive_position

    two = [{**_position(r, 2, 6), "stats": {"records": 6, "tokens": 18}} for r in (0, 1)]
    one = rederive_position(two, {"seq_len": 8, "rank": 0, "world_size": 1, "split": "records"})
    assert (one["records"], one["carry"], one["stats"]["tokens"]) == (12, [], 36)
    back = [{**one, "config": _position(0, 1, 12)["config"]}]
    again = rederive_position(back, {"seq_len": 8, "rank": 1, "world_size": 2, "split": "records"})
    assert again["records"] == 6 and again["stats"]["tokens"] == 0  # counters stay on rank 0


@pytest.mark.parametrize(
    ("saved", "reason"),
    [
        ([_position(0, 2, 6), _position(1, 2, 5)], "different points of the stream"),
        ([_position(0, 2, 6, [[1, 2]]), _position(1, 2, 6, [[3]])], "different points"),
        ([_position(0, 2, 3), _position(1, 2, 3)], "do not split evenly over 4 ranks"),
    ],
)
def test_rederive_position_refuses_what_it_cannot_make_exact(saved, reason):
    from train.data.position import rederive_position

    mine = {"seq_len": 8, "rank": 0, "world_size": 4, "split": "records"}
    if "evenly" not in reason:
        mine["world_size"] = 1
    for s in saved:
        s["stats"] = {}
    with pytest.raises(ValueError, match=reason):
        rederive_position(saved, mine)


def test_ranks_that_loaded_different_tokenizers_are_refused():
    """A rank whose hub request failed would fall back alone: it would train on other token ids."""
    tokenizer.check_same_tokenizer(["t5-base"] * 4)
    with pytest.raises(
        DataSourceError, match=r"t5-base on ranks \[0, 1, 3\]; spm:x on ranks \[2\]"
    ):
        tokenizer.check_same_tokenizer(["t5-base", "t5-base", "spm:x", "t5-base"])


def test_one_process_builds_the_tokenizer_it_would_build_alone(c4_dir, tok, cache_dir):
    c = cfg(path=str(c4_dir), tokenizer_cache_dir=str(cache_dir))
    source = corpus.open_sources(c)
    built = tokenizer.build_tokenizer_on_ranks(c, 32000, source, local_rank=0)
    assert built.name == tok.name and built.encode("the of and") == tok.encode("the of and")


def test_the_hub_is_opened_by_rank_0_alone_and_local_files_by_every_rank(c4_dir, monkeypatch):
    """One hub request per run, not one per rank; but every node checks its own local files."""
    from train import distributed

    c = cfg(path=str(c4_dir))
    local = corpus.open_sources_on_ranks(c, is_main=False)  # one process: no one to tell
    texts = [r["text"] for r in local.validation]
    assert texts == [r["text"] for r in corpus.open_sources(c).validation]
    sent = pickle.loads(pickle.dumps(local))  # what rank 0 would broadcast
    assert [r["text"] for r in sent.validation] == texts

    opened_by = []
    monkeypatch.setattr(corpus, "open_sources", lambda cfg: opened_by.append(cfg.name) or local)
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj: "rank 0's splits")
    assert corpus.open_sources_on_ranks(c, is_main=False) is local and opened_by == ["local"]
    hub = cfg(name="c4", path=None)
    assert corpus.open_sources_on_ranks(hub, is_main=False) == "rank 0's splits"
    assert opened_by == ["local"]  # a rank other than 0 did not open the hub
    assert corpus.open_sources_on_ranks(hub, is_main=True) == "rank 0's splits"
    assert opened_by == ["local", "c4"]


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
