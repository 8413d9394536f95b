"""Build a local C4-format corpus from Debian's documentation packages (no Hugging Face hub needed).

The CPU reproduction (``results/repro/PROTOCOL.md``) needs millions of tokens of real English
prose that no run sees twice. Debian's documentation packages ship the manuals of large projects;
this script turns a pinned set of them (a corpus of ``repro.cpu_study.corpora``: ``--corpus
study``, the default, or ``--corpus long``, v4's Q3 corpus) into the layout of ``allenai/c4``
(``en/c4-{train,validation,test}.*.json.gz``, one JSON record per document with ``text``,
``timestamp`` and ``url``), so training reads them through ``data=local data.path=OUT`` exactly
as it would read a C4 mirror.

The study's mirror is the reStructuredText sources of the Linux kernel's and of Python's
documentation (``linux-doc-6.1``, ``python3.11-doc``: about 3,700 documents, 4.4M words before
cleaning; the kernel's alone are too few tokens). Its test split (scored only where
``trainer.test_tokens`` asks) comes from later releases of the same manuals: their documents that
the study's packages do not have (neither at their path nor moved), their paragraphs
deduplicated against the whole mirror. So the test text is of the same kind as the rest and was
never read by any run or any choice the study made, and the train and validation splits (and
their digest) are exactly what they were without it. The long corpus, ten times larger, reads
some forty manuals, most of them only as rendered HTML pages
(``repro.cpu_study.html_paragraphs``), and
holds out 1% of its documents for validation and 1% for test by the hash of their URL.

Cleaning follows the spirit of C4's filters on markup: paragraphs are re-joined from wrapped lines;
directives, literal (code) blocks, tables, heading underlines and link targets are dropped; inline
roles and hyperlinks keep their text; a paragraph is kept only when it ends in terminal punctuation
and has at least three words; a document needs at least three kept paragraphs. Paragraphs that
appeared earlier in the corpus are dropped (exact dedup after whitespace normalisation), and so
are documents whose cleaned text is empty afterwards. Translations are left out. Documents are
assigned to validation (and test) by a hash of their URL, so the split is stable across rebuilds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.cpu_study.corpora import CORPORA, RST, Corpus, Package
from repro.cpu_study.html_paragraphs import html_paragraphs

if TYPE_CHECKING:
    from train.schema import DataConfig

MANIFEST = "corpus.json"  # beside en/: what the mirror was built from, and its digest
TERMINAL = (".", "!", "?", '"', "'", ":")  # C4 keeps lines ending in terminal punctuation
MIN_WORDS = 3
MIN_PARAGRAPHS = 3
MAX_NON_ASCII = 0.1

_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}\s*$")
_EXPLICIT = re.compile(r"^\.\.(\s|$)")  # .. note::, .. _label:, .. |subst| ..., comments
_DIRECTIVE_NAME = re.compile(r"^\.\.\s+([\w:-]+)::")
# Directives whose indented body is prose (API descriptions, admonitions); every other explicit
# markup block (code, includes, tables, toctrees, comments, images, ...) has its body dropped.
PROSE_DIRECTIVES = frozenset(
    (
        "note",
        "warning",
        "attention",
        "caution",
        "danger",
        "error",
        "hint",
        "important",
        "tip",
        "seealso",
        "admonition",
        "versionadded",
        "versionchanged",
        "deprecated",
        "deprecated-removed",
        "impl-detail",
        "glossary",
        "function",
        "method",
        "class",
        "attribute",
        "data",
        "exception",
        "decorator",
        "decoratormethod",
        "classmethod",
        "staticmethod",
        "module",
        "describe",
        "option",
        "envvar",
        "cmdoption",
        "opcode",
        "abstractmethod",
        "coroutinefunction",
        "coroutinemethod",
        "awaitablefunction",
        "awaitablemethod",
        "c:function",
        "c:member",
        "c:macro",
        "c:type",
        "c:var",
        "c:struct",
        "c:union",
        "c:enum",
        "c:enumerator",
        "c:data",
        "c:func",
    )
)
_FIELD = re.compile(r"^:[\w -]+:")  # :maxdepth: 2, :Author: ...
_TABLE = re.compile(r"^\s*[+|]")
_ROLE = re.compile(r":[\w:+-]+:`([^`<]*?)\s*(?:<[^`>]*>)?`")  # :ref:`text <target>` -> text
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}")  # `text <url>`_ -> text
_LITERAL = re.compile(r"``([^`]+)``")
_EMPHASIS = re.compile(r"\*{1,2}([^*]+)\*{1,2}")
_REFERENCE = re.compile(r"`([^`]+)`_{0,2}")
_FOOTNOTE = re.compile(r"\s*\[[#*\d\w-]*\]_")
_SPACE = re.compile(r"\s+")


class CorpusError(Exception):
    """The pinned sources cannot be had or are not where they should be (a one-line reason)."""


@dataclass(frozen=True)
class Document:
    package: Package
    path: str  # relative to the package's sources, without the suffix
    text: str
    timestamp: str

    @property
    def url(self) -> str:
        return self.package.url_root + self.path + ".html"

    def record(self) -> dict[str, str]:
        return {"text": self.text, "timestamp": self.timestamp, "url": self.url}


def blocks(source: str) -> Iterator[list[str]]:
    """Blank-line separated blocks of lines, tabs expanded."""
    block: list[str] = []
    for line in source.expandtabs(8).splitlines():
        if line.strip():
            block.append(line.rstrip())
        elif block:
            yield block
            block = []
    if block:
        yield block


def prose_paragraphs(source: str) -> Iterator[str]:
    """The paragraphs of an RST source that read as prose, inline markup reduced to its text."""
    skip_indent: int | None = None  # inside a dropped body: lines indented deeper than this
    for block in blocks(source):
        indent = len(block[0]) - len(block[0].lstrip())
        if skip_indent is not None:
            if indent > skip_indent:
                continue
            skip_indent = None
        first = block[0].lstrip()
        if _EXPLICIT.match(first):
            name = _DIRECTIVE_NAME.match(first)
            if name is None or name.group(1).removeprefix("py:") not in PROSE_DIRECTIVES:
                skip_indent = indent
            continue
        opens_literal = block[-1].endswith("::")
        if opens_literal:
            skip_indent = indent  # the literal block's indented lines follow
        if _FIELD.match(first) or _TABLE.match(first):
            continue
        lines = [line for line in block if not _UNDERLINE.match(line.strip())]
        if len(lines) < len(block):
            continue  # a heading (title + underline), not a paragraph
        text = " ".join(line.strip() for line in lines)
        if opens_literal:
            text = text[:-1].rstrip(":").rstrip() + ":" if text.endswith("::") else text
        yield clean_inline(text)


def clean_inline(text: str) -> str:
    """Inline RST markup reduced to the words a reader sees."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _REFERENCE.sub(r"\1", text)
    text = _FOOTNOTE.sub("", text)
    text = text.replace("\\", "")
    return _SPACE.sub(" ", text).strip()


def keeps(paragraph: str) -> bool:
    """C4's line rules, applied to re-joined paragraphs (plus English-only by character set)."""
    if len(paragraph.split()) < MIN_WORDS or not paragraph.endswith(TERMINAL):
        return False
    non_ascii = sum(not c.isascii() for c in paragraph)
    return non_ascii <= MAX_NON_ASCII * len(paragraph) and "{" not in paragraph


SPLIT_DIGESTS = ("train", "validation")  # what ``corpus_digest`` covers: the study's pinned text


def source_files(
    unpacked: Path, packages: tuple[Package, ...]
) -> Iterator[tuple[Package, Path, Path]]:
    """``(package, its documents' root, file)`` for every document file, in a stable order."""
    for package in packages:
        root = unpacked / package.sources
        if not root.is_dir():
            raise CorpusError(f"{package.name}: no {root}; unpack it with dpkg -x")
        for file in sorted(root.rglob("*" + package.suffix)):
            # a manual may have a directory named like a page
            if file.is_file() and relative_path(package, root, file) not in package.skip:
                yield package, root, file


def relative_path(package: Package, root: Path, file: Path) -> str:
    return file.relative_to(root).as_posix()[: -len(package.suffix)]


def paragraphs(package: Package, source: str) -> Iterable[str]:
    """A document's candidate paragraphs, read as its package's format."""
    return prose_paragraphs(source) if package.suffix == RST else html_paragraphs(source)


def document_key(path: str) -> str:
    """The last two components of a document's path: what stays when a release moves it (6.3
    moved the kernel's ``x86/`` under ``arch/``), so a moved document is not a new one."""
    return "/".join(path.split("/")[-2:])


def candidate_paragraphs(source: tuple[Package, Path]) -> list[str]:
    """The paragraphs of one document file that ``keeps`` would keep, before dedup: the part of
    reading a document that depends on that file alone, so it can run in any process."""
    package, file = source
    text = file.read_text(encoding="utf-8", errors="replace")
    return [paragraph for paragraph in paragraphs(package, text) if keeps(paragraph)]


@contextlib.contextmanager
def ordered_map(workers: int) -> Iterator[Callable[..., Iterable[Any]]]:
    """``map`` over ``workers`` processes, results in input order (the builtin for 1): cleaning
    the long corpus's HTML is most of its build, and the files do not depend on each other."""
    if workers <= 1:
        yield map
        return
    with multiprocessing.Pool(workers) as pool:
        yield functools.partial(pool.imap, chunksize=16)


def documents(
    unpacked: Path,
    timestamp: str,
    packages: tuple[Package, ...],
    seen: set[str] | None = None,
    exclude: frozenset[str] = frozenset(),
    workers: int = 1,
) -> Iterator[Document]:
    """Cleaned documents of ``packages``, paragraphs deduplicated across the whole corpus (and
    against ``seen``, which it extends); documents whose ``document_key`` is in ``exclude`` are
    skipped whole. Files are cleaned in ``workers`` processes; dedup stays here, in file order,
    so the documents are the same for any number of them."""
    seen = set() if seen is None else seen
    files = []
    for package, root, file in source_files(unpacked, packages):
        relative = relative_path(package, root, file)
        if not relative.startswith("translations/") and document_key(relative) not in exclude:
            files.append((package, relative, file))
    with ordered_map(workers) as map_files:
        cleaned = map_files(candidate_paragraphs, [(package, file) for package, _, file in files])
        for (package, relative, _), candidates in zip(files, cleaned, strict=True):
            kept = []
            for paragraph in candidates:
                key = paragraph.lower()
                if key not in seen:
                    seen.add(key)
                    kept.append(paragraph)
            if len(kept) >= MIN_PARAGRAPHS:
                yield Document(package, relative, "\n".join(kept), timestamp)


def percentile(key: str) -> int:
    """A document's place in 0..99 by a hash of its address (its package and path): the split
    is stable across rebuilds and independent of the other documents."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100


def is_validation(key: str, percent: int) -> bool:
    return percentile(key) < percent


def split_of(key: str, validation_percent: int, test_percent: int) -> str:
    """``validation`` for the lowest ``validation_percent`` percentiles, ``test`` for the next
    ``test_percent``, ``train`` for the rest."""
    place = percentile(key)
    if place < validation_percent:
        return "validation"
    return "test" if place < validation_percent + test_percent else "train"


def shard_order(doc: Document) -> str:
    """A fixed pseudo-random position for a document, independent of its package and path order.

    C4's shards are each a random sample of the corpus, and ``datasets`` streams a split's shards
    interleaved, reading the first records of every shard first. Shards written in source order
    would make every training stream start with one package alone: on the pinned mirror, the
    first ~1,000 documents of every shuffled stream were all kernel documentation.
    """
    return hashlib.sha256(b"shard order\n" + doc.url.encode()).hexdigest()


def write_shards(docs: Iterable[Document], out: Path, split: str, shards: int) -> int:
    """``out/en/c4-{split}.{i:05d}-of-{shards:05d}.json.gz``: the documents in ``shard_order``,
    dealt round-robin, so every shard and every prefix of one mixes all packages and topics."""
    (out / "en").mkdir(parents=True, exist_ok=True)
    count = 0
    with contextlib.ExitStack() as stack:
        files = [
            stack.enter_context(
                gzip.open(out / "en" / f"c4-{split}.{i:05d}-of-{shards:05d}.json.gz", "wt")
            )
            for i in range(shards)
        ]
        for count, doc in enumerate(sorted(docs, key=shard_order), 1):
            files[(count - 1) % shards].write(json.dumps(doc.record()) + "\n")
    return count


def download(package: Package, workdir: Path) -> Path:
    """The pinned ``.deb`` from the first pool that has it with the pinned checksum."""
    tried = []
    for pool in package.pools:
        url = pool + package.deb
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as error:
            tried.append(f"{url} ({error})")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest == package.sha256:
            path = workdir / package.deb
            path.write_bytes(data)
            return path
        tried.append(f"{url} (sha256 {digest})")
    raise CorpusError(
        f"{package.name} {package.version} with sha256 {package.sha256} is in no pool any more: "
        + "; ".join(tried)
    )


def test_documents(
    unpacked: Path, timestamp: str, corpus: Corpus, seen: set[str], workers: int = 1
) -> list[Document]:
    """The test split from ``corpus.test_packages``: their documents that none of its packages
    has, at its path or moved (``document_key``), without a paragraph of the mirror (``seen``:
    every paragraph kept in train and validation)."""
    known = frozenset(
        document_key(relative_path(package, root, file))
        for package, root, file in source_files(unpacked, corpus.packages)
    )
    return list(
        documents(unpacked, timestamp, corpus.test_packages, seen, exclude=known, workers=workers)
    )


def read_splits(
    corpus: Corpus, unpacked: Path, validation_percent: int, with_test: bool, workers: int = 1
) -> dict[str, list[Document]]:
    """The documents of each split: by ``split_of`` their URL, or, for a corpus with test
    packages, its test split from those (``test_documents``); no test split unless
    ``with_test``. Paragraphs are deduplicated across all the splits, in package order."""
    newest = max(file.stat().st_mtime for _, _, file in source_files(unpacked, corpus.packages))
    stamp = datetime.fromtimestamp(newest, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    seen: set[str] = set()
    splits: dict[str, list[Document]] = {"train": [], "validation": [], "test": []}
    for doc in documents(unpacked, stamp, corpus.packages, seen, workers=workers):
        splits[split_of(doc.url, validation_percent, corpus.test_percent)].append(doc)
    if not with_test:
        splits["test"] = []
    elif corpus.test_packages:
        splits["test"] = test_documents(unpacked, stamp, corpus, seen, workers)
    return splits


def fetch_packages(workdir: Path, packages: tuple[Package, ...], downloads: int = 8) -> Path:
    """Download every pinned package and unpack it into one root; return that root.

    ``downloads`` at a time, since the wait is the mirror's, while each is unpacked in the list's
    order, so that the root is the same however the downloads finish."""
    with ThreadPoolExecutor(downloads) as pool:
        for deb in pool.map(functools.partial(download, workdir=workdir), packages):
            subprocess.run(["dpkg", "-x", str(deb), str(workdir / "root")], check=True)
    return workdir / "root"


def corpus_digest(out: Path, splits: tuple[str, ...] = SPLIT_DIGESTS) -> str:
    """sha256 of the records of the mirror's ``splits``: the shards' names and their uncompressed
    lines (the test split has a digest of its own, ``corpus_digest(out, ("test",))``).

    The gzip containers are left out (they carry the time they were written), so two builds
    of the same text have the same digest.
    """
    digest = hashlib.sha256()
    shards = (shard for split in splits for shard in (out / "en").glob(f"c4-{split}.*.json.gz"))
    for shard in sorted(shards):
        digest.update(shard.name.encode() + b"\n")
        with gzip.open(shard, "rb") as f:
            for line in f:
                digest.update(line)
    return digest.hexdigest()


def mirror_config(out: Path, vocab_size: int) -> DataConfig:
    """The ``data`` config training reads this mirror with (``data=local``, project tokenizer)."""
    from train.schema import DataConfig

    return DataConfig(
        name="local",
        path=str(out),
        tokenizer="none-offline",
        tokenizer_fallback=True,
        tokenizer_cache_dir=None,
        spm_vocab_size=vocab_size,
        val_fraction=0.0,
    )


def count_tokens(out: Path, vocab_size: int, batch: int = 1000) -> dict[str, int]:
    """Tokens per split with the SentencePiece tokenizer training would build on this mirror
    (``batch`` documents encoded at a time: a large mirror's ids do not fit in memory at once)."""
    from train.data.corpus import open_source
    from train.data.tokenizer import build_tokenizer

    cfg = mirror_config(out, vocab_size)
    tokenizer = build_tokenizer(cfg, vocab_size)
    counts = {}
    for split in ("train", "validation", "test"):
        if not any((out / "en").glob(f"c4-{split}.*")):
            continue
        counts[split], texts = 0, []
        for record in open_source(cfg, split):
            texts += [record["text"]] if record["text"] else []
            if len(texts) == batch:
                counts[split] += sum(len(ids) for ids in tokenizer.encode_batch(texts))
                texts = []
        counts[split] += sum(len(ids) for ids in tokenizer.encode_batch(texts)) if texts else 0
    return counts


def tokenizer_sha256(out: Path, vocab_size: int) -> str:
    """sha256 of the SentencePiece model training builds on this mirror (from its cache when it
    was built before). It depends on the text and on the installed ``sentencepiece``."""
    from train.data.corpus import open_sources
    from train.data.tokenizer import project_sentencepiece

    cfg = mirror_config(out, vocab_size)
    proto, _, _ = project_sentencepiece(cfg, vocab_size, open_sources(cfg))
    return hashlib.sha256(proto).hexdigest()


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line, checked (a clear one-line error, exit 2, for a bad one)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus",
        choices=sorted(CORPORA),
        default="study",
        help="which pinned corpus (repro/cpu_study/corpora.py): the study's mirror or v4's Q3 "
        "corpus",
    )
    parser.add_argument("--out", type=Path, required=True, help="mirror root (gets en/)")
    parser.add_argument(
        "--source-root", type=Path, help="where the packages are unpacked (default: fetch them)"
    )
    parser.add_argument(
        "--validation-percent", type=int, help="default: the corpus's (study 5, long 1)"
    )
    parser.add_argument("--train-shards", type=int, default=8)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that clean the documents (default: one per CPU); the mirror is the "
        "same for any number",
    )
    parser.add_argument(
        "--no-test",
        action="store_true",
        help="no test split (the study's test packages are then neither fetched nor read; the "
        "long corpus's test documents are left out)",
    )
    parser.add_argument(
        "--count-tokens",
        type=int,
        metavar="VOCAB",
        default=None,
        help="also count tokens with the project's SentencePiece tokenizer of this vocabulary "
        "size, and record that tokenizer's sha256",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: needs at least 1")
    if args.source_root is not None and not args.source_root.is_dir():
        parser.error(f"--source-root {args.source_root} is not a directory")
    if (args.out / "en").exists() and any((args.out / "en").iterdir()):
        parser.error(f"--out {args.out}/en already has files; remove them or pick another --out")
    try:  # before the packages are fetched: an --out that cannot be written fails in a second
        (args.out / "en").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {args.out}: {error.strerror}")
    return parser, args


def write_manifest(args: argparse.Namespace, pinned: tuple[Package, ...], splits: dict) -> None:
    """``corpus.json``: what the mirror was built from, its digests and its size per split."""
    manifest: dict[str, Any] = {
        "corpus": args.corpus,
        "packages": "unpacked by hand: " + str(args.source_root)
        if args.source_root
        else [{"name": p.name, "version": p.version, "sha256": p.sha256} for p in pinned],
        "corpus_digest": corpus_digest(args.out),
        "test_digest": corpus_digest(args.out, ("test",)) if splits["test"] else None,
    }
    for name, split in splits.items():
        words = sum(len(d.text.split()) for d in split)
        manifest[name] = {"documents": len(split), "words": words}
        print(f"{name}: {len(split)} documents, {words} words")
    if args.count_tokens:
        for name, tokens in count_tokens(args.out, args.count_tokens).items():
            manifest[name][f"tokens_spm{args.count_tokens}"] = tokens
            print(f"{name}: {tokens} tokens (SentencePiece, vocabulary {args.count_tokens})")
        manifest[f"tokenizer_spm{args.count_tokens}_sha256"] = tokenizer_sha256(
            args.out, args.count_tokens
        )
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"corpus digest: {manifest['corpus_digest']} (written to {args.out / MANIFEST})")


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    corpus = CORPORA[args.corpus]
    percent = (
        corpus.validation_percent if args.validation_percent is None else args.validation_percent
    )
    pinned = (*corpus.packages, *(() if args.no_test else corpus.test_packages))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            root = args.source_root or fetch_packages(Path(tmp), pinned)
            splits = read_splits(corpus, root, percent, not args.no_test, args.workers)
        except CorpusError as error:
            parser.error(str(error))
    write_shards(splits["train"], args.out, "train", args.train_shards)
    write_shards(splits["validation"], args.out, "validation", 1)
    if splits["test"]:
        write_shards(splits["test"], args.out, "test", 1)
    write_manifest(args, pinned, splits)
    return 0
