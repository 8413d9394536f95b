"""``provenance.md``: the commits and tokenizers the runs came from, and their hours."""

from __future__ import annotations

from collections import Counter

from repro.study_points import Point


def provenance(points: list[Point]) -> str:
    """The commits and tokenizers the runs came from (a ``-dirty`` sha means uncommitted changes),
    and the wall-clock hours they took.

    The tokenizer's name carries a hash of its training text, so runs on different corpora show
    as different rows, and a table that mixes them says so: their perplexities do not compare.
    """
    runs: Counter[tuple[str, str]] = Counter()
    hours: Counter[tuple[str, str]] = Counter()
    for run in (r for p in points for r in p.runs):
        origin = (run.get("git_sha", "unknown"), run.get("tokenizer") or "unrecorded")
        runs[origin] += 1
        hours[origin] += (run.get("wall_time_s") or 0.0) / 3600
    lines = ["| git sha | tokenizer | runs | hours |", "|---|---|---:|---:|"]
    lines += [
        f"| {sha} | {tok} | {runs[sha, tok]} | {hours[sha, tok]:.1f} |" for sha, tok in sorted(runs)
    ]
    lines.append(f"| all | | {sum(runs.values())} | {sum(hours.values()):.1f} |")
    tokenizers = sorted({tok for _, tok in runs})
    if len(tokenizers) > 1:
        lines.append(
            f"\n**Warning**: these runs used {len(tokenizers)} tokenizers "
            f"({', '.join(tokenizers)}); perplexities across them are not comparable."
        )
    return "\n".join(lines) + "\n"
