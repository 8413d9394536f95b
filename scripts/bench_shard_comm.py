"""What a sharded (FSDP2) optimizer step costs in communication and time, for every registered
method, against the gradient reduce-scatter FSDP2 runs every step anyway.

The command line of ``tools.bench_shard_comm``, which holds the logic (``--help`` for options).

    python scripts/bench_shard_comm.py                               # every method, W = 2 and 4
    python scripts/bench_shard_comm.py --methods muon galore --worlds 2 4 --layers 2
"""

from tools.bench_shard_comm import main

if __name__ == "__main__":
    main()
