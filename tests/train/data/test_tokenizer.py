"""train/data/tokenizer.py: the SentencePiece fallback (trained, cached, deterministic), tokenizers
too small for the vocabulary refused, T5's sentinel ids, one tokenizer on every rank."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from tests.helpers.data_pipeline import cfg
from train.data import corpus, tokenizer
from train.data.tokenizer import build_tokenizer
from train.errors import DataSourceError


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
