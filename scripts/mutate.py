"""Mutation testing of the modules whose bugs cost users most: inject one plausible bug at a time
and check that the fast tests of that module notice it.

The command line of ``tools.mutate``, which holds the logic.

    python scripts/mutate.py                       # every target below (make mutate)
    python scripts/mutate.py foam/schedule.py      # one module
    python scripts/mutate.py --list                # the mutants, without running anything
    python scripts/mutate.py --only 12 40          # rerun some mutants by their number
"""

import os
import sys

from tools.mutate import main

if __name__ == "__main__":
    try:
        status = main()
    except KeyboardInterrupt:
        status = 130
    except SystemExit as stop:  # SIGTERM, argparse; the temporary copy is already removed
        status = stop.code if isinstance(stop.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # a run stopped by SIGTERM once hung in interpreter shutdown after cleanup
