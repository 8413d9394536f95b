"""Consolidate a checkpoint into one model file: the whole model's weights from the DCP shards of
any world size, ddp or fsdp, as one ``.safetensors`` file (or ``.pt`` for ``torch.load``).

The command line of ``train.export.consolidate``, which holds the logic (``--help`` for its options).

    python scripts/consolidate_checkpoint.py runs/<run>/checkpoints/step_00001000 model.safetensors
"""

import sys

from train.export.consolidate import main

if __name__ == "__main__":
    sys.exit(main())
