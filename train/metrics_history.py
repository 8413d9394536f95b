"""One history per run in ``metrics.jsonl``: a resume keeps the records up to the step it resumes
from (the trajectory the model actually took), a fresh start keeps the earlier file under a new
name, and a line torn by a node that died mid-write is dropped with a warning, not a crash.

Every rewrite goes through a temporary file and a rename, so a crash while rewriting loses
nothing.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def rotate(path: Path) -> Path | None:
    """Move an earlier run's ``path`` aside to the first free ``<path>.<n>`` (never deleted);
    returns where it went, or None when there was none."""
    if not path.exists():
        return None
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    aside = path.with_name(f"{path.name}.{n}")
    os.replace(path, aside)
    log.warning("a fresh start: the earlier %s is kept as %s", path.name, aside.name)
    return aside


def keep_until(path: Path, step: int) -> None:
    """Rewrite ``path`` to the records of steps ``<= step``; unparseable lines (a torn last
    line) are dropped, with one warning naming them."""
    if not path.exists():
        return
    kept, torn = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn.append(number)
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    if torn:
        log.warning(
            "%s: dropped %d line(s) that do not parse (line %s; a write cut short)",
            path,
            len(torn),
            ", ".join(map(str, torn)),
        )
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
