"""The scaled-down CPU reproduction of Table 2 and the FOAM ablations (results/repro/PROTOCOL.md).

The command line of ``repro.reproduce_cpu``, which holds the logic.

    python scripts/reproduce_cpu.py --data DIR --root runs/repro           # everything, resumable
    python scripts/reproduce_cpu.py --data DIR --root runs/repro --plan    # what is done / to do
    python scripts/reproduce_cpu.py ... --collect results/repro/runs       # copy finished summaries
"""

import sys

from repro.reproduce_cpu import main

if __name__ == "__main__":
    sys.exit(main())
