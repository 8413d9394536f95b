"""A checkpoint's proof of itself: ``manifest.json``, every file of the directory with its size
and CRC-32, written before the directory is published (``train/checkpoint.py``) and checked
before it is loaded.

Why CRC-32 (``zlib.crc32``): what it must catch is damage (a shard cut short by a full disk or a
dying node, a flipped bit on a bad drive or link), not tampering, and it is the fastest checksum
of the standard library: ``scripts/bench_checkpoint.py`` measures its cost per GiB beside
SHA-256 and BLAKE2b. A cut-short file is caught by its size before anything is read.

Each rank checksums the files it wrote (``__<rank>_*.distcp``; rank 0 also DCP's ``.metadata``
and ``meta.json``), and at load each rank verifies its share of the files, so neither costs one
rank the reading of the whole checkpoint.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"
ALGORITHM = "crc32"
_CHUNK = 8 << 20


class CheckpointDamaged(Exception):
    """A checkpoint whose files do not match its manifest. ``reason`` is one word (the suffix of
    the name it is set aside under: ``step_N.bad-<reason>``); the message says which file."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def crc32_of(path: Path) -> int:
    """The file's CRC-32, read in chunks (a shard may be tens of GB)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def describe_files(directory: Path, names: list[str]) -> dict[str, dict[str, int]]:
    """``{name: {"size", "crc32"}}`` of ``names`` in ``directory``."""
    return {
        name: {"size": (directory / name).stat().st_size, ALGORITHM: crc32_of(directory / name)}
        for name in names
    }


def owned_files(directory: Path, rank: int) -> list[str]:
    """The files of a freshly written checkpoint that ``rank`` wrote: DCP names a rank's shards
    ``__<rank>_<i>.distcp``; the rest (DCP's ``.metadata``, ``meta.json``) is rank 0's."""
    prefix = f"__{rank}_"
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    if rank == 0:
        return [n for n in names if n.startswith(prefix) or not n.startswith("__")]
    return [n for n in names if n.startswith(prefix)]


def write_manifest(directory: Path, files: dict[str, dict[str, int]]) -> None:
    """Write and flush ``manifest.json`` (before the directory's publishing rename)."""
    text = json.dumps({"algorithm": ALGORITHM, "files": dict(sorted(files.items()))}, indent=1)
    with open(directory / MANIFEST_FILE, "wb") as f:
        f.write(text.encode())
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """The manifest's files, or :class:`CheckpointDamaged` (``no-manifest`` / ``manifest``)."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointDamaged("no-manifest", f"{path} is missing")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest["algorithm"] != ALGORITHM or not isinstance(files, dict):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise CheckpointDamaged("manifest", f"{path} does not parse") from None
    return files


def verify_files(directory: Path, files: dict[str, dict[str, Any]], names: list[str]) -> None:
    """Check ``names`` (a share of the manifest's files) against their sizes, then checksums;
    raise :class:`CheckpointDamaged` naming the first file that differs."""
    for name in names:
        path, expected = directory / name, files[name]
        if not path.is_file():
            raise CheckpointDamaged("missing", f"{path} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointDamaged(
                "size", f"{path} has {size} bytes, the manifest says {expected['size']}"
            )
    for name in names:
        if crc32_of(directory / name) != files[name][ALGORITHM]:
            raise CheckpointDamaged(
                "checksum", f"{directory / name} does not match its {ALGORITHM}"
            )
