"""Table 3: the best points' perplexity at given steps, with their measured memory, time and
throughput."""

from __future__ import annotations

from repro.points import Point, method_rows, model_order, row_label


def table3(best: dict[tuple[str, str], Point], steps: list[int], latex: bool) -> str:
    header = ["Model", "Method", "Memory", *[f"{s}" for s in steps], "Time (h)", "Tokens/s"]
    if latex:
        lines = ["\\begin{tabular}{ll|c|" + "c" * len(steps) + "|cc}", "\\toprule"]
        lines.append(" & ".join(header) + " \\\\")
        lines.append("\\midrule")
    else:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    order = [m for m in method_rows({m for _, m in best}) if m is not None]
    for model, row in sorted(best, key=lambda k: (model_order(k[0]), order.index(k[1]))):
        point = best[(model, row)]
        at = [point.ppl_at(s) for s in steps]
        cells = [
            model,
            row_label(row),
            f"{point.mean('peak_memory_bytes') / 2**30:.2f}G",
            *["-" if v is None else f"{v:.2f}" for v in at],
            f"{point.mean('wall_time_s') / 3600:.3f}",
            f"{point.mean('tokens_per_s') / 1e3:.1f}K",
        ]
        lines.append(" & ".join(cells) + " \\\\" if latex else "| " + " | ".join(cells) + " |")
    if latex:
        lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"
