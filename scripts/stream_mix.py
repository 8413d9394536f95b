"""What a run's training stream is made of, window by window: each source's share of the words.

The command line of ``repro.cpu_study.stream_mix``, which holds the logic.

    python scripts/stream_mix.py DIR [--seed 0] [--window-words 250000] [--windows 10]
"""

import sys

from repro.cpu_study.stream_mix import main

if __name__ == "__main__":
    sys.exit(main())
