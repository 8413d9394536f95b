"""Tokenizers: T5 (the protocol's), a local one, or a SentencePiece model the project trains.

`build_tokenizer(cfg, vocab_size, source)` resolves `data.tokenizer` in this order and logs
one line saying which tokenizer is in use:

1. `spm` (or `sentencepiece`): the project's SentencePiece model, trained on the training text.
2. an existing path: a `.model` SentencePiece file, or a folder `AutoTokenizer` can load.
3. a hub name (`t5-base`): from the local HF cache, else from the hub when it is reachable.
4. when 3 fails and `data.tokenizer_fallback` is true: the project's SentencePiece model, with a
   warning (so `data=embedded` works on a machine that has never seen the internet).

Vocabulary decision: the model's embedding has `vocab_size` rows (32000 for the paper's LLaMA
configs) while t5-base has 32100 ids; ids 32000-32099 are the `<extra_id_*>` sentinels that plain
text never produces (it would have to contain the literal string `<extra_id_5>`). Ids at or above
`vocab_size` are accepted only if they are such added tokens, and `encode` maps them to the unk id,
so every id fits the model. A tokenizer whose ordinary vocabulary is larger than the model's is
refused at start-up. The project-trained SentencePiece model has at most
`min(vocab_size, data.spm_vocab_size)` pieces (unigram, like T5; pad 0, EOS 1, unk 2, no BOS, the
T5 layout), trained single-threaded on a fixed prefix of the training text so that it is
deterministic, and cached under `data.tokenizer_cache_dir` (default `$FOAM_CACHE_DIR` or
`~/.cache/foam`) by a hash of its training text and settings.

A tokenizer with fewer than ``SMALL_TOKENIZER_SHARE`` of the model's vocabulary (a paper-size model,
32000 entries, with the project's SentencePiece model of a few thousand pieces) is refused unless
``data.allow_small_tokenizer`` is true: most of the embedding would never be trained, and the run
would not be the paper's. ``data=embedded``, whose text cannot fill a large vocabulary, allows it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from train.data.corpus import (
    Source,
    count_skip,
    describe_skips,
    hub_reachable,
    open_sources,
)
from train.errors import DataSourceError
from train.schema import DataConfig

logger = logging.getLogger(__name__)

SPM_NAMES = ("spm", "sentencepiece")
SPM_TRAIN_CHARS = 2_000_000  # enough text for an 8K-piece model; a few seconds on one core
SPM_MAX_LINE_BYTES = 16384
SMALL_TOKENIZER_SHARE = 0.5


def default_cache_dir() -> Path:
    return Path(os.environ.get("FOAM_CACHE_DIR", "~/.cache/foam")).expanduser()


class Tokenizer:
    """What the data pipeline needs from a tokenizer; ids are always < `vocab_size`.

    `encode(text)` returns the document's ids with EOS appended (T5 appends it too) and no
    truncation: the batcher truncates, keeping EOS last, as HF's `truncation=True` does for T5.
    """

    name: str
    pad_token_id: int
    eos_token_id: int
    unk_token_id: int
    vocab_size: int

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many documents at once (the native tokenizers parallelise this)."""
        out = self._encode_many(texts)
        eos, limit, unk = self.eos_token_id, self.vocab_size, self.unk_token_id
        for ids in out:
            if not ids or ids[-1] != eos:
                ids.append(eos)
            if max(ids) >= limit:
                ids[:] = [i if i < limit else unk for i in ids]
        return out

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (the project's own, or a user's `.model` file)."""

    def __init__(self, model_proto: bytes, name: str, vocab_size: int, num_threads: int = 1):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.name = name
        self.num_threads = max(1, num_threads)
        size = self.sp.get_piece_size()
        if size > vocab_size:
            raise ValueError(
                f"tokenizer {name} has {size} pieces but the model's vocab_size is {vocab_size}; "
                "use a model with a larger vocabulary or a smaller tokenizer"
            )
        self.vocab_size = size
        self.eos_token_id = self.sp.eos_id()
        self.unk_token_id = self.sp.unk_id()
        self.pad_token_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else self.eos_token_id

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), num_threads=self.num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids if i != self.pad_token_id])


class HFTokenizer(Tokenizer):
    """A `transformers` tokenizer (t5-base by default), checked against the model's vocabulary."""

    def __init__(self, tok: Any, name: str, vocab_size: int):
        self.tok = tok
        self.name = name
        tok.model_max_length = 1 << 60  # we truncate ourselves; silence the long-input warning
        size = len(tok)
        added = set(getattr(tok, "added_tokens_decoder", {}) or {})
        unused = [i for i in range(vocab_size, size) if i not in added]
        if unused:
            raise ValueError(
                f"tokenizer {name} has {size} ids and ids {unused[0]}..{size - 1} are ordinary "
                f"vocabulary, but the model's vocab_size is {vocab_size}: use a model with "
                f"vocab_size >= {size} or another tokenizer"
            )
        self.vocab_size = min(size, vocab_size)
        self.eos_token_id = tok.eos_token_id
        if self.eos_token_id is None:
            raise ValueError(f"tokenizer {name} has no EOS token")
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_token_id
        self.unk_token_id = tok.unk_token_id if tok.unk_token_id is not None else self.pad_token_id

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tok(list(texts), add_special_tokens=True, truncation=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------
# SentencePiece training


def spm_training_lines(source: Source, max_chars: int = SPM_TRAIN_CHARS) -> list[str]:
    """A fixed prefix of the training split (unshuffled, so identical on every rank and run)."""
    lines: list[str] = []
    total = 0
    skipped: dict[str, int] = {}
    for rec in source.train:
        text = rec.get("text")
        if not isinstance(text, str):
            count_skip(skipped, rec)
            continue
        for line in text.splitlines():
            line = line.strip()
            if line and len(line.encode()) <= SPM_MAX_LINE_BYTES:
                lines.append(line)
                total += len(line)
        if total >= max_chars:
            break
    if not lines:
        raise DataSourceError(
            f"{source.label}: no training text to train the SentencePiece tokenizer on: "
            f"{describe_skips(skipped)}"
        )
    return lines


def train_sentencepiece(lines: list[str], vocab_size: int) -> bytes:
    """Train a T5-layout unigram model; single-threaded and unshuffled, hence deterministic."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,  # small corpora cannot fill a large vocabulary
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=0.9995,
        max_sentence_length=SPM_MAX_LINE_BYTES,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    return buf.getvalue()


def project_sentencepiece(
    cfg: DataConfig, vocab_size: int, source: Source
) -> tuple[bytes, Path, bool]:
    """The cached project model for this training text, training it on a cache miss.

    Returns (model bytes, cache path, whether it was trained now). Several ranks may train at
    once: training is deterministic and the write is atomic, so they agree.
    """
    import sentencepiece

    pieces = min(vocab_size, cfg.spm_vocab_size)
    lines = spm_training_lines(source)
    digest = hashlib.sha256()
    digest.update(f"unigram|{pieces}|{sentencepiece.__version__}|".encode())
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    cache_dir = Path(cfg.tokenizer_cache_dir or default_cache_dir()).expanduser()
    path = cache_dir / "tokenizers" / f"spm-unigram{pieces}-{digest.hexdigest()[:16]}.model"
    if path.is_file():
        return path.read_bytes(), path, False
    try:
        proto = train_sentencepiece(lines, pieces)
    except RuntimeError as err:  # e.g. fewer pieces than the text has distinct characters
        reason = str(err).split("] ", 1)[-1].strip() or str(err).strip()
        raise DataSourceError(
            f"data.spm_vocab_size={cfg.spm_vocab_size}: SentencePiece cannot train {pieces} "
            f"pieces on this text ({reason})"
        ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(proto)
    os.replace(tmp, path)
    return proto, path, True


# ---------------------------------------------------------------------------------------------
# Entry point


def _load_hf(name: str, local_only: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, local_files_only=local_only)


def _from_project_spm(
    cfg: DataConfig, vocab_size: int, why: str, source: Source | None
) -> Tokenizer:
    t0 = time.perf_counter()
    proto, path, trained = project_sentencepiece(cfg, vocab_size, source or open_sources(cfg))
    threads = max(1, cfg.num_workers)
    tok = SentencePieceTokenizer(proto, f"spm:{path.name}", vocab_size, num_threads=threads)
    how = f"trained in {time.perf_counter() - t0:.1f} s" if trained else "loaded from cache"
    msg = f"data: tokenizer = project SentencePiece ({tok.vocab_size} pieces, {how}, {path})"
    if why:
        logger.warning("%s; %s", msg, why)
    else:
        logger.info("%s", msg)
    return tok


def build_tokenizer(cfg: DataConfig, vocab_size: int, source: Source | None = None) -> Tokenizer:
    """The tokenizer named by `data.tokenizer`; every id it produces is < `vocab_size`, and it
    fills at least ``SMALL_TOKENIZER_SHARE`` of them unless ``data.allow_small_tokenizer``.

    The project's SentencePiece model trains on ``source`` (the run's opened source; opened here
    when not given and needed)."""
    tokenizer = _resolve(cfg, vocab_size, source)
    if not cfg.allow_small_tokenizer and tokenizer.vocab_size < SMALL_TOKENIZER_SHARE * vocab_size:
        raise DataSourceError(
            f"data.allow_small_tokenizer: tokenizer {tokenizer.name} has {tokenizer.vocab_size} "
            f"ids for the model's {vocab_size}-entry vocabulary, so most of the embedding would "
            "never train; give the model its tokenizer (t5-base: cache it once from the hub, or "
            "data.tokenizer=/path/to/t5-base) or set data.allow_small_tokenizer=true"
        )
    return tokenizer


def _resolve(cfg: DataConfig, vocab_size: int, source: Source | None) -> Tokenizer:
    """``data.tokenizer`` resolved in the order of the module docstring."""
    spec = cfg.tokenizer
    if spec.lower() in SPM_NAMES:
        return _from_project_spm(cfg, vocab_size, "", source)
    path = Path(spec).expanduser()
    if path.is_file():
        tok = SentencePieceTokenizer(path.read_bytes(), str(path), vocab_size)
        logger.info("data: tokenizer = SentencePiece file %s (%d pieces)", path, tok.vocab_size)
        return tok
    if path.is_dir():
        tok = HFTokenizer(_load_hf(str(path), local_only=True), str(path), vocab_size)
        logger.info("data: tokenizer = %s (local, %d ids used)", path, tok.vocab_size)
        return tok
    error: Exception | None = None
    for local_only in (True, False):
        if not local_only and not hub_reachable():
            error = error or OSError("hub unreachable")
            break
        try:
            tok = HFTokenizer(_load_hf(spec, local_only), spec, vocab_size)
        except (OSError, ValueError) as exc:  # not cached / not on the hub / too big
            if isinstance(exc, ValueError) and "vocab_size" in str(exc):
                raise
            error = exc
            continue
        logger.info(
            "data: tokenizer = %s (Hugging Face, %d ids; ids >= %d map to unk)",
            spec,
            len(tok.tok),
            tok.vocab_size,
        )
        return tok
    if cfg.tokenizer_fallback:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        why = f"fallback: {spec} unavailable ({reason})"
        return _from_project_spm(cfg, vocab_size, why, source)
    raise DataSourceError(
        f"cannot load tokenizer {spec!r} ({error}). Connect to the hub once to cache it, give a "
        "local path (data.tokenizer=/path/to/t5-base), or use data.tokenizer=spm "
        "(or data.tokenizer_fallback=true) for the project's SentencePiece model."
    )


def build_tokenizer_on_ranks(
    cfg: DataConfig, vocab_size: int, source: Source, *, local_rank: int
) -> Tokenizer:
    """``build_tokenizer`` on every rank of a run, the first rank of each node first.

    The others then load what it cached instead of all asking the hub at once (or all training
    the project's SentencePiece model). Every rank must end with the same tokenizer: a rank whose
    hub request failed would otherwise fall back alone and train on other token ids. A rank that
    cannot build one stops every rank (collective), instead of leaving them waiting for it.
    """
    from train.distributed import all_gather_object, barrier_for_slow_io, failure_stops_every_rank

    if local_rank != 0:
        barrier_for_slow_io()
    with failure_stops_every_rank(DataSourceError):
        try:
            tokenizer = build_tokenizer(cfg, vocab_size, source)
        finally:  # the node's other ranks wait for this one, built or not
            if local_rank == 0:
                barrier_for_slow_io()
    check_same_tokenizer(all_gather_object(tokenizer.name, slow_io=True))
    return tokenizer


def check_same_tokenizer(names: Sequence[str]) -> None:
    """Refuse a run whose ranks (``names[rank]``) did not all load the same tokenizer."""
    if len(set(names)) > 1:
        by_name: dict[str, list[int]] = {}
        for rank, name in enumerate(names):
            by_name.setdefault(name, []).append(rank)
        ranks = "; ".join(f"{name} on ranks {r}" for name, r in by_name.items())
        raise DataSourceError(
            f"the ranks loaded different tokenizers ({ranks}); give every rank the same one "
            "(data.tokenizer=/path/to/it, or data.tokenizer_fallback=false to fail instead)"
        )
