"""repro/cpu_study/corpora.json, the corpora's pins as data, read as PROTOCOL.md describes them."""

import dataclasses
import json

import pytest

from repro.cpu_study import corpora


def test_the_pins_read_as_the_protocol_describes_them():
    study, long = corpora.CORPORA["study"], corpora.CORPORA["long"]
    assert [p.name for p in study.packages] == ["linux-doc-6.1", "python3.11-doc"]
    assert (study.validation_percent, study.test_percent) == (5, 0)
    assert (long.validation_percent, long.test_percent) == (1, 1)
    # PROTOCOL.md, v4 "Q3": 69 packages, neither postgresql-doc-* nor perl-doc (held back)
    assert len(long.packages) == len({p.name for p in long.packages}) == 69
    assert not [p.name for p in long.packages if p.name.startswith(("postgresql-doc", "perl-doc"))]
    # its first two are the study's test-split pins, the kernel read as rendered pages
    kernel, python = long.packages[:2]
    assert python == study.test_packages[1]
    assert kernel == dataclasses.replace(
        study.test_packages[0], sources="usr/share/doc/linux-doc-6.12/html", suffix=corpora.HTML
    )
    every = [*study.packages, *study.test_packages, *long.packages]
    assert all(len(p.sha256) == 64 and int(p.sha256, 16) >= 0 for p in every)
    assert all(isinstance(p.pools, tuple) and p.pools and isinstance(p.skip, tuple) for p in every)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sha": "0"}, "package doc: unknown keys ['sha']"),
        ({"suffix": ".txt"}, "package doc: suffix '.txt'"),
    ],
)
def test_a_malformed_pin_is_refused_with_its_package_named(tmp_path, change, message):
    entry = {
        "name": "doc",
        "version": "1.0-1",
        "sha256": "0" * 64,
        "pools": ["http://example.org/"],
        "sources": "usr/share/doc",
        "url_root": "https://example.org/",
        "suffix": corpora.RST,
    }
    pins = tmp_path / "corpora.json"
    pins.write_text(json.dumps({"c": {"validation_percent": 5, "packages": [entry]}}))
    assert corpora.load_corpora(pins)["c"].packages[0].pools == ("http://example.org/",)
    pins.write_text(json.dumps({"c": {"validation_percent": 5, "packages": [entry | change]}}))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        corpora.load_corpora(pins)
