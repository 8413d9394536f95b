"""`make demo`: pre-train a small LLaMA with FOAM-2 on the embedded offline corpus, on CPU.

The command line of ``repro.demo``, which holds the logic.
"""

import sys

from repro.demo import main

if __name__ == "__main__":
    sys.exit(main())
