"""Fine-tune a pre-trained model on GLUE or MMLU with Full-Adam, FOAM, GaLore, APOLLO or LoRA (the
paper's fine-tuning tables), on ``transformers.Trainer``.

The command line of ``train.finetune.cli``, which holds the logic (``--help`` for its options).

    python scripts/finetune.py glue --task rte --model roberta-large --method foam --lr 1e-4
"""

import sys

from train.finetune.cli import main

if __name__ == "__main__":
    sys.exit(main())
