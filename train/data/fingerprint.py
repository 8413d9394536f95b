"""What data a run trains on, as a fingerprint kept in each checkpoint's ``meta.json``: a resume
onto other data (a file replaced, added or grown; another hub dataset) would continue a data
position that no longer means what it did, so it is refused in one line unless the user says
so (``trainer.allow_data_change``).

What identifies each source is its entry in ``SOURCES`` (``train/data/corpus.py``): local files
by name, size and a CRC-32 of their first and last 64 KiB (cheap for a thousand-file C4 mirror on
shared storage, and any replaced, regenerated or appended file changes it), the hub stream by its
dataset name and config, the embedded corpus by its text.
"""

from __future__ import annotations

from typing import Any

from train.data.corpus import source_kind
from train.errors import ConfigError
from train.schema import DataConfig


def fingerprint(cfg: DataConfig) -> dict[str, Any]:
    """The data ``cfg`` names, as a JSON-able dict (equal for the same data)."""
    return source_kind(cfg.name).fingerprint(cfg)


def check_unchanged(saved: dict[str, Any] | None, current: dict[str, Any], where: str) -> None:
    """Refuse a resume whose data differs from the checkpoint's (``ConfigError``, one line
    saying what changed); a checkpoint without a fingerprint is not checked."""
    if saved is None or saved == current:
        return
    if saved.get("source") != current.get("source") or "files" not in saved:
        change = f"{_label(saved)} then, {_label(current)} now"
    else:
        before, now = saved["files"], current["files"]
        added, removed = sorted(now.keys() - before.keys()), sorted(before.keys() - now.keys())
        changed = sorted(k for k in now.keys() & before.keys() if now[k] != before[k])
        parts = [
            f"{what} {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")
            for what, names in (("added", added), ("removed", removed), ("changed", changed))
            if names
        ]
        change = ", ".join(parts)
    raise ConfigError(
        f"trainer.resume: the data changed since {where} ({change}); resume onto it anyway "
        "with trainer.allow_data_change=true"
    )


def _label(print_: dict[str, Any]) -> str:
    return str(print_.get("dataset") or print_.get("source"))
