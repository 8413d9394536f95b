"""Sweep lr (and alpha) over methods: one torchrun per grid point, locally or on SLURM.

The command line of ``repro.sweep``, which holds the logic.

    python scripts/sweep.py --model llama_60m --dry-run                  # the paper's full grid
    python scripts/sweep.py --model llama_tiny --methods adamw foam2 --lrs 1e-3 --seeds 0 \\
        --root runs/demo -- trainer=cpu_debug trainer.max_steps=20
    python scripts/sweep.py --model llama_350m --nproc 4 --launcher slurm --slurm-partition gpu
"""

import sys

from repro.sweep import main

if __name__ == "__main__":
    sys.exit(main())
