"""What a checkpoint's self-proof and its background write cost: the manifest's checksum per GiB
(beside SHA-256 and BLAKE2b) and the training stall per save, synchronous against
``trainer.async_save``, at ``llama_60m``'s state on this machine.

The command line of ``tools.bench_checkpoint``, which holds the logic (``--help`` for its
options).

    python scripts/bench_checkpoint.py
    python scripts/bench_checkpoint.py --parts checksum --checksum-mib 1024
"""

from tools.bench_checkpoint import main

if __name__ == "__main__":
    main()
