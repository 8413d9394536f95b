"""scripts/make_corpus.py: a C4-format mirror from Sphinx sources (record format, cleaning, split, dedup)."""

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.cpu_study import corpora, make_corpus
from repro.cpu_study.html_paragraphs import html_paragraphs

ROOT = Path(__file__).resolve().parents[3]
STUDY = corpora.CORPORA["study"]

GUIDE = """\
.. _howto:

A Guide
=======

This guide explains how the scheduler picks the next task to run.
Lines wrap inside a paragraph, as reStructuredText does.

See :ref:`the locking rules <locking>` and ``struct task`` for the details.

Run it like this::

    $ make menuconfig
    echo "this is code, not prose."

.. code-block:: c

   int main(void) { return 0; }

.. note::

   Notes are prose and their text is kept in the corpus.

+-------+-------+
| table | cells |
+-------+-------+

Too short.

A sentence without a terminal punctuation mark
"""

SHARED = """\
Shared
======

This paragraph is shared between two documents verbatim.

The second document has its own words in this paragraph too.

And a third paragraph makes the document long enough to keep.
"""


def write_packages(
    root: Path, docs: dict[str, str], corpus: corpora.Corpus = corpora.CORPORA["study"]
) -> None:
    """``docs`` by ``package/relative/path`` of ``corpus``'s packages (their suffix is added)."""
    by_name = {package.name: package for package in (*corpus.packages, *corpus.test_packages)}
    for key, text in docs.items():
        name, relative = key.split("/", 1)
        path = root / by_name[name].sources / (relative + by_name[name].suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def read_split(out: Path, split: str) -> list[dict]:
    records = []
    for file in sorted((out / "en").glob(f"c4-{split}.*.json.gz")):
        with gzip.open(file, "rt") as f:
            records.extend(json.loads(line) for line in f)
    return records


@pytest.fixture
def packages(tmp_path):
    root = tmp_path / "unpacked"
    docs = {
        "linux-doc-6.1/scheduler/guide": GUIDE,
        "linux-doc-6.1/a/shared": SHARED,
        "linux-doc-6.1/translations/it_IT/guide": GUIDE.replace("guide", "guida"),
        "python3.11-doc/library/shared": SHARED,  # a later exact duplicate: dropped
    }
    docs.update({f"python3.11-doc/many/doc{i}": SHARED.replace("too", f"{i}") for i in range(40)})
    docs.update(
        {
            "linux-doc-6.12/scheduler/guide": NEW,  # a path the mirror has: never test text
            "linux-doc-6.12/arch/scheduler/guide": NEW,  # moved there: not a new document
            "linux-doc-6.12/rust/intro": NEW,
            "python3.13-doc/whatsnew/3.13": NEW.replace("chapter", "section"),
        }
    )
    write_packages(root, docs)
    return root


NEW = """\
New in this release
===================

This paragraph is shared between two documents verbatim.

The kernel gained a chapter that no earlier release had.

Its second paragraph explains why the chapter exists at all.

A third paragraph closes the chapter with a summary.
"""


def test_documents_are_cleaned_prose(packages):
    docs = {
        d.url: d for d in make_corpus.documents(packages, "2024-01-01T00:00:00Z", STUDY.packages)
    }
    guide = docs["https://www.kernel.org/doc/html/v6.1/scheduler/guide.html"].text.split("\n")
    assert guide == [
        "This guide explains how the scheduler picks the next task to run. Lines wrap inside a "
        "paragraph, as reStructuredText does.",
        "See the locking rules and struct task for the details.",
        "Run it like this:",
        "Notes are prose and their text is kept in the corpus.",
    ]
    assert not any("translations" in url for url in docs)


def test_repeated_paragraphs_are_kept_once(packages):
    docs = list(make_corpus.documents(packages, "2024-01-01T00:00:00Z", STUDY.packages))
    shared = "This paragraph is shared between two documents verbatim."
    assert sum(d.text.count(shared) for d in docs) == 1
    # the python copy lost every paragraph to dedup, so the whole document is gone
    assert "https://docs.python.org/3.11/library/shared.html" not in {d.url for d in docs}


def test_mirror_layout_records_and_split(packages, tmp_path):
    out = tmp_path / "mirror"
    args = ["--out", str(out), "--source-root", str(packages), "--validation-percent", "30"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_corpus.py"), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    train, val = read_split(out, "train"), read_split(out, "validation")
    assert f"train: {len(train)} documents" in result.stdout
    assert f"validation: {len(val)} documents" in result.stdout
    assert train and val  # 30% of 41 documents, by hash
    for record in train + val:
        assert set(record) == {"text", "timestamp", "url"}
        assert record["text"] and record["url"].endswith(".html")
    assert all(make_corpus.is_validation(r["url"], 30) for r in val)
    assert not any(make_corpus.is_validation(r["url"], 30) for r in train)
    assert len({r["url"] for r in train + val}) == len(train) + len(val)
    # the same sources give the same split: it depends on the address only
    again = tmp_path / "again"
    make_corpus.main(["--out", str(again), "--source-root", str(packages)])
    make_corpus.main(["--out", str(tmp_path / "other"), "--source-root", str(packages)])
    assert read_split(again, "validation") == read_split(tmp_path / "other", "validation")


def test_the_mirror_is_the_same_for_any_number_of_workers(packages, tmp_path):
    """Cleaning runs in worker processes, dedup in file order: one worker or three, the same
    records in every split (the dedup fixture's later duplicate dropped either way)."""
    for workers in ("1", "3"):
        make_corpus.main(
            ["--out", str(tmp_path / workers), "--source-root", str(packages), "--workers", workers]
        )
    for split in ("train", "validation", "test"):
        assert read_split(tmp_path / "1", split) == read_split(tmp_path / "3", split)
    digests = [
        json.loads((tmp_path / w / make_corpus.MANIFEST).read_text())["corpus_digest"]
        for w in ("1", "3")
    ]
    assert digests[0] == digests[1]


def test_a_worker_count_below_one_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        make_corpus.main(["--out", str(tmp_path / "mirror"), "--workers", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--workers 0: needs at least 1")


def test_refuses_to_overwrite_and_a_missing_package(packages, tmp_path, capsys):
    out = tmp_path / "mirror"
    make_corpus.main(["--out", str(out), "--source-root", str(packages)])
    with pytest.raises(SystemExit):
        make_corpus.main(["--out", str(out), "--source-root", str(packages)])
    assert "already has files" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        make_corpus.main(["--out", str(tmp_path / "x"), "--source-root", str(empty)])
    assert "linux-doc-6.1: no " in capsys.readouterr().err


def test_an_out_that_cannot_be_written_fails_before_any_package_is_read(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_:
        make_corpus.main(["--out", str(tmp_path / "file" / "mirror")])  # would fetch: it must not
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("/file/mirror: Not a directory")


def test_mirror_digest_depends_on_the_text_only(packages, tmp_path):
    """Two builds of the same sources have one digest (the gzip headers' times are left out),
    recorded in the manifest; changing one record changes it."""
    a, b = tmp_path / "a", tmp_path / "b"
    make_corpus.main(["--out", str(a), "--source-root", str(packages)])
    make_corpus.main(["--out", str(b), "--source-root", str(packages)])
    digest = make_corpus.corpus_digest(a)
    assert digest == make_corpus.corpus_digest(b)
    manifest = json.loads((a / make_corpus.MANIFEST).read_text())
    assert manifest["corpus_digest"] == digest
    assert manifest["train"]["documents"] == len(read_split(a, "train"))
    shard = sorted((b / "en").glob("c4-train.*.json.gz"))[0]
    with gzip.open(shard, "rt") as f:
        lines = f.readlines()
    with gzip.open(shard, "wt") as f:
        f.writelines([lines[0].replace("paragraph", "Paragraph", 1), *lines[1:]])
    assert make_corpus.corpus_digest(b) != digest


def test_download_takes_the_first_pool_with_the_pinned_checksum(tmp_path):
    good, bad = b"the pinned package", b"a newer build"
    pools = [tmp_path / "gone", tmp_path / "newer", tmp_path / "kept"]
    package = make_corpus.Package(
        "doc",
        "1.0-1",
        hashlib.sha256(good).hexdigest(),
        tuple(pool.as_uri() + "/" for pool in pools),
        "usr/share/doc",
        "https://example.org/",
    )
    for pool, data in ((pools[1], bad), (pools[2], good)):
        pool.mkdir()
        (pool / package.deb).write_bytes(data)
    work = tmp_path / "work"
    work.mkdir()
    assert make_corpus.download(package, work).read_bytes() == good
    (pools[2] / package.deb).unlink()
    with pytest.raises(make_corpus.CorpusError) as error:
        make_corpus.download(package, work)
    message = str(error.value)
    assert "doc 1.0-1" in message and "gone" in message
    assert f"sha256 {hashlib.sha256(bad).hexdigest()}" in message


def test_a_skipped_page_is_not_read(tmp_path):
    """nodejs-doc's ``all.html`` holds every page of its manual: read, it would be one huge
    document and the pages after it would lose every paragraph to dedup."""
    package = make_corpus.Package(
        "doc", "1.0-1", "0" * 64, (), "api", "https://example.org/", corpora.HTML, skip=("all",)
    )
    (tmp_path / "api" / "sub").mkdir(parents=True)
    for page in ("all", "buffer", "fs", "sub/all"):
        (tmp_path / "api" / f"{page}.html").write_text("<p>A page.</p>")
    read = [
        make_corpus.relative_path(p, root, file)
        for p, root, file in make_corpus.source_files(tmp_path, (package,))
    ]
    assert read == ["buffer", "fs", "sub/all"]  # only the page named, at its path


def test_every_shard_prefix_mixes_the_packages(tmp_path):
    """Shards are not in source order: ``datasets`` reads a split's shards interleaved, so a
    shard that begins with one package's documents makes every stream begin with it alone."""
    root = tmp_path / "unpacked"

    def text(name: str) -> str:
        return "".join(f"Paragraph {j} of the {name} document.\n\n" for j in range(3))

    docs = {
        f"{package}/area{i}/doc": text(f"{package} {i}")
        for i in range(40)
        for package in ("linux-doc-6.1", "python3.11-doc")
    }
    write_packages(root, docs)
    out = tmp_path / "mirror"
    args = ["--out", str(out), "--source-root", str(root), "--train-shards", "2", "--no-test"]
    make_corpus.main(args)
    for shard in sorted((out / "en").glob("c4-train.*.json.gz")):
        with gzip.open(shard, "rt") as f:
            urls = [json.loads(line)["url"] for line in f]
        first_quarter = urls[: len(urls) // 4]
        assert any("kernel.org" in u for u in first_quarter), shard.name
        assert any("python.org" in u for u in first_quarter), shard.name
        assert urls != sorted(urls)


def test_the_test_split_is_new_documents_of_later_releases_and_leaves_the_rest_as_it_was(
    packages, tmp_path
):
    with_test, without = tmp_path / "with", tmp_path / "without"
    make_corpus.main(["--out", str(with_test), "--source-root", str(packages)])
    make_corpus.main(["--out", str(without), "--source-root", str(packages), "--no-test"])
    test = read_split(with_test, "test")
    assert {r["url"] for r in test} == {
        "https://www.kernel.org/doc/html/v6.12/rust/intro.html",
        "https://docs.python.org/3.13/whatsnew/3.13.html",
    }
    mirror = {
        p
        for r in read_split(with_test, "train") + read_split(with_test, "validation")
        for p in r["text"].split("\n")
    }
    assert not any(p in mirror for r in test for p in r["text"].split("\n"))
    for split in ("train", "validation"):
        assert read_split(with_test, split) == read_split(without, split)
    assert make_corpus.corpus_digest(with_test) == make_corpus.corpus_digest(without)
    manifest = json.loads((with_test / make_corpus.MANIFEST).read_text())
    assert manifest["test"]["documents"] == 2
    assert manifest["test_digest"] == make_corpus.corpus_digest(with_test, ("test",))
    assert manifest["test_digest"] != manifest["corpus_digest"]
    assert not list((without / "en").glob("c4-test.*"))


PAGE = """<!DOCTYPE html>
<html><head><title>A page</title><script>var x = "not prose.";</script></head>
<body><div class="related" role="navigation">Go to the next page, please.</div>
<h1>The title of the page</h1>
<p>This manual explains how the <code>scheduler</code> picks
   the <a href="x.html">next task</a> &amp; why.</p>
<pre>echo "code is not prose."</pre>
<table><tr><td>A table cell is not prose either.</td></tr></table>
<ul><li>An item of a list is a paragraph.<li>An unclosed item ends at the next one.</ul>
<p>A paragraph<br>broken by a line break is two.
<section class="summary"><div>Returns a summary line, repeated below.</div></section>
</body></html>
"""


def test_html_pages_give_their_prose_paragraphs():
    assert html_paragraphs(PAGE) == [
        "This manual explains how the scheduler picks the next task & why.",
        "An item of a list is a paragraph.",
        "An unclosed item ends at the next one.",
        "A paragraph",
        "broken by a line break is two.",
    ]


def test_the_long_corpus_splits_by_hash_and_reads_html_pages(tmp_path):
    """``--corpus long``: its own packages (the study's are neither needed nor read), 1% of the
    documents for validation and 1% for test by the percentile of their URL, paragraphs
    deduplicated across all three splits, and a digest for each side."""
    long = corpora.CORPORA["long"]
    rst = next(p for p in long.packages if p.suffix == corpora.RST)
    html = next(p for p in long.packages if p.suffix == corpora.HTML)
    docs = {}
    for i in range(150):
        words = f"{i} " * 3
        docs[f"{rst.name}/area{i}/doc"] = "".join(
            f"Paragraph {j} of the sources, number {words}.\n\n" for j in range(3)
        )
        docs[f"{html.name}/page{i}"] = (
            "".join(f"<p>Paragraph {j} of the pages, number {words}.</p>" for j in range(3))
            + "<p>A footer line that every page repeats.</p>"
        )
    write_packages(tmp_path / "unpacked", docs, long)
    for package in long.packages:  # every package must be there; the others are empty here
        (tmp_path / "unpacked" / package.sources).mkdir(parents=True, exist_ok=True)
    out = tmp_path / "mirror"
    make_corpus.main(
        ["--corpus", "long", "--out", str(out), "--source-root", str(tmp_path / "unpacked")]
    )
    splits = {split: read_split(out, split) for split in ("train", "validation", "test")}
    assert sum(map(len, splits.values())) == 300
    for split, records in splits.items():
        assert records, split  # 300 documents: each 1% holds some (a fixed hash)
        for record in records:
            assert make_corpus.split_of(record["url"], 1, 1) == split
    paragraphs = [p for records in splits.values() for r in records for p in r["text"].split("\n")]
    assert len(paragraphs) == len(set(paragraphs)) == 901  # the footer once
    assert any(r["url"] == html.url_root + "page0.html" for rs in splits.values() for r in rs)
    manifest = json.loads((out / make_corpus.MANIFEST).read_text())
    assert manifest["corpus"] == "long"
    assert manifest["test"]["documents"] == len(splits["test"])
    assert manifest["test_digest"] == make_corpus.corpus_digest(out, ("test",))
    assert manifest["corpus_digest"] == make_corpus.corpus_digest(out)


def test_split_of_gives_disjoint_hash_buckets():
    keys = [f"https://example.org/{i}.html" for i in range(2000)]
    for key in keys:
        place = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100
        expected = "validation" if place < 5 else "test" if place < 8 else "train"
        assert make_corpus.split_of(key, 5, 3) == expected
    assert {make_corpus.split_of(k, 5, 0) for k in keys} == {"train", "validation"}


def built_deb(tmp_path: Path, name: str, files: dict[str, str]) -> bytes:
    """A real (tiny) Debian package holding ``files``, built by dpkg-deb."""
    tree = tmp_path / f"build-{name}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Description: test\n"
    )
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    subprocess.run(
        ["dpkg-deb", "--build", str(tree), str(tmp_path / f"{name}.deb")],
        check=True,
        capture_output=True,
    )
    return (tmp_path / f"{name}.deb").read_bytes()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_packages_unpack_in_their_order_however_their_downloads_finish(tmp_path, monkeypatch):
    pool = tmp_path / "pool"
    pool.mkdir()
    packages = []
    for name in ("first", "second"):  # both hold doc/page.txt: the later one's is kept
        data = built_deb(tmp_path, name, {"doc/page.txt": name, f"doc/{name}.txt": name})
        package = make_corpus.Package(
            name, "1.0", hashlib.sha256(data).hexdigest(), (pool.as_uri() + "/",), "doc", "u"
        )
        (pool / package.deb).write_bytes(data)
        packages.append(package)
    download = make_corpus.download

    def first_one_slow(package, workdir):
        if package.name == "first":
            time.sleep(0.5)
        return download(package, workdir)

    monkeypatch.setattr(make_corpus, "download", first_one_slow)
    work = tmp_path / "work"
    work.mkdir()
    root = make_corpus.fetch_packages(work, tuple(packages))
    assert (root / "doc" / "page.txt").read_text() == "second"
    assert (root / "doc" / "first.txt").read_text() == "first"
