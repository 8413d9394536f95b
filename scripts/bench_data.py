"""Throughput of the data pipeline alone (read, shuffle, split, tokenize, batch), in tokens/s.

The command line of ``tools.bench_data``, which holds the logic (``--help`` for its options).

    python scripts/bench_data.py                       # both sources, default settings
    python scripts/bench_data.py --tokenizer t5-base --num-workers 4 --pack
"""

from tools.bench_data import main

if __name__ == "__main__":
    main()
