"""Build a local C4-format corpus from Debian's documentation packages (no Hugging Face hub needed).

The command line of ``repro.cpu_study.make_corpus``, which holds the logic.

    python scripts/make_corpus.py --out data/docs-c4                      # pinned .debs + dpkg -x
    python scripts/make_corpus.py --out data/x --source-root DIR          # packages unpacked in DIR
    python scripts/make_corpus.py --corpus long --out data/docs-long --count-tokens 4096  # Q3's
"""

import sys

from repro.cpu_study.make_corpus import main

if __name__ == "__main__":
    sys.exit(main())
