"""The paragraphs of an HTML manual page, as ``repro.cpu_study.make_corpus`` reads
reStructuredText ones.

Most large manuals in Debian ship only their rendered HTML (Django's, PHP's, Java's, Qt's, ...).
A paragraph here is the text between two block boundaries (the start or end of any block-level
element: ``<p>``, ``<div>``, ``<li>``, ``<dd>``, headings, ``<br>``, ...); inline elements
(links, ``<code>``, emphasis) keep their text, as inline roles and literals do in the
reStructuredText cleaner. What that cleaner drops is dropped here too: code (``<pre>``), tables,
and what is not the page's text (scripts, styles, the head, navigation bars, forms, formulas;
``SKIPPED_CLASSES``).
Headings are not paragraphs. The paragraph rules (terminal punctuation, three words, English by
character set) and the corpus-wide dedup are ``make_corpus``'s, applied to what this yields;
boilerplate repeated on every page (a footer's copyright line) is kept once by that dedup.

Only the standard library's parser is used: the study's environment is pinned, and a page that
is not well-formed still gives its paragraphs (an unclosed ``<p>`` ends at the next block).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements whose whole content is not prose: code, tables, machinery and page furniture.
SKIPPED = frozenset(
    (
        "pre",
        "table",
        "script",
        "style",
        "head",
        "nav",
        "header",
        "footer",
        "form",
        "select",
        "textarea",
        "button",
        "svg",
        "math",
        "noscript",
        "template",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
    )
)
# Elements that start or end a paragraph (everything else is inline and keeps its text).
BLOCKS = frozenset(
    (
        "p",
        "div",
        "section",
        "article",
        "main",
        "aside",
        "blockquote",
        "ul",
        "ol",
        "li",
        "dl",
        "dt",
        "dd",
        "br",
        "hr",
        "figure",
        "figcaption",
        "details",
        "summary",
        "address",
        "center",
        "body",
        "html",
        "caption",
        "fieldset",
        "legend",
    )
)
# Classes of page furniture and of tables built from <div>s: Sphinx's sidebars and navigation
# bars, and javadoc's member summaries (each line of which repeats its entry's first sentence).
SKIPPED_CLASSES = frozenset(("sphinxsidebar", "related", "footer", "summary"))
# Elements that have no end tag (nothing to skip inside them).
VOID = frozenset(
    ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr")
)
_SPACE = re.compile(r"\s+")


class _Paragraphs(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._words: list[str] = []
        self._skipping: list[str] = []  # open skipped elements, innermost last

    def _flush(self) -> None:
        text = _SPACE.sub(" ", "".join(self._words)).strip()
        if text:
            self.paragraphs.append(text)
        self._words = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skipping:
            if tag not in VOID:
                self._skipping.append(tag)
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag in SKIPPED or classes & SKIPPED_CLASSES:
            self._flush()
            if tag not in VOID:
                self._skipping.append(tag)
        elif tag in BLOCKS:
            self._flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._skipping and tag in BLOCKS:
            self._flush()  # <br/>: a void element has no content to skip or keep

    def handle_endtag(self, tag: str) -> None:
        if self._skipping:
            if tag in self._skipping:  # closes it and anything left open inside it (<p>, <li>)
                del self._skipping[len(self._skipping) - 1 - self._skipping[::-1].index(tag) :]
            return
        if tag in BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._words.append(data)


def html_paragraphs(source: str) -> list[str]:
    """The text of ``source``'s paragraphs, whitespace normalised, in page order."""
    parser = _Paragraphs()
    parser.feed(source)
    parser.close()
    parser._flush()
    return parser.paragraphs
