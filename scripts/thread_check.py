"""Repeat a run's command at several intra-op thread counts and compare its numbers bit for bit.

The command line of ``tools.thread_check``, which holds the logic (``--help`` for its options).

    python scripts/thread_check.py --like runs/foo               # 120 steps at 1 and 2 threads
    python scripts/thread_check.py --like runs/foo --threads 1 2 4 --steps 50
"""

import sys

from tools.thread_check import main

if __name__ == "__main__":
    sys.exit(main())
