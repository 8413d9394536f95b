"""Estimated pre-training memory (BF16 weights + optimizer states), as the FOAM paper's tables.

The estimate is ``repro.memory_estimator``'s (each optimizer's own state accounting on a meta-device
model); the paper's printed figures and errata are ``repro.paper_memory``'s; this module renders them
(the units and conventions are described there).
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
import warnings
from collections.abc import Callable, Sequence

import models
from foam.sharding import ShardingNotSupported
from repro.memory_estimator import (
    GB,
    SPECS,
    appendix_pair,
    estimate,
    sharded_estimate,
    table2_gb,
)
from repro.methods import TABLE2, TABLE3, label
from repro.paper_memory import (
    MODEL_LABELS,
    PAPER_APPENDIX,
    PAPER_MODELS,
    PAPER_TABLE2,
    PAPER_TABLE3,
    TABLE3_MODELS,
    TOLERANCE_GB,
    erratum,
)
from train.cli_errors import check_choices

ALL_MODELS = (
    *PAPER_MODELS,
    *TABLE3_MODELS,
    *("qwen_60m", "qwen_130m", "qwen_350m", "qwen_1b", "qwen_3b", "qwen_7b"),
)
TABLE2_METHODS = [m.name for m in TABLE2]
NOTE_WIDTH = 100


def _table(
    methods: Sequence[str], models: Sequence[str], cell: Callable[[str, str, int], str]
) -> str:
    """A markdown table: one row per method, one ``cell(method, model, column)`` per model."""
    lines = [
        "| Method | " + " | ".join(MODEL_LABELS[m] for m in models) + " |",
        "|---|" + "---:|" * len(models),
    ]
    for method in methods:
        cells = [cell(method, model, i) for i, model in enumerate(models)]
        lines.append(f"| {label(method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table2_markdown(methods: Sequence[str], compare: bool) -> str:
    def cell(method: str, model: str, i: int) -> str:
        ours = f"{table2_gb(estimate(model, method)):.2f}G"
        if compare and method in PAPER_TABLE2:
            mark = " †" if erratum("table2", method, model) else ""
            return f"{ours} ({PAPER_TABLE2[method][i]:.2f}{mark})"
        return ours

    return _table(methods, PAPER_MODELS, cell)


def appendix_markdown(methods: Sequence[str], compare: bool) -> str:
    def cell(method: str, model: str, i: int) -> str:
        w, s = appendix_pair(estimate(model, method))
        ours = f"{w:.2f}G/{s:.2f}G"
        if compare:
            pw, ps = PAPER_APPENDIX[method][i]
            off = erratum("appendix_weights", method, model) or erratum(
                "appendix_states", method, model
            )
            return f"{w:.2f}/{s:.2f} ({pw:.2f}/{ps:.2f}{'†' if off else ''})"  # no units: narrow
        return ours

    shown = [m for m in methods if m in PAPER_APPENDIX or not compare]
    return _table(shown, PAPER_MODELS, cell)


def table3_markdown(compare: bool) -> str:
    def cell(method: str, model: str, i: int) -> str:
        ours = f"{estimate(model, method).optimizer_bytes / GB:.2f}G"
        return f"{ours} ({PAPER_TABLE3[method][i]:.2f})" if compare else ours

    return _table(TABLE3, TABLE3_MODELS, cell)


def all_sizes_markdown(methods: Sequence[str], sizes: Sequence[str]) -> str:
    lines = [
        "| Model | Method | weights GB | optimizer GB | total GB |",
        "|---|---|---:|---:|---:|",
    ]
    for model in sizes:
        for method in methods:
            e = estimate(model, method).as_json()
            lines.append(
                f"| {model} | {method} | {e['weights_gb']:.3f} | {e['optimizer_gb']:.3f} | "
                f"{e['total_gb']:.3f} |"
            )
    return "\n".join(lines)


def fsdp_rows(methods: Sequence[str], sizes: Sequence[str], ranks: int) -> list[dict]:
    """Rank 0's share of each size x method under FSDP2 over ``ranks`` (decimal GB), or the
    one-line reason FSDP2 refuses it."""
    rows = []
    for model in sizes:
        for method in methods:
            try:
                row = sharded_estimate(model, method, ranks).as_json()
            except ShardingNotSupported as err:
                row = {"model": model, "method": method, "refused": str(err)}
            rows.append({**row, "fsdp_ranks": ranks})
    return rows


def fsdp_markdown(methods: Sequence[str], sizes: Sequence[str], ranks: int) -> str:
    lines = [
        f"### Per rank under FSDP2 over {ranks} ranks (rank 0, BF16, decimal GB)",
        "",
        "| Model | Method | weights GB | optimizer GB | total GB |",
        "|---|---|---:|---:|---:|",
    ]
    for row in fsdp_rows(methods, sizes, ranks):
        if "refused" in row:
            lines.append(f"| {row['model']} | {row['method']} | {row['refused']} | | |")
            continue
        lines.append(
            f"| {row['model']} | {row['method']} | {row['weights_gb']:.3f} | "
            f"{row['optimizer_gb']:.3f} | {row['total_gb']:.3f} |"
        )
    return "\n".join(lines)


def deviations() -> list[tuple[str, str, str, float, float, str | None]]:
    """Every paper entry as (table, method, model, paper, ours, erratum)."""
    rows = []
    for method, values in PAPER_TABLE2.items():
        for model, paper in zip(PAPER_MODELS, values, strict=True):
            ours = table2_gb(estimate(model, method))
            rows.append(("table2", method, model, paper, ours, erratum("table2", method, model)))
    for method, pairs in PAPER_APPENDIX.items():
        for model, (pw, ps) in zip(PAPER_MODELS, pairs, strict=True):
            w, s = appendix_pair(estimate(model, method))
            for table, paper, ours in (("appendix_weights", pw, w), ("appendix_states", ps, s)):
                rows.append((table, method, model, paper, ours, erratum(table, method, model)))
    return rows


def errata_markdown() -> str:
    """The entries off by more than the tolerance, each reason once below the table (rows stay
    narrow enough for a terminal: several entries share a reason)."""
    lines = [
        "| table | method | model | paper | ours | Δ | reason |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    reasons: dict[str, int] = {}
    for table, method, model, paper, ours, why in deviations():
        if why is not None or abs(ours - paper) > TOLERANCE_GB:
            note = f"[{reasons.setdefault(why, len(reasons) + 1)}]" if why else "**UNEXPLAINED**"
            lines.append(
                f"| {table} | {method} | {model} | {paper:.2f} | {ours:.3f} | {ours - paper:+.3f} "
                f"| {note} |"
            )
    lines.append("")
    for why, number in reasons.items():
        lines.append(textwrap.fill(f"[{number}] {why}", width=NOTE_WIDTH, subsequent_indent="    "))
    return "\n".join(lines)


def markdown(methods: Sequence[str], compare: bool) -> str:
    parts = [
        "### Table 2: estimated memory, weights + optimizer states (BF16, decimal GB)",
        "",
        table2_markdown(methods, compare),
        "",
        "### Appendix estimate table: weights (GiB) / Table 2 total minus weights (paper convention)",
        "",
        appendix_markdown(methods, compare),
        "",
        "### Table 3: optimizer states only (BF16; 8-bit Adam at 1 byte per element), decimal GB",
        "",
        table3_markdown(compare),
    ]
    if compare:
        parts[0:0] = ["Cells: ours (paper); † marks a paper entry listed as an erratum below.", ""]
        parts += ["", "### Paper entries not reproduced within 0.02 GB", "", errata_markdown()]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list (decimal GB)")
    parser.add_argument("--compare", action="store_true", help="add the paper's values, errata")
    parser.add_argument("--all-sizes", action="store_true", help="markdown for 3B, 7B and Qwen too")
    parser.add_argument(
        "--models",
        nargs="+",
        default=None,
        help=f"the models of --json and of the every-size table (implies --all-sizes); "
        f"default: {ALL_MODELS}",
    )
    parser.add_argument("--methods", nargs="+", default=TABLE2_METHODS, help="default: Table 2's")
    parser.add_argument(
        "--fsdp-ranks",
        type=int,
        default=None,
        metavar="W",
        help="instead: one rank's share under trainer.parallelism=fsdp over W ranks "
        f"(default models: {PAPER_MODELS})",
    )
    args = parser.parse_args(argv)
    # 8-bit Adam is sized on the meta device: whatever bitsandbytes says about its GPU libraries
    # when it loads is beside the point here, and would open the report.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="bitsandbytes")
    # unknown names fail here, before any output
    check_choices(parser, "optim", args.methods, sorted(SPECS))
    check_choices(parser, "model", args.models or (), models.available_models())
    if args.fsdp_ranks is not None:
        if args.fsdp_ranks < 2:
            parser.error(f"--fsdp-ranks must be at least 2, got {args.fsdp_ranks}")
        sizes = args.models or PAPER_MODELS
        if args.json:
            print(json.dumps(fsdp_rows(args.methods, sizes, args.fsdp_ranks), indent=1))
        else:
            print(fsdp_markdown(args.methods, sizes, args.fsdp_ranks))
        return 0
    if args.json:
        rows = [
            estimate(model, method).as_json()
            for model in args.models or ALL_MODELS
            for method in args.methods
        ]
        print(json.dumps(rows, indent=1))
        return 0
    print(markdown(args.methods, args.compare))
    if args.all_sizes or args.models:
        print("\n### Every size (decimal GB)\n")
        print(all_sizes_markdown(args.methods, args.models or ALL_MODELS))
    return 0
