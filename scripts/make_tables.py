"""Tables 2-3, the ablations and validation curves from the ``summary.json`` files of finished runs.

The command line of ``repro.cpu_study.make_tables`` (the paper's tables, ``repro.make_tables``, with
the CPU study's beside them; ``--v4``: the v4 study's), which holds the logic.

    python scripts/make_tables.py runs/sweep --out results/tables --curves
    python scripts/make_tables.py results/repro/runs --out results/repro/tables --curves
    python scripts/make_tables.py results/repro/v4/runs --v4 results/repro/runs \
        --out results/repro/v4/tables --curves
"""

import sys

from repro.cpu_study.make_tables import main

if __name__ == "__main__":
    sys.exit(main())
