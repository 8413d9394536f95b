"""Export a training checkpoint as a transformers checkpoint (config.json, safetensors, tokenizer).

    python scripts/export_hf.py runs/my_run/checkpoints/step_00010000 exported/ --dtype bf16

The run's own final model is already exported to ``<run_dir>/hf/``; this is for the others.
The work is done by ``train/export/hf.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from train.export.hf import EXPORT_DTYPES, export_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a <run_dir>/checkpoints/step_N directory")
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument(
        "--dtype", choices=sorted(EXPORT_DTYPES), default=None, help="default: as trained"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        export_checkpoint(args.checkpoint, args.out, args.dtype)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
