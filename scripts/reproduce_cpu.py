"""The command line of the CPU study (results/repro/PROTOCOL.md): v3's driver
(``repro.cpu_study.study``) by default, v4's (``repro.cpu_study.v4``) with ``--v4``.

    python scripts/reproduce_cpu.py --data DIR --root runs/repro           # everything, resumable
    python scripts/reproduce_cpu.py --data DIR --root runs/repro --plan    # what is done / to do
    python scripts/reproduce_cpu.py ... --collect results/repro/runs       # copy finished summaries
    python scripts/reproduce_cpu.py --v4 --data DIR [--long-data DIR2]   # v4 (PROTOCOL.md)
"""

import sys

from repro.cpu_study.cli import main

if __name__ == "__main__":
    sys.exit(main())
