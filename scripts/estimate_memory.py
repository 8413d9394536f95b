"""Estimated pre-training memory (BF16 weights + optimizer states), as the FOAM paper's tables.

The command line of ``repro.tables.memory``, which holds the logic.

    python scripts/estimate_memory.py                 # the paper's tables, as markdown
    python scripts/estimate_memory.py --compare       # + the paper's numbers, deltas and errata
    python scripts/estimate_memory.py --json          # every size x method, decimal GB
    python scripts/estimate_memory.py --fsdp-ranks 8  # one rank's share under FSDP2 over 8 ranks
"""

import sys

from repro.tables.memory import main

if __name__ == "__main__":
    sys.exit(main())
