"""Metric sinks: ``metrics.jsonl`` in the run directory (always) and wandb (``logger=wandb``).

Only the main rank logs. wandb runs offline unless the user is logged in, and a resumed run
continues the same wandb run: its id is kept in the checkpoint and in ``<run_dir>/wandb_id``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from train import metrics_history
from train.schema import LoggerConfig

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class JsonlWriter:
    """Appends one JSON object per logged step; a resume first drops lines past its step (and a
    torn last line), so the file reads as one uninterrupted run; a fresh start keeps an earlier
    file under another name (``train/metrics_history.py``)."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if resume_step is None:
            metrics_history.rotate(self.path)
        else:
            metrics_history.keep_until(self.path, resume_step)
        self._file = open(self.path, "a")  # noqa: SIM115 (kept open for the run)

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbLogger:
    """A thin wandb wrapper; ``mode: auto`` is online when logged in, else offline."""

    def __init__(
        self, cfg: LoggerConfig, run_dir: Path, run_id: str, config: dict[str, Any]
    ) -> None:
        import wandb

        mode = cfg.mode
        if mode == "auto":
            mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")
        self._wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.run_name or Path(run_dir).name,
            tags=list(cfg.tags or []),
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=mode,
            config=config,
        )
        log.info("wandb run %s (%s mode)", run_id, mode)

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if v is not None}, step=record["step"])

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in values.items() if not isinstance(v, list)})

    def close(self, preempted: bool = False) -> None:
        """Finish the run; ``preempted`` tells wandb it stopped early and will be resumed."""
        if preempted:
            self.run.mark_preempting()
        self.run.finish()


def new_run_id(run_dir: Path) -> str:
    """The run's logger id, created once and kept in the run directory."""
    path = Path(run_dir) / "wandb_id"
    if path.exists():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(4)
    path.write_text(run_id)
    return run_id


class MetricSink:
    """Where a run's records go: ``metrics.jsonl`` and, with ``logger=wandb``, wandb. Only the main
    rank writes; on the others every call is a no-op. The logger's run id is kept in ``state``."""

    def __init__(
        self,
        cfg: LoggerConfig,
        run_dir: Path,
        state: Any,
        *,
        is_main: bool,
        resumed: bool,
        config: dict[str, Any],
    ) -> None:
        self._jsonl: JsonlWriter | None = None
        self._wandb: WandbLogger | None = None
        if not is_main:
            return
        state.run_id = state.run_id or new_run_id(run_dir)
        self._jsonl = JsonlWriter(run_dir, resume_step=state.step if resumed else None)
        if cfg.name == "wandb":
            self._wandb = WandbLogger(cfg, run_dir, state.run_id, config)

    def log(self, record: dict[str, Any]) -> None:
        for sink in (self._jsonl, self._wandb):
            if sink:
                sink.log(record)

    def close(self, summary: dict[str, Any] | None = None, *, preempted: bool = False) -> None:
        """Finish: with the run's summary, or ``preempted`` (stopped early, to be resumed)."""
        if self._wandb:
            if summary is not None:
                self._wandb.summary(summary)
            self._wandb.close(preempted=preempted)
        if self._jsonl:
            self._jsonl.close()
