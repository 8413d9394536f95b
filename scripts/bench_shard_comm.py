"""Sharded (FSDP2) optimizer steps: collectives, bytes and time per step of every method, against
FSDP2's gradient reduce-scatter and the unsharded step, measured in the same run.

The command line of ``tools.bench_shard_comm``, which holds the logic (``--help`` for options).

    python scripts/bench_shard_comm.py                               # every method, W = 2 and 4
    python scripts/bench_shard_comm.py --methods muon galore --worlds 2 4 --layers 2
"""

from tools.bench_shard_comm import main

if __name__ == "__main__":
    main()
