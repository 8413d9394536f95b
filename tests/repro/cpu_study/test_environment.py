"""The CPU study's guards (repro/cpu_study/environment.py): another corpus, tokenizer or package
set is refused before any run."""

import gzip
import json

import pytest

from repro.cpu_study import cli, environment


def test_a_corpus_that_is_not_the_studys_is_refused(tmp_path, monkeypatch, capsys):
    data = tmp_path / "mirror"
    (data / "en").mkdir(parents=True)
    with gzip.open(data / "en" / "c4-train.00000-of-00001.json.gz", "wt") as f:
        f.write(json.dumps({"text": "Other text.", "timestamp": "", "url": "u"}) + "\n")
    assert "corpus digest" in environment.data_mismatch(data)
    monkeypatch.setattr(cli, "environment_mismatch", lambda: None)
    with pytest.raises(SystemExit):
        cli.main(["--data", str(data), "--plan"])
    assert "is not the study's" in capsys.readouterr().err
    # the right text, but a tokenizer trained differently (another sentencepiece)
    monkeypatch.setattr(environment, "corpus_digest", lambda _: environment.CORPUS_DIGEST)
    monkeypatch.setattr(environment, "tokenizer_sha256", lambda *_: "0" * 64)
    assert "sentencepiece" in environment.data_mismatch(data)
    monkeypatch.setattr(environment, "tokenizer_sha256", lambda *_: environment.TOKENIZER_SHA256)
    assert environment.data_mismatch(data) is None


def test_packages_other_than_the_studys_are_refused(tmp_path):
    pins = tmp_path / "environment.txt"
    pins.write_text(f"pytest=={pytest.__version__}\nno-such-package==1.0\n# a comment\n")
    message = environment.environment_mismatch(pins)
    assert message is not None and "no-such-package missing (study: 1.0)" in message
    assert "pytest" not in message.split(";")[0]  # the installed pytest is the pinned one
    pins.write_text(f"pytest=={pytest.__version__}\n")
    assert environment.environment_mismatch(pins) is None
