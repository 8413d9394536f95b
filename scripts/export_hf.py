"""Export a training checkpoint as a transformers checkpoint (config.json, safetensors, tokenizer).

The command line of ``train.export.cli``, which holds the logic (``--help`` for its options).

    python scripts/export_hf.py runs/my_run/checkpoints/step_00010000 exported/ --dtype bf16
"""

import sys

from train.export.cli import main

if __name__ == "__main__":
    sys.exit(main())
