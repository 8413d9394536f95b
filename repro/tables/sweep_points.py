"""``sweep.md``: every point of the study, so the choice of the best ones can be checked."""

from __future__ import annotations

import math

from repro.points import Point, fmt_ppl, model_order


def sweep_table(points: list[Point]) -> str:
    """Every point, so the choice of the best one can be checked."""
    lines = [
        "| Stage | Model | Method | lr | alpha | gap | projections | steps | final PPL |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(points, key=lambda p: (p.key.stage, model_order(p.key.model), p.key)):
        k = p.key
        alpha = k.alpha_or_none
        projections = {r.get("projections") for r in p.runs} - {None}
        steps = {r["steps"] for r in p.runs}
        ppl = "diverged" if math.isinf(p.mean_ppl) else fmt_ppl(p, latex=False)
        lines.append(
            f"| {k.stage or '-'} | {k.model} | {k.method} | {k.lr:g} | "
            f"{'-' if alpha is None else f'{alpha:g}'} | {k.gap or '-'} | "
            f"{'/'.join(map(str, sorted(projections))) or '-'} | "
            f"{'/'.join(map(str, sorted(steps))) or '-'} | {ppl} |"
        )
    return "\n".join(lines) + "\n"
