"""What is known of each of the study's runs' machine and threads: its summary's record and the
study's notes beside the runs (v4's ``provenance.md`` ends with it)."""

from __future__ import annotations

import json
from pathlib import Path

from train.summary import finished_records

MACHINES_FILE = "machines.json"
"""Beside a study's runs: what is known of each run's machine beyond its summary (the v4 study's
runs predate the summaries' ``environment``), each entry with its source."""


def recorded(summary: dict) -> str:
    """What a summary records of its machine (``train/summary.py``, ``environment``)."""
    env = summary.get("environment")
    if not env:
        return "nothing"
    return (
        f"torch {env.get('torch')}; {env.get('cpu')} ({env.get('cpu_capability')}); "
        f"{env.get('threads')} threads (the segment that finished it)"
    )


def said(run: str, rules: list[dict]) -> str:
    """The first of ``rules`` (``runs``: a run or a prefix of runs) that covers ``run``."""
    rule = next((r for r in rules if run == r["runs"] or run.startswith(r["runs"])), None)
    return "-" if rule is None else f"{rule['says']} [{rule['source']}]"


def machines(root: Path) -> str:
    """Run by run: what its summary records of its machine and threads, and what the study's
    notes say (``MACHINES_FILE`` under ``root``, absent: nothing but the summaries), marked so.
    A run is placed on a machine by the order its summary was committed in: the notes name the
    first run each machine finished."""
    record_file = root / MACHINES_FILE
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    committed = {run: (sha, date) for run, sha, date in record.get("finished", [])}
    order = {run: i for i, run in enumerate(committed)}
    starts = [order[m["first_run"]] for m in record.get("machines", [])]
    summaries = {
        path.parent.relative_to(root).as_posix(): json.loads(path.read_text())
        for path in finished_records(root)
        if path.name == "summary.json"
    }
    runs = sorted(summaries, key=lambda r: (order.get(r, len(order)), r))
    torch = record.get("torch")
    lines = [
        "## Machine and threads, run by run",
        "",
        "What each run's summary records of its machine, and (columns 'per the notes') what "
        "the study's notes and commit messages say of it, transcribed with their sources in "
        f"`runs/{MACHINES_FILE}`. Summaries that record their machine (`environment`): "
        f"{sum(recorded(r) != 'nothing' for r in summaries.values())} of {len(summaries)}; none "
        "records the number of cores.",
    ]
    if torch:
        lines.append(f"torch, per the notes: {torch['says']} ({torch['source']}).")
    if starts:
        lines += ["", "Machines, per the notes (the first run each finished, in commit order):"]
        ends = [*starts[1:], len(order)]
        for i, (m, first, end) in enumerate(zip(record["machines"], starts, ends, strict=True)):
            runs_there = f"{end - first} run{'s' * (end - first != 1)}"
            lines.append(f"* machine {i + 1}: {m['note']}; {runs_there}; {m['says']}.")
    lines += [
        "",
        "| run | committed | its summary records | machine, per the notes | threads, per the notes |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        when = " ".join(committed.get(run, ("-",)))
        where = sum(order[run] >= s for s in starts) if run in order and starts else 0
        lines.append(
            f"| {run} | {when} | {recorded(summaries[run])} | "
            f"{f'machine {where}' if where else '-'} | {said(run, record.get('threads', []))} |"
        )
    return "\n".join(lines) + "\n"
