"""Tables 2-3, the ablations and validation curves from the ``summary.json`` files of finished runs.

The command line of ``repro.make_tables``, which holds the logic.

    python scripts/make_tables.py runs/sweep --out results/tables --curves
    python scripts/make_tables.py results/repro/runs --out results/repro/tables --curves
"""

import sys

from repro.cpu_study.make_tables import main

if __name__ == "__main__":
    sys.exit(main())
