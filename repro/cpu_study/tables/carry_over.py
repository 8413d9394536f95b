"""``carry_over.md``: every lr run at full length at the best points' alpha and gap, so whether
the search's optimum moved at the finals' length can be read."""

from __future__ import annotations

from repro.points import CONTROL, Point, model_order, row_label


def carry_over_table(best: dict[tuple[str, str], Point], points: list[Point]) -> str:
    """The best points' lr neighbours at the final length: did the search's optimum move?"""
    lines = ["| Model | Method | lr | alpha | final PPL (seed 0) |", "|---|---|---:|---:|---:|"]
    for (model, row), point in sorted(best.items(), key=lambda kv: (model_order(kv[0][0]), kv[0])):
        k = point.key
        line = [
            p
            for p in points
            if (p.key.stage, p.key.model, p.key.method, p.key.alpha, p.key.gap)
            == (k.stage, k.model, k.method, k.alpha, k.gap)
        ]
        if len(line) < 2 or (row == CONTROL and point is best.get((model, "adamw"))):
            continue  # a control whose best is AdamW's own point has AdamW's line
        for p in sorted(line, key=lambda p: p.key.lr):
            ppl = p.ppl_by_seed.get(0)
            chosen = " (chosen)" if p is point else ""
            alpha = p.key.alpha_or_none
            lines.append(
                f"| {model} | {row_label(row)} | {p.key.lr:g}{chosen} | "
                f"{'-' if alpha is None else f'{alpha:g}'} | "
                f"{'-' if ppl is None else f'{ppl:.2f}'} |"
            )
    return "\n".join(lines) + "\n"
