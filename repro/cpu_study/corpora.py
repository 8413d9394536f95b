"""The corpora ``repro.cpu_study.make_corpus`` builds: each one's pinned Debian packages and
split, read from ``corpora.json`` beside this module (the pins are data; this module says what
they mean).

``study`` is the CPU reproduction's mirror (``results/repro/PROTOCOL.md``, "Data"): the kernel's
and Python's documentation, 5% of documents for validation by a hash of their URL, and a test
split from later releases of the same manuals. ``long`` is v4's Q3 corpus ("Q3, twenty tokens
per parameter"): at least 42M training tokens asked, from other packages (``postgresql-doc-*`` and
``perl-doc`` never: they are reserved for an independent check), 1% of documents each for
validation and test by the same hash. A survey (words kept per package after cleaning) chose its
packages: the largest English manuals in Debian, one release of each, in one directory each. Its
first two packages are the study's test-split pins, the kernel read as rendered pages (its
kernel-doc API text is not in ``_sources``) and Python's sources as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

RST = ".rst.txt"  # Sphinx's copy of a page's reStructuredText source (html/_sources/)
HTML = ".html"  # a rendered page (repro.cpu_study.html_paragraphs)
PINS = Path(__file__).with_name("corpora.json")


@dataclass(frozen=True)
class Package:
    """A Debian package that ships a manual's sources or pages, pinned to one build of it.

    The pin is what makes a rebuild on a fresh machine give the same corpus: Debian replaces a
    package's files in its pool with each point release, and a study spread over several working
    sessions must not train its later runs on other text than its earlier ones. The pool paths
    are tried in order; the file must match ``sha256``. ``suffix`` says how its documents are
    read: reStructuredText sources (``RST``) or rendered pages (``HTML``). ``skip`` names
    documents (paths under ``sources``, without the suffix) that are not read: a single page that
    repeats the whole manual would otherwise take every paragraph from the pages that hold them
    (dedup keeps a paragraph's first occurrence) and arrive in training as one huge document.
    """

    name: str
    version: str
    sha256: str
    pools: tuple[str, ...]  # the Debian pool directories that may hold the .deb
    sources: str  # the directory of the documents inside the unpacked package
    url_root: str
    suffix: str = RST
    skip: tuple[str, ...] = ()

    @property
    def deb(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_all.deb"


@dataclass(frozen=True)
class Corpus:
    """A corpus's packages and split. Documents go to validation and test by a hash of their URL
    (``validation_percent`` and ``test_percent`` of them); ``test_packages``, where a corpus has
    them, give its test split instead: their documents that ``packages`` lack."""

    name: str
    packages: tuple[Package, ...]
    validation_percent: int
    test_percent: int = 0
    test_packages: tuple[Package, ...] = ()


def package(entry: dict[str, Any]) -> Package:
    """One package of ``corpora.json``: its keys are ``Package``'s fields, lists its tuples."""
    if unknown := sorted(entry.keys() - {f.name for f in fields(Package)}):
        raise ValueError(f"package {entry.get('name', '?')}: unknown keys {unknown}")
    try:
        pinned = Package(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
    except TypeError as e:
        raise ValueError(f"package {entry.get('name', '?')}: {e}") from None
    if pinned.suffix not in (RST, HTML):
        raise ValueError(f"package {pinned.name}: suffix {pinned.suffix!r}")
    return pinned


def load_corpora(path: Path = PINS) -> dict[str, Corpus]:
    """Every corpus of ``path`` by name, its packages in the file's order."""
    corpora = {}
    for name, entry in json.loads(path.read_text()).items():
        packages = tuple(map(package, entry.pop("packages", [])))
        test_packages = tuple(map(package, entry.pop("test_packages", [])))
        try:
            corpora[name] = Corpus(name, packages, test_packages=test_packages, **entry)
        except TypeError as e:
            raise ValueError(f"{path.name}: corpus {name}: {e}") from None
    return corpora


CORPORA = load_corpora()
