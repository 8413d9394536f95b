"""Compare runs in one picture: training loss, validation perplexity, learning rate and tokens/s.

The command line of ``tools.plot_runs``, which holds the logic (``--help`` for its options).

    python scripts/plot_runs.py runs/adamw60m runs/foam2_60m --out runs/compare.png
    python scripts/plot_runs.py runs/sweep/*/ --out sweep.png --x tokens
"""

import sys

from tools.plot_runs import main

if __name__ == "__main__":
    sys.exit(main())
