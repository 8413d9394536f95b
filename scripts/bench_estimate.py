"""The step-time estimate against the measured step: the demo's run and llama_2m's (the CPU study's
step), each within 2x of the steady time per step (``train/estimate.py``).

The command line of ``tools.bench_estimate``, which holds the logic (``--help`` for its options).

    python scripts/bench_estimate.py            # both cases, a markdown table
    python scripts/bench_estimate.py --cases demo
"""

import sys

from tools.bench_estimate import main

if __name__ == "__main__":
    sys.exit(main())
