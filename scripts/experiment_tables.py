"""The paper's other experiments laid out as the paper does (``repro.make_tables`` calls this).

The command line of ``repro.tables.experiments``, which holds the logic.
"""

import sys

from repro.tables.experiments import main

if __name__ == "__main__":
    sys.exit(main())
