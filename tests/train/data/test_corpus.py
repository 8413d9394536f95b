"""train/data/corpus.py: bad records skipped and counted, unusable sources refused at start-up in
one line, held-out splits, the embedded corpus, and the data options (configs/data) as the one
table of sources."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import re
from collections import Counter

import pytest
from omegaconf.errors import ConfigKeyError

from tests.helpers.data_pipeline import REPO, cfg, random_bytes_file, take, write_c4
from train.data import corpus
from train.data.loader import build_train_loader
from train.data.tokenizer import build_tokenizer
from train.data.val_batches import build_val_batches
from train.errors import DataSourceError
from train.schema import DataConfig, data_config, register_configs


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
