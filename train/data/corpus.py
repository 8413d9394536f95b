"""Where documents come from: the C4 hub stream, files on disk, or the embedded offline corpus.

Every mode ends up as a `datasets.IterableDataset` of records with a `text` field, so the rest of
the pipeline (shuffle with seed 42, split across ranks, tokenize, batch) is one piece of code:
`data=c4` differs from `data=local` only in their entries of ``SOURCES``: how the source is opened
(`load_dataset` arguments for the hub, a robust file reader for disk), described and fingerprinted. The local reader is a `from_generator` dataset whose
shards are the files, in sorted order, like the hub's json builder, so a local C4 mirror is
shuffled and split across ranks with the same shard permutation and shuffle buffer as the hub.

`open_sources` opens both splits once per run; the loaders and the tokenizer iterate them afresh.
It also proves them usable before anything is trained on them (``check_usable``): the first
records of each split must hold text, at least half of them, so a file of random bytes whose few
lines happen to decode stops the run at start-up with the counts instead of training a tokenizer
on those lines.

Bad input never raises mid-run: the reader yields `{"text": None, "error": REASON}` for each
malformed JSON line, record without usable text, line of invalid UTF-8, empty or corrupt file,
and the batcher counts them (`skipped_<reason>` in the loader's stats). A source without a single
usable record, like one that cannot be opened, is a `DataSourceError`: a config error whose one
line names the key (`data.path=...`) and, for bad records, how many were skipped and why.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import re
import socket
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

from train.errors import DataSourceError
from train.schema import DataConfig

logger = logging.getLogger(__name__)

HUB_NAME = "allenai/c4"
HUB_CONFIG = "en"
SPLITS = ("train", "validation", "test")
SKIP_REASONS = ("bad_json", "no_text", "bad_utf8", "empty_file", "bad_file")
TEXT_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".txt", ".txt.gz", ".parquet")
EMBEDDED_SHARDS = 8  # a factor of 1/2/4/8 ranks, so ranks get whole shards like C4's 1024
_VAL_WORDS = re.compile(r"(^|[^a-z])(validation|valid|val|dev)([^a-z]|$)")
_TEST_WORDS = re.compile(r"(^|[^a-z])test([^a-z]|$)")
_HASH_SPACE = 1_000_000
# The start-up proof (check_usable) reads this many records of each split: enough to measure the
# share of usable records, little enough to take a moment even from the hub. Validation held out
# of the training files by hash (val_fraction 1 %) costs 100 training records per validation one.
PROOF_RECORDS = {"train": 1000, "validation": 100}
MIN_USABLE_SHARE = 0.5
VALIDATION_SAMPLE = 8  # usable validation texts kept to prove the set scoreable once tokenized

Record = dict[str, Any]


def _bad(reason: str) -> Record:
    return {"text": None, "error": reason}


def _good(text: Any) -> Record:
    if not is_usable(text):
        return _bad("no_text")
    return {"text": text, "error": None}


def is_usable(text: Any) -> bool:
    """A record's ``text`` that can be trained on: a string that is not all whitespace."""
    return isinstance(text, str) and bool(text.strip())


def is_held_out(key: str, val_fraction: float) -> bool:
    """Deterministic, order-free train/validation assignment of one record (crc32 of its key)."""
    return zlib.crc32(key.encode()) % _HASH_SPACE < val_fraction * _HASH_SPACE


def _role_filter(
    items: Iterator[Record], key: str, role: str, val_fraction: float
) -> Iterator[Record]:
    """Keep the records of one role ('all', 'train', 'val'); index i of file `key` decides."""
    for i, rec in enumerate(items):
        if role == "all" or (is_held_out(f"{key}:{i}", val_fraction) == (role == "val")):
            yield rec


# ---------------------------------------------------------------------------------------------
# Local files


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in sorted(TEXT_SUFFIXES, key=len, reverse=True) if name.endswith(s)), "")


class LocalFiles(NamedTuple):
    train: list[Path]
    validation: list[Path]
    test: list[Path]


def list_local_files(path: str | os.PathLike) -> LocalFiles:
    """Train, validation and test files of a local directory (or one file), sorted by name.

    A C4 mirror keeps its files under `en/`; that folder wins when present. A file whose name
    contains validation/valid/val/dev is validation, one whose name contains test is test (never
    trained on; scored only where ``trainer.test_tokens`` asks), everything else is training data.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise DataSourceError(
            f"data.path={path} does not exist. Point data=local data.path=DIR at a folder of "
            "C4 json.gz / jsonl / txt / parquet files, or use data=embedded (no download) or data=c4."
        )
    if root.is_file():
        files = [root]
    else:
        base = root / HUB_CONFIG if (root / HUB_CONFIG).is_dir() else root
        files = sorted(
            (p for p in base.iterdir() if p.is_file() and _suffix(p)), key=lambda p: p.name
        )
    train, val, test = [], [], []
    for f in files:
        stem = f.name.lower()
        (val if _VAL_WORDS.search(stem) else test if _TEST_WORDS.search(stem) else train).append(f)
    if not train and not val:
        raise DataSourceError(
            f"data.path={path}: no data files under {root} (looked for {', '.join(TEXT_SUFFIXES)}). "
            "Use data=embedded for the offline corpus or data=c4 to stream from the hub."
        )
    return LocalFiles(train, val, test)


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _json_lines(path: Path) -> Iterator[Record]:
    """Records of a JSON-lines file (or one JSON array), one per line, bad lines as markers."""
    with _open_binary(path) as fh:
        first = fh.peek(1)[:1] if hasattr(fh, "peek") else b""
        if first == b"[":
            try:
                rows = json.loads(fh.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                yield _bad("bad_file")
                return
            for row in rows if isinstance(rows, list) else []:
                yield _good(row.get("text")) if isinstance(row, dict) else _bad("bad_json")
            return
        for raw in fh:
            if not raw.strip():
                continue  # blank separator lines are not records
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield _bad("bad_utf8")
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                yield _bad("bad_json")
                continue
            yield _good(row.get("text")) if isinstance(row, dict) else _bad("bad_json")


def _text_blocks(path: Path) -> Iterator[Record]:
    """Documents of a plain-text file: blocks separated by blank lines."""
    block: list[str] = []
    with _open_binary(path) as fh:
        for raw in fh:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield _bad("bad_utf8")
                continue
            if line.strip():
                block.append(line)
            elif block:
                yield _good("".join(block).rstrip("\n"))
                block = []
    if block:
        yield _good("".join(block).rstrip("\n"))


def _parquet_rows(path: Path) -> Iterator[Record]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if "text" not in pf.schema_arrow.names:
        yield _bad("bad_file")
        return
    for batch in pf.iter_batches(columns=["text"], batch_size=1024):
        for text in batch.column(0).to_pylist():
            yield _good(text)


def read_file_records(path: Path) -> Iterator[Record]:
    """All records of one file; an empty or unreadable file yields a single marker."""
    suffix = _suffix(path)
    reader = (
        _parquet_rows
        if suffix == ".parquet"
        else _text_blocks
        if suffix.startswith(".txt")
        else _json_lines
    )
    n = 0
    try:
        for rec in reader(path):
            n += 1
            yield rec
    except (OSError, EOFError, zlib.error, ValueError) as exc:  # truncated gzip, bad parquet...
        logger.warning("data: stopped reading %s after %d records: %s", path, n, exc)
        yield _bad("bad_file")
        return
    if n == 0:
        yield _bad("empty_file")


def _local_records(paths: list[str], role: str, val_fraction: float) -> Iterator[Record]:
    """Generator behind `from_generator`: one shard per file, held-out records by hash."""
    for p in paths:
        path = Path(p)
        items = read_file_records(path)
        if role != "all":
            items = _role_filter(items, path.name, role, val_fraction)
        yield from items


# ---------------------------------------------------------------------------------------------
# Embedded corpus


def embedded_documents() -> list[tuple[str, str]]:
    """(key, text) documents from `pydoc_data.topics`, which ships with every CPython.

    Topics are cut at blank lines into documents of at least ~1000 characters (C4 documents
    average ~2200), giving a few hundred documents; the keys are stable for a Python version.
    """
    from pydoc_data.topics import topics

    docs: list[tuple[str, str]] = []
    for name in sorted(topics):
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", topics[name]) if p.strip()]
        chunk: list[str] = []
        for para in paragraphs:
            chunk.append(para)
            if sum(len(c) for c in chunk) >= 1000:
                docs.append((f"{name}:{len(docs)}", "\n\n".join(chunk)))
                chunk = []
        if chunk:
            docs.append((f"{name}:{len(docs)}", "\n\n".join(chunk)))
    return docs


def _embedded_records(shards: list[int], role: str, val_fraction: float) -> Iterator[Record]:
    docs = embedded_documents()
    for shard in shards:
        for key, text in docs[shard::EMBEDDED_SHARDS]:
            if role == "all" or is_held_out(key, val_fraction) == (role == "val"):
                yield _good(text)


# ---------------------------------------------------------------------------------------------
# Hub


def hub_reachable(timeout: float = 3.0) -> bool:
    """Quick TCP probe of the hub, so an offline machine fails in seconds rather than after the
    ~25-50 s of retries inside `datasets`/`huggingface_hub`. Assumes reachable behind a proxy."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_load_args(cfg: DataConfig, split: str) -> tuple[tuple, dict]:
    """The exact `datasets.load_dataset` call of the benchmark protocol for one split.

    Validation uses `allenai/c4` as training does: the GaLore scripts load validation under the
    legacy name `"c4"`, an older alias of the same data.
    """
    return (cfg.hub_name, cfg.hub_config), {
        "split": "train" if split == "train" else "validation",
        "streaming": True,
    }


def _open_hub(cfg: DataConfig, split: str):
    import datasets

    args, kwargs = hub_load_args(cfg, split)
    advice = (
        "Use data=local data.path=DIR with a local C4 mirror (en/c4-train.*.json.gz), or "
        "data=embedded for the offline corpus."
    )
    if not hub_reachable():
        raise DataSourceError(
            f"data=c4: the Hugging Face hub is unreachable, cannot stream {args[0]}. {advice}"
        )
    try:
        return datasets.load_dataset(*args, **kwargs)
    # Network errors come in many types (ConnectionError, HfHubHTTPError...).
    except Exception as exc:
        raise DataSourceError(
            f"data=c4: could not open {args[0]} {kwargs}: {exc}. {advice}"
        ) from exc


# ---------------------------------------------------------------------------------------------
# Entry point


def open_source(cfg: DataConfig, split: str):
    """The unshuffled, unsplit `IterableDataset` of one split ('train', 'validation' or 'test')
    of the source ``cfg`` describes.

    Only a local mirror has a test split (its ``*test*`` files): C4 on the hub publishes none,
    and the embedded corpus is for smoke tests."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    kind = source_kind(cfg.name)
    if split == "test" and not kind.has_test:
        with_test = " or ".join(f"data={name}" for name, k in SOURCES.items() if k.has_test)
        raise DataSourceError(
            f"data={cfg.name} has no test split: trainer.test_tokens needs {with_test} with test "
            "files (names with 'test', e.g. scripts/make_corpus.py's en/c4-test.*.json.gz)"
        )
    return kind.open_split(cfg, split)


@dataclass(frozen=True)
class Source:
    """Both splits of a data source, each opened once per run (``open_sources``); every epoch and
    the tokenizer iterate them afresh. ``label`` names the source in error messages;
    ``validation_sample`` holds the first usable validation texts (``check_usable``)."""

    train: Any
    validation: Any
    label: str
    validation_sample: tuple[str, ...] = ()


def describe_source(cfg: DataConfig) -> str:
    """What a run trains on, where it comes from and how it is tokenized: the first lines of every
    run's log (``train/pretrain.py``), so that a run on the wrong corpus is seen at once."""
    corpus = source_kind(cfg.name).describe(cfg)
    fallback = ", else the project's SentencePiece" if cfg.tokenizer_fallback else ""
    return f"data={cfg.name}: {corpus}; tokenizer {cfg.tokenizer}{fallback}"


def check_usable(split: Any, label: str, role: str) -> tuple[str, ...]:
    """Refuse a split whose first records (``PROOF_RECORDS[role]``) hold no usable text, or less
    than ``MIN_USABLE_SHARE`` of them; return its first usable texts (``VALIDATION_SAMPLE``).

    A share, not a count: a corpus in the wrong encoding or of random bytes decodes a few lines by
    chance, and training on those alone (a tokenizer of a dozen pieces, "epochs" of three lines)
    is garbage that only the first evaluation would reveal."""
    skipped: dict[str, int] = {}
    usable: list[str] = []
    records = 0
    for record in itertools.islice(iter(split), PROOF_RECORDS[role]):
        records += 1
        if is_usable(record.get("text")):
            usable.append(record["text"])
        else:
            count_skip(skipped, record)
    if not usable or len(usable) < MIN_USABLE_SHARE * records:
        raise DataSourceError(
            f"{label}: {len(usable)} of the first {records} {role} records hold usable text "
            f"({describe_skips(skipped)}); at least {MIN_USABLE_SHARE:.0%} must (is it text, "
            "UTF-8, with a `text` field?)"
        )
    return tuple(usable[:VALIDATION_SAMPLE])


def open_sources(cfg: DataConfig) -> Source:
    """Open both splits of the source ``cfg`` describes, once for the whole run, and prove them
    usable (``check_usable``)."""
    label = source_kind(cfg.name).label(cfg)
    train, validation = open_source(cfg, "train"), open_source(cfg, "validation")
    check_usable(train, label, "train")
    sample = check_usable(validation, label, "validation")
    return Source(train, validation, label, sample)


def open_sources_on_ranks(cfg: DataConfig, is_main: bool) -> Source:
    """``open_sources`` for every rank of a run (collective; an error on any rank is raised on
    every rank, so none waits for the others in a later collective).

    The hub is opened by rank 0 alone and handed to the others: resolving its file list is then
    one request per run instead of one per rank, which the hub rate-limits at cluster scale (the
    opened splits are lazy and picklable). A local or embedded source is opened by every rank,
    so each node checks the files it will itself read.
    """
    from train.distributed import broadcast_object, failure_stops_every_rank

    from_rank0 = source_kind(cfg.name).opened_by_rank0
    opened: Source | None = None
    with failure_stops_every_rank(DataSourceError):
        if is_main or not from_rank0:
            opened = open_sources(cfg)
    return broadcast_object(opened) if from_rank0 else opened


def _held_out_fraction(cfg: DataConfig) -> float:
    return float(cfg.val_fraction or 0.0)


def _embedded_split(cfg: DataConfig, split: str):
    from datasets import IterableDataset

    role = "train" if split == "train" else "val"

    val_fraction = _held_out_fraction(cfg)
    if not 0.0 < val_fraction < 1.0:
        raise DataSourceError("data.val_fraction: data=embedded needs 0 < data.val_fraction < 1")
    kwargs = {"shards": list(range(EMBEDDED_SHARDS)), "role": role, "val_fraction": val_fraction}
    return IterableDataset.from_generator(_embedded_records, gen_kwargs=kwargs)


def _local_split(cfg: DataConfig, split: str):
    from datasets import IterableDataset

    if not cfg.path:
        raise DataSourceError(
            "data.path: data=local needs data.path=DIR (a C4 mirror or jsonl/txt/parquet files)"
        )
    train, val, test = list_local_files(cfg.path)
    val_fraction = _held_out_fraction(cfg)
    if split == "test":
        if not test:
            raise DataSourceError(
                f"data.path={cfg.path}: no test files (names with 'test'); trainer.test_tokens "
                "needs them, or set it to 0"
            )
        files, role = test, "all"
    elif val:
        files, role = (train if split == "train" else val), "all"
    elif 0.0 < val_fraction < 1.0:
        files, role = train, ("train" if split == "train" else "val")
    else:
        raise DataSourceError(
            f"data.path={cfg.path}: no validation files (names with 'validation'/'val'); set "
            "data.val_fraction to hold out a fraction of the training records"
        )
    if not files:
        raise DataSourceError(f"data.path={cfg.path}: no {split} files")
    kwargs = {"paths": [str(f) for f in files], "role": role, "val_fraction": val_fraction}
    return IterableDataset.from_generator(_local_records, gen_kwargs=kwargs)


# ---------------------------------------------------------------------------------------------
# The sources, keyed by data.name

_EDGE = 64 << 10  # local files are fingerprinted by their first and last 64 KiB


def _edges_crc32(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(_EDGE)
        size = f.seek(0, 2)
        f.seek(max(size - _EDGE, len(head)))
        return zlib.crc32(f.read(), zlib.crc32(head))


def _local_fingerprint(cfg: DataConfig) -> dict[str, Any]:
    files = list_local_files(cfg.path)
    found = sorted({*files.train, *files.validation, *files.test})
    root = Path(cfg.path).expanduser()
    base = root if root.is_dir() else root.parent
    return {
        "source": cfg.name,
        "files": {str(p.relative_to(base)): [p.stat().st_size, _edges_crc32(p)] for p in found},
    }


def _embedded_fingerprint(cfg: DataConfig) -> dict[str, Any]:
    texts = "\n".join(text for _, text in embedded_documents()).encode()
    return {"source": cfg.name, "crc32": zlib.crc32(texts)}


def _hub_fingerprint(cfg: DataConfig) -> dict[str, Any]:
    return {"source": cfg.name, "dataset": f"{cfg.hub_name}/{cfg.hub_config}"}


@dataclass(frozen=True)
class SourceKind:
    """Everything that differs between two values of ``data.name``; the rest of the pipeline is
    shared, so adding a source is one entry of ``SOURCES``."""

    open_split: Callable[[DataConfig, str], Any]
    """One split ('train', 'validation'; 'test' where ``has_test``) as an ``IterableDataset``."""
    describe: Callable[[DataConfig], str]
    """What the corpus is, for the run's first log line (``describe_source``)."""
    label: Callable[[DataConfig], str]
    """The source in error messages (``Source.label``)."""
    fingerprint: Callable[[DataConfig], dict[str, Any]]
    """What identifies the data across a resume (``train/data/fingerprint.py``)."""
    has_test: bool = False
    opened_by_rank0: bool = False
    """Opened by rank 0 alone and handed to the others (``open_sources_on_ranks``)."""


SOURCES: dict[str, SourceKind] = {
    "c4": SourceKind(
        open_split=_open_hub,
        describe=lambda cfg: (
            f"C4 ({cfg.hub_name} '{cfg.hub_config}', streamed from the Hugging Face hub)"
        ),
        label=lambda cfg: f"data=c4 ({cfg.hub_name} {cfg.hub_config})",
        fingerprint=_hub_fingerprint,
        opened_by_rank0=True,
    ),
    "local": SourceKind(
        open_split=_local_split,
        describe=lambda cfg: f"local files ({cfg.path})",
        label=lambda cfg: f"data.path={cfg.path}",
        fingerprint=_local_fingerprint,
        has_test=True,
    ),
    "embedded": SourceKind(
        open_split=_embedded_split,
        describe=lambda cfg: (
            "the embedded corpus (Python's documentation topics, offline; for smoke tests and "
            "demos, not results)"
        ),
        label=lambda cfg: "data=embedded",
        fingerprint=_embedded_fingerprint,
    ),
}


def source_kind(name: str) -> SourceKind:
    """The ``SOURCES`` entry of ``data.name``; an unknown name is a one-line config error."""
    if name not in SOURCES:
        *others, last = SOURCES
        raise DataSourceError(f"data.name={name!r} is unknown: use {', '.join(others)} or {last}")
    return SOURCES[name]


def count_skip(stats: dict[str, int], record: Record) -> None:
    """Count a record without usable text in ``stats``: ``skipped`` and ``skipped_<reason>``."""
    key = f"skipped_{record.get('error') or 'no_text'}"
    stats["skipped"] = stats.get("skipped", 0) + 1
    stats[key] = stats.get(key, 0) + 1


def describe_skips(stats: dict[str, int]) -> str:
    """``"12 records skipped (bad_json: 10, no_text: 2)"`` from a loader's or a reader's counts."""
    reasons = ", ".join(
        f"{r}: {stats[f'skipped_{r}']}" for r in SKIP_REASONS if stats.get(f"skipped_{r}")
    )
    return f"{stats.get('skipped', 0)} records skipped" + (f" ({reasons})" if reasons else "")
