"""Consolidate a checkpoint into one model file: the whole model's weights from the DCP shards of
any world size, ddp or fsdp, as one ``.safetensors`` file (or ``.pt`` for ``torch.load``).

    python scripts/consolidate_checkpoint.py runs/<run>/checkpoints/step_00001000 model.safetensors

The model is rebuilt from the run's resolved ``config.yaml`` (two levels above the checkpoint) and
its weights are read from the shards (``train.export.checkpoint_model``), in one process. For a
transformers checkpoint (``from_pretrained``) use ``scripts/export_hf.py`` on the same directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from train.export.hf import checkpoint_model


def consolidate(checkpoint: Path, out: Path) -> Path:
    """Write the checkpoint's model weights, in the dtype they were trained in, to ``out``."""
    model, _ = checkpoint_model(checkpoint)
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    if out.suffix == ".safetensors":
        # tied embeddings share storage; safetensors stores each tensor once, by its first name
        seen: set[int] = set()
        unique = {}
        for key, value in weights.items():
            if value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                unique[key] = value
        save_file(unique, str(out), metadata={"format": "pt"})
    else:
        torch.save(weights, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a <run_dir>/checkpoints/step_N directory")
    parser.add_argument("out", type=Path, help="the model file: .safetensors or .pt")
    args = parser.parse_args(argv)
    try:
        path = consolidate(args.checkpoint, args.out)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
