"""``provenance.md``: the commits and tokenizers the runs came from, and their hours (the CPU
study adds what is known of each run's machine, ``repro/cpu_study/tables/machines.py``)."""

from __future__ import annotations

from collections import Counter, defaultdict

from repro.points import Point


def provenance(points: list[Point]) -> str:
    """The commits and tokenizers the runs came from (a ``-dirty`` sha means uncommitted changes),
    and the wall-clock hours they took.

    The tokenizer's name carries a hash of its training text, so runs on different corpora show
    as different rows. Runs of one length compare with each other, so a length trained with more
    than one tokenizer is warned about: their perplexities do not compare. Lengths with a
    tokenizer each (v4's Q3 trains on its own corpus) are said to be so, without a warning.
    """
    runs: Counter[tuple[str, str]] = Counter()
    hours: Counter[tuple[str, str]] = Counter()
    tokenizers_by_steps: dict[int | None, set[str]] = defaultdict(set)
    for run in (r for p in points for r in p.runs):
        origin = (run.get("git_sha", "unknown"), run.get("tokenizer") or "unrecorded")
        runs[origin] += 1
        hours[origin] += (run.get("wall_time_s") or 0.0) / 3600
        tokenizers_by_steps[run.get("steps")].add(origin[1])
    lines = ["| git sha | tokenizer | runs | hours |", "|---|---|---:|---:|"]
    lines += [
        f"| {sha} | {tok} | {runs[sha, tok]} | {hours[sha, tok]:.1f} |" for sha, tok in sorted(runs)
    ]
    lines.append(f"| all | | {sum(runs.values())} | {sum(hours.values()):.1f} |")
    lengths = sorted(tokenizers_by_steps.items(), key=lambda item: (item[0] is None, item[0] or 0))
    for steps, tokenizers in lengths:
        if len(tokenizers) > 1:
            lines.append(
                f"\n**Warning**: the runs of {steps_text(steps)} used {len(tokenizers)} tokenizers "
                f"({', '.join(sorted(tokenizers))}); perplexities across them are not comparable."
            )
    if len({tok for _, tok in runs}) > 1 and all(len(t) == 1 for t in tokenizers_by_steps.values()):
        each = "; ".join(f"{steps_text(steps)}: {next(iter(t))}" for steps, t in lengths)
        lines.append(
            f"\nEach run length has its own tokenizer ({each}): perplexities compare within a "
            "length, not across."
        )
    return "\n".join(lines) + "\n"


def steps_text(steps: int | None) -> str:
    return "unrecorded length" if steps is None else f"{steps:,} steps"
