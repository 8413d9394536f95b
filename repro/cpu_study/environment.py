"""The CPU study's guards: a run is made only with the study's corpus, its tokenizer and the
packages its earlier runs were made with, so that runs from different sessions and machines compare
(results/repro/PROTOCOL.md, "Data")."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from repro.cpu_study.make_corpus import corpus_digest, tokenizer_sha256
from repro.runs import REPO

VOCAB = 4096  # the study's SentencePiece vocabulary (TOKENIZER_SHA256 is the model trained at it)
ENVIRONMENT = REPO / "results" / "repro" / "environment.txt"  # the packages the runs were made with
# The data every run of the study trains on (PROTOCOL.md, "Data"): scripts/make_corpus.py's
# digest of the mirror built from its pinned packages, and the sha256 of the SentencePiece model
# trained on it (which also depends on the sentencepiece that ENVIRONMENT pins).
CORPUS_DIGEST = "cf2f339b1254cf0a35568f43f80a2924f1b5f291b57ab6ffe52b0882965fd71d"
TOKENIZER_SHA256 = "c336758497107e07531c7ab0695f422766cf26d17a838628bfbc881a5f9c0e75"


def data_mismatch(data: Path) -> str | None:
    """Why ``data`` is not the study's corpus (or its tokenizer not the study's), or None."""
    digest = corpus_digest(data)
    if digest != CORPUS_DIGEST:
        return (
            f"--data {data}: corpus digest {digest[:16]}... is not the study's "
            f"{CORPUS_DIGEST[:16]}...; build it with scripts/make_corpus.py (pinned packages)"
        )
    tokenizer = tokenizer_sha256(data, VOCAB)
    if tokenizer != TOKENIZER_SHA256:
        return (
            f"--data {data}: its SentencePiece model (sha256 {tokenizer[:16]}...) is not the "
            f"study's ({TOKENIZER_SHA256[:16]}...): sentencepiece or the tokenizer code differs"
        )
    return None


def environment_mismatch(pins: Path = ENVIRONMENT) -> str | None:
    """Which installed packages are not at the versions the study's runs were made with, or None.

    The model (transformers), the kernels (torch) and the reference optimizers all shape a run's
    numbers; runs made in later sessions on fresh machines must use the same ones.
    """
    wrong = []
    for line in pins.read_text().splitlines():
        name, _, pinned = line.strip().partition("==")
        if not pinned:
            continue
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "missing"
        if installed != pinned:
            wrong.append(f"{name} {installed} (study: {pinned})")
    if not wrong:
        return None
    return (
        f"packages differ from the study's ({', '.join(wrong)}); "
        f"install them with: make install PIP_CONSTRAINTS={pins}"
    )
